"""`vaswani-export`: export a trained `vaswani` folder to an inference engine: CTranslate2 or ONNX.

The export itself is `vaswani.interop.export.export`; `vaswani-translate --engine ctranslate2|onnx` decodes the result.
"""

from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from ..common.flag_choices import CTRANSLATE2_QUANTIZATIONS, ENGINES
from .cli import command, parse_args, setup_logging

DESCRIPTION = __doc__.split("\n\n")[0].replace("`vaswani-export`: e", "E", 1)

EPILOG = """\
examples:
  vaswani-export --model_name_or_path runs/de-en/averaged --engine ctranslate2 --quantization int8 \\
      --output_dir runs/de-en/ct2-int8
  vaswani-export --model_name_or_path runs/de-en/averaged --engine onnx --output_dir runs/de-en/onnx
  vaswani-translate --engine ctranslate2 --model_name_or_path runs/de-en/ct2-int8 --interactive
"""

RENAMED = {
    "model": "model_name_or_path",
    "output": "output_dir",
    "tokenizer": "tokenizer_name",
    "force": "overwrite_output_dir",
}


@dataclass
class ExportArguments:
    _argument_group_name = "export"

    model_name_or_path: str = HfArg(help="The vaswani model folder (a checkpoint or an averaged model).")
    output_dir: str = HfArg(help="The folder to write the exported model to.")
    engine: str = HfArg(help="The inference engine to export for.", metadata={"choices": list(ENGINES)})
    quantization: str | None = HfArg(
        default=None,
        help="ctranslate2: the weights' type (default float32).",
        metadata={"choices": list(CTRANSLATE2_QUANTIZATIONS)},
    )
    tokenizer_name: str | None = HfArg(
        default=None, help="Tokenizer folder, if not the model folder (joint or source/ + target/)."
    )
    overwrite_output_dir: bool = HfArg(
        default=False, help="Replace --output_dir if it exists (as every vaswani tool says it)."
    )


@command("vaswani-export")
def main(argv):
    (args,) = parse_args(ExportArguments, argv, description=DESCRIPTION, epilog=EPILOG, renamed=RENAMED)
    setup_logging()
    from ..interop.export import export  # torch and transformers: only when the tool runs

    return export(
        args.model_name_or_path,
        args.output_dir,
        args.engine,
        args.quantization,
        args.tokenizer_name,
        args.overwrite_output_dir,
    )


if __name__ == "__main__":
    main()
