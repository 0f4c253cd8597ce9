"""Average the last N checkpoints of a training run into one model folder (§6.1).

    python scripts/average_checkpoints.py --run_dir runs/base --num_checkpoints 5 --output_dir runs/base/averaged
    python scripts/average_checkpoints.py --checkpoints runs/big/checkpoint-9000 runs/big/checkpoint-10000 \\
        --output_dir runs/big/averaged

The paper averages the last 5 checkpoints (written every 10 minutes) for base models and the last 20 for big
ones. `checkpoint-<step>` folders are ordered by step number. The output folder loads with
`AutoModelForSeq2SeqLM.from_pretrained` and holds the newest checkpoint's tokenizer and generation config.
"""

import logging
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from vaswani.averaging import average_checkpoints, last_checkpoints


@dataclass
class AveragingArguments:
    output_dir: str = field(metadata={"help": "Folder to write the averaged model to."})
    run_dir: str | None = field(
        default=None, metadata={"help": "Training output folder holding checkpoint-<step>/ folders."}
    )
    num_checkpoints: int = field(
        default=5,
        metadata={"help": "With --run_dir: how many of the newest checkpoints (§6.1: 5 base, 20 big)."},
    )
    checkpoints: list[str] | None = field(
        default=None,
        metadata={"help": "Explicit checkpoint folders, oldest first (instead of --run_dir)."},
    )


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(AveragingArguments).parse_args_into_dataclasses(args=argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if (args.run_dir is None) == (args.checkpoints is None):
        raise SystemExit("Give exactly one of --run_dir and --checkpoints")
    checkpoints = args.checkpoints or last_checkpoints(args.run_dir, args.num_checkpoints)
    average_checkpoints(checkpoints, args.output_dir)


if __name__ == "__main__":
    main()
