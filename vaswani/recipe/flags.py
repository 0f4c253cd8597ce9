"""How `vaswani-train` reads the flags it shares with transformers and fairseq: what a user gives means what it means
there, and the paper's recipe fills in only what is not given (`PaperTrainingArguments.__post_init__` calls these).

- Batches: `--per_device_train_batch_size` alone gives batches of that many sentences, as in transformers; with
  `--max_tokens`, token-budget batches of at most that many sentences (fairseq's `--batch-size` with `--max-tokens`);
  neither, the paper's token-budget batches of `PAPER_MAX_TOKENS` tokens (§5.1).
- Learning rate: `--learning_rate` (fairseq's `--lr`) is the peak rate, as in transformers; the §5.3 schedule rises
  to it over `--warmup_steps`. Not given, the peak is the paper's, d_model^-0.5 * warmup_steps^-0.5, times
  tensor2tensor's `--learning_rate_constant` (1.0); the peak needs the model's d_model, so the trainer resolves it
  (`resolve_peak_learning_rate`).
- Values transformers accepts but that cannot train are refused by name (`check_recipe_values`).
"""

from __future__ import annotations

import logging
import math
import time

from transformers import TrainerCallback

from .schedule import paper_peak_learning_rate, warmup_factor

logger = logging.getLogger(__name__)

# §5.1's token-budget batches, per device: micro-batches of this many padded tokens unless other batches are asked for
# (the paper's ~25,000-token update is `--batch_tokens 25000`, which accumulates them).
PAPER_MAX_TOKENS = 4096
# transformers' `TrainingArguments` defaults, for the flags whose default here is None ("not given").
TRANSFORMERS_LEARNING_RATE = 5e-5
TRANSFORMERS_BATCH_SIZE = 8


def check_recipe_values(args) -> None:
    """Raise `ValueError` naming the flag for values transformers accepts but that cannot train."""
    smoothing = args.label_smoothing_factor
    if not (math.isfinite(smoothing) and 0.0 <= smoothing < 1.0):
        raise ValueError(
            f"--label_smoothing_factor must be at least 0 and below 1 (the probability mass spread over the "
            f"vocabulary; the paper: 0.1), got {smoothing}"
        )
    if getattr(args.save_strategy, "value", args.save_strategy) == "steps" and not args.save_steps > 0:
        raise ValueError(
            f"--save_steps must be positive with --save_strategy steps (a checkpoint every N steps), got "
            f"{args.save_steps}; --save_strategy no saves none"
        )


def choose_batches(args) -> None:
    """Set `args.max_tokens` and `args.max_sentences` (the cap of a token-budget batch, None for none) from what was
    given; `per_device_train_batch_size` None means not given (then transformers' 8, which token-budget batches do
    not use)."""
    for name in ("per_device_train_batch_size", "max_tokens", "batch_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be positive, got {value}")
    args.max_sentences = None
    if args.per_device_train_batch_size is None:
        args.per_device_train_batch_size = TRANSFORMERS_BATCH_SIZE
        if args.max_tokens is None:
            args.max_tokens = PAPER_MAX_TOKENS
    elif args.max_tokens is not None:
        args.max_sentences = args.per_device_train_batch_size


def choose_learning_rate(args) -> None:
    """Check `--learning_rate` and `--learning_rate_constant` (positive, not both) and `--lr_scheduler_type` (only
    without the §5.3 schedule); without the §5.3 schedule a learning rate not given is transformers' default."""
    for name in ("learning_rate", "learning_rate_constant"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{name} must be a positive number, got {value}")
    if args.learning_rate is not None and args.learning_rate_constant is not None:
        raise ValueError(
            f"--learning_rate {args.learning_rate} and --learning_rate_constant {args.learning_rate_constant} both "
            "set the peak learning rate: give one (--learning_rate is the peak itself; --learning_rate_constant "
            "multiplies the §5.3 formula)"
        )
    if args.lr_scheduler_type is None:
        args.lr_scheduler_type = "linear"  # transformers' default, unused by the §5.3 schedule
    elif args.paper_lr_schedule:
        raise ValueError(
            f"--lr_scheduler_type {args.lr_scheduler_type} is one of transformers' schedules, but the §5.3 "
            "schedule is on: add --paper_lr_schedule false to use it"
        )
    if not args.paper_lr_schedule:
        if args.learning_rate_constant is not None:
            raise ValueError(
                "--learning_rate_constant multiplies the §5.3 schedule; with --paper_lr_schedule false give "
                "--learning_rate (the peak rate) instead"
            )
        if args.learning_rate is None:
            args.learning_rate = TRANSFORMERS_LEARNING_RATE


def resolve_peak_learning_rate(args, d_model: int) -> float:
    """The peak learning rate for a model of width `d_model`: `--learning_rate`, else the §5.3 schedule's peak times
    `--learning_rate_constant`. Sets `args.learning_rate` to it."""
    if args.learning_rate is None:
        constant = 1.0 if args.learning_rate_constant is None else args.learning_rate_constant
        args.learning_rate = paper_peak_learning_rate(d_model, int(args.warmup_steps), constant)
    return args.learning_rate


def describe_batches(args) -> str:
    """The batches a run trains on, in words."""
    if args.max_tokens is None:
        return f"batches of {args.per_device_train_batch_size} sentences per device (--per_device_train_batch_size)"
    if args.max_sentences is not None:
        return (
            f"token-budget batches of at most {args.max_tokens} tokens and {args.max_sentences} sentences per "
            "device (--max_tokens, --per_device_train_batch_size)"
        )
    return f"token-budget batches of at most {args.max_tokens} tokens per device (--max_tokens, §5.1)"


def log_recipe(args) -> None:
    """Say how the run batches and which learning rate it trains with (`WarmupEnd` warns when the run ends inside
    the §5.3 warm-up)."""
    logger.info("Batches: %s", describe_batches(args))
    if not args.paper_lr_schedule:
        logger.info(
            "Learning rate: %.3g, schedule %s (--paper_lr_schedule false)",
            args.learning_rate,
            getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type),
        )
        return
    warmup = int(args.warmup_steps)
    logger.info(
        "Learning rate: the §5.3 schedule, rising to its peak %.3g at step %d (--warmup_steps), then falling as "
        "step^-0.5",
        args.learning_rate,
        warmup,
    )


def warn_of_a_run_inside_the_warmup(args, steps: int, bound: str) -> None:
    """Warn that `bound` (the flag that ends the run, in words) ends it after `steps` steps, inside the §5.3 warm-up."""
    logger.warning(
        "%s ends the run inside the %d warm-up steps of the §5.3 schedule: the learning rate rises to %.3g only, "
        "not to the peak %.3g (--learning_rate). Give --warmup_steps below %d, or --paper_lr_schedule false to use "
        "--lr_scheduler_type as transformers does",
        bound,
        int(args.warmup_steps),
        args.learning_rate * warmup_factor(steps, int(args.warmup_steps)),
        args.learning_rate,
        steps,
    )


class WarmupEnd(TrainerCallback):
    """Warns when the run will end inside the §5.3 warm-up, the peak learning rate never reached: before the first
    step when its steps (--max_steps, or the epochs') end it there; with only a time budget of `seconds`, once a
    minute (or a twentieth of the budget) has passed, when the steps at that pace do."""

    def __init__(self, seconds: float | None = None):
        self.seconds = seconds
        self.started = self.first = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.first = time.monotonic(), state.global_step
        if not args.timed_only and state.max_steps < args.warmup_steps:
            epochs = f"--num_train_epochs {args.num_train_epochs:g} ({state.max_steps} steps)"
            warn_of_a_run_inside_the_warmup(
                args, state.max_steps, f"--max_steps {args.max_steps}" if args.max_steps > 0 else epochs
            )
            self.seconds = None  # said once

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = time.monotonic() - self.started
        if not self.seconds or state.global_step >= args.warmup_steps or elapsed < min(60, self.seconds / 20):
            return
        pace = (state.global_step - self.first) / elapsed
        steps = min(state.max_steps, round(state.global_step + pace * (self.seconds - elapsed)))
        if steps < args.warmup_steps:
            budget = f"--max_train_minutes {self.seconds / 60:g} (about {steps} steps at {pace:.3g} a second)"
            warn_of_a_run_inside_the_warmup(args, steps, budget)
        self.seconds = None
