"""`vaswani-plot`: a run's learning curves, or a model's attention for one sentence pair.

`curves` reads `trainer_state.json` (a file, a checkpoint folder, or a run folder: its own state or its newest
checkpoint's) and plots training/eval loss, eval BLEU and learning rate against the step. `attention` writes
`<prefix>_encoder.png`, `<prefix>_decoder.png` and `<prefix>_cross.png`, a grid of layers x heads each; without
--target_text the model's own translation of --source_text is used.
"""

from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from ..common.errors import UsageError
from .cli import command, parse_args, setup_logging

DESCRIPTION = __doc__.replace("`vaswani-plot`: a", "A", 1)

EPILOG = """\
examples:
  vaswani-plot curves --run_dir runs/base --output runs/base/curves.png
  vaswani-plot attention --model_name_or_path runs/base/averaged --source_text "Ein Hund läuft." \\
      --target_text "A dog runs." --output_dir runs/base/attention
"""


@dataclass
class CurvesArguments:
    _argument_group_name = "curves"

    run_dir: str = HfArg(help="Run folder, checkpoint folder or trainer_state.json.")
    output: str = HfArg(help="PNG file to write.")
    title: str | None = HfArg(default=None, help="Figure title (default: the --run_dir path).")


@dataclass
class AttentionArguments:
    _argument_group_name = "attention"

    model_name_or_path: str = HfArg(help="Model folder.")
    source_text: str = HfArg(help="Source sentence.")
    output_dir: str = HfArg(help="Folder for the three PNG files.")
    target_text: str | None = HfArg(
        default=None, help="Target sentence (default: the model's translation of --source_text)."
    )
    tokenizer_name: str | None = HfArg(default=None, help="Tokenizer folder, if not the model folder.")
    prefix: str = HfArg(default="attention", help="File name prefix.")
    layers: list[int] | None = HfArg(default=None, help="Only these layers (0-based).")
    heads: list[int] | None = HfArg(default=None, help="Only these heads (0-based).")
    device: str | None = HfArg(default=None, help="cuda or cpu; default: cuda if available.")


COMMANDS = {"curves": CurvesArguments, "attention": AttentionArguments}
RENAMED = {
    "curves": {"run": "run_dir"},
    "attention": {
        "model": "model_name_or_path",
        "source": "source_text",
        "target": "target_text",
        "tokenizer": "tokenizer_name",
    },
}


@command("vaswani-plot")
def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: vaswani-plot {{{','.join(COMMANDS)}}} [--help] ...\n\n{DESCRIPTION}\n{EPILOG}")
        return None
    if not argv or argv[0] not in COMMANDS:
        raise UsageError(f"the first argument must be one of {', '.join(COMMANDS)} (vaswani-plot --help)")
    name = argv[0]
    (args,) = parse_args(
        COMMANDS[name], argv[1:], description=DESCRIPTION, epilog=EPILOG, renamed=RENAMED[name]
    )
    setup_logging()
    from ..recipe.plotting import (  # torch and matplotlib: only when the tool runs
        attention_maps,
        load_attention_model,
        plot_attention_maps,
        plot_learning_curves,
    )

    if name == "curves":
        return plot_learning_curves(args.run_dir, args.output, title=args.title)
    model, source_tokenizer, target_tokenizer = load_attention_model(
        args.model_name_or_path, args.tokenizer_name, args.device
    )
    maps = attention_maps(model, source_tokenizer, args.source_text, args.target_text, target_tokenizer)
    return plot_attention_maps(maps, args.output_dir, args.prefix, args.layers, args.heads)


if __name__ == "__main__":
    main()
