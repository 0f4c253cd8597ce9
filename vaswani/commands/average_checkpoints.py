"""`vaswani-average-checkpoints`: average the last N checkpoints of a training run into one model folder (§6.1).

The paper averages the last 5 checkpoints (written every 10 minutes) for base models and the last 20 for big ones.
`checkpoint-<step>` folders are ordered by step number. The output folder loads with
`AutoModelForSeq2SeqLM.from_pretrained` and with `pipeline("translation", ..., trust_remote_code=True)`, holds the
newest checkpoint's tokenizer and generation config, and replaces an earlier one in one step (never half-written).
"""

from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from ..common.errors import UsageError, require_positive
from .cli import command, parse_args, setup_logging

DESCRIPTION = __doc__.replace("`vaswani-average-checkpoints`: a", "A", 1)

EPILOG = """\
examples:
  vaswani-average-checkpoints --run_dir runs/base --num_checkpoints 5 --output_dir runs/base/averaged
  vaswani-average-checkpoints --checkpoints runs/big/checkpoint-9000 runs/big/checkpoint-10000 \\
      --output_dir runs/big/averaged
"""


@dataclass
class AveragingArguments:
    _argument_group_name = "averaging"

    output_dir: str = HfArg(help="Folder to write the averaged model to.")
    run_dir: str | None = HfArg(
        default=None, help="Training output folder holding checkpoint-<step>/ folders."
    )
    num_checkpoints: int = HfArg(
        default=5, help="With --run_dir: how many of the newest checkpoints (§6.1: 5 base, 20 big)."
    )
    checkpoints: list[str] | None = HfArg(
        default=None, help="Explicit checkpoint folders, oldest first (instead of --run_dir)."
    )

    def __post_init__(self):
        if (self.run_dir is None) == (self.checkpoints is None):
            raise UsageError("Give exactly one of --run_dir and --checkpoints")
        require_positive(self, "num_checkpoints")


@command("vaswani-average-checkpoints")
def main(argv):
    (args,) = parse_args(AveragingArguments, argv, description=DESCRIPTION, epilog=EPILOG)
    setup_logging()
    from ..recipe.averaging import average_checkpoints, last_checkpoints  # torch: only when the tool runs

    checkpoints = args.checkpoints or last_checkpoints(args.run_dir, args.num_checkpoints)
    folder = average_checkpoints(checkpoints, args.output_dir)
    print(f"Wrote the average of {len(checkpoints)} checkpoints to {folder}")
    return folder


if __name__ == "__main__":
    main()
