"""Plot a run's learning curves, or a model's attention for one sentence pair.

    python scripts/plot.py curves --run runs/base --output runs/base/curves.png
    python scripts/plot.py attention --model runs/base/averaged --source "Ein Hund läuft." \\
        --target "A dog runs." --output_dir runs/base/attention

`curves` reads `trainer_state.json` (a file, a checkpoint folder, or a run folder: its own state or its newest
checkpoint's) and plots training/eval loss, eval BLEU and learning rate against the step.
`attention` writes `<prefix>_encoder.png`, `<prefix>_decoder.png` and `<prefix>_cross.png`, a grid of layers x
heads each; without --target the model's own translation of --source is used.
"""

import logging
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from vaswani.plotting import attention_maps, load_attention_model, plot_attention_maps, plot_learning_curves


@dataclass
class CurvesArguments:
    run: str = field(metadata={"help": "Run folder, checkpoint folder or trainer_state.json."})
    output: str = field(metadata={"help": "PNG file to write."})
    title: str | None = field(default=None, metadata={"help": "Figure title (default: the --run path)."})


@dataclass
class AttentionArguments:
    model: str = field(metadata={"help": "Model folder."})
    source: str = field(metadata={"help": "Source sentence."})
    output_dir: str = field(metadata={"help": "Folder for the three PNG files."})
    target: str | None = field(
        default=None, metadata={"help": "Target sentence (default: the model's translation of --source)."}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer folder, if not the model folder."}
    )
    prefix: str = field(default="attention", metadata={"help": "File name prefix."})
    layers: list[int] | None = field(default=None, metadata={"help": "Only these layers (0-based)."})
    heads: list[int] | None = field(default=None, metadata={"help": "Only these heads (0-based)."})
    device: str | None = field(default=None, metadata={"help": "cuda or cpu; default: cuda if available."})


COMMANDS = {"curves": CurvesArguments, "attention": AttentionArguments}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        raise SystemExit(f"usage: plot.py {{{','.join(COMMANDS)}}} [--help] ...")
    command, rest = argv[0], argv[1:]
    (args,) = HfArgumentParser(COMMANDS[command]).parse_args_into_dataclasses(args=rest)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if command == "curves":
        plot_learning_curves(args.run, args.output, title=args.title)
        return
    model, source_tokenizer, target_tokenizer = load_attention_model(args.model, args.tokenizer, args.device)
    maps = attention_maps(model, source_tokenizer, args.source, args.target, target_tokenizer)
    plot_attention_maps(maps, args.output_dir, args.prefix, args.layers, args.heads)


if __name__ == "__main__":
    main()
