"""`vaswani-convert`: import a pretrained OPUS-MT or fairseq WMT translation model as a `vaswani` model.

The conversion, its checks and its limits are `vaswani.interop.convert`'s (its docstring says what becomes which
`VaswaniConfig` field); the folder written loads with `pipeline("translation", ..., trust_remote_code=True)`.
"""

from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from .cli import command, parse_args, setup_logging

DESCRIPTION = __doc__.split("\n\n")[0].replace("`vaswani-convert`: i", "I", 1)

EPILOG = """\
examples:
  vaswani-convert --model_name_or_path Helsinki-NLP/opus-mt-de-en --output_dir models/opus-mt-de-en
  vaswani-convert --model_name_or_path path/to/wmt19-de-en --output_dir models/wmt19-de-en
"""


@dataclass
class ConvertArguments:
    _argument_group_name = "conversion"

    model_name_or_path: str = HfArg(
        help="Folder (or Hub id) of a MarianMTModel or FSMTForConditionalGeneration with its tokenizer."
    )
    output_dir: str = HfArg(help="The vaswani model folder to write.")
    overwrite_output_dir: bool = HfArg(default=False, help="Replace --output_dir if it holds files.")


@command("vaswani-convert")
def main(argv):
    (args,) = parse_args(ConvertArguments, argv, description=DESCRIPTION, epilog=EPILOG)
    setup_logging()
    from ..interop.convert import convert  # torch and transformers: only when the tool runs

    convert(args.model_name_or_path, args.output_dir, args.overwrite_output_dir)


if __name__ == "__main__":
    main()
