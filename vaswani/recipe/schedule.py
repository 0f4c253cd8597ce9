"""§5.3 The optimizer's learning-rate schedule: linear warm-up, then the inverse square root of the step (Eq. 3), with
an optional linear cool-down at the end of a run of known length (`--lr_cooldown_fraction`, not the paper).

The optimizer's learning rate is the schedule's peak, as in transformers (`--learning_rate`): the schedule multiplies
it by `warmup_factor`, which rises linearly to 1 at step `warmup_steps` and falls as step^-0.5 after it. The paper's
own peak, d_model^-0.5 * warmup_steps^-0.5 (`paper_peak_learning_rate`), makes this exactly Eq. 3:
lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5), step_num from 1. A run that will end inside
the warm-up is warned of (`WarmupEnd`). The learning-rate flags are checked and completed by `choose_learning_rate`
(from `PaperTrainingArguments.__post_init__`), the peak resolved on the model's d_model by
`resolve_peak_learning_rate`."""

import logging
import time

import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

# transformers' `TrainingArguments` default learning rate, for `--learning_rate` not given without the §5.3 schedule.
TRANSFORMERS_LEARNING_RATE = 5e-5


def paper_peak_learning_rate(d_model, warmup_steps, constant=1.0):
    """The highest rate of Eq. 3, reached at step `warmup_steps`: d_model^-0.5 * warmup_steps^-0.5, times
    tensor2tensor's `learning_rate_constant` (1.0: the paper)."""
    return constant * (d_model * warmup_steps) ** -0.5


def choose_learning_rate(args):
    """Check `--learning_rate` and `--learning_rate_constant` (not both; `arguments.check_recipe_values` checks that
    they are positive), `--warmup_steps` (positive with the §5.3 schedule) and `--lr_scheduler_type` (only
    without the §5.3 schedule); without the §5.3 schedule a learning rate not given is transformers' default."""
    if args.paper_lr_schedule and int(args.warmup_steps) <= 0:
        raise ValueError(f"The paper's schedule needs `warmup_steps` > 0, got {int(args.warmup_steps)}.")
    if None not in (args.learning_rate, args.learning_rate_constant):
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
        args.learning_rate = args.learning_rate or TRANSFORMERS_LEARNING_RATE  # (0 is refused)


def resolve_peak_learning_rate(args, d_model):
    """The peak learning rate for a model of width `d_model`: `--learning_rate`, else the §5.3 schedule's peak times
    `--learning_rate_constant`. Sets `args.learning_rate` to it."""
    if args.learning_rate is None:
        # (a --learning_rate_constant of 0 is refused)
        args.learning_rate = paper_peak_learning_rate(
            d_model, int(args.warmup_steps), args.learning_rate_constant or 1.0
        )
    return args.learning_rate


def warmup_factor(step, warmup_steps):
    """Eq. 3 divided by its peak: min(step^-0.5, step * warmup^-1.5) / warmup^-0.5, 1 at step `warmup_steps`."""
    step = max(step, 1)
    return min(step**-0.5, step * warmup_steps**-1.5) * warmup_steps**0.5


def cooldown_factor(progress, fraction):
    """The multiplier of `--lr_cooldown_fraction`: 1 until the last `fraction` of the run, then falling linearly
    to 0 at its end (`progress` 1). `fraction` 0 is the paper's schedule: always 1."""
    if fraction <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - progress) / fraction))


def paper_schedule(optimizer, warmup_steps, cooldown_fraction=0.0, max_steps=1, budget=None):
    """A `LambdaLR` giving each parameter group `learning_rate * warmup_factor(step)`: the optimizer's learning rate
    is the peak, reached at step `warmup_steps`; with `paper_peak_learning_rate(d_model, warmup_steps)` as that rate,
    exactly Eq. 3.

    `cooldown_fraction` > 0 (`--lr_cooldown_fraction`, not the paper) multiplies it by `cooldown_factor`, with the
    run's progress the larger of the step fraction (`step / max_steps`) and, with a time budget (`TimeBudget`), the
    share of `--max_train_minutes` spent: the learning rate reaches 0 where the run ends, whichever limit ends it."""

    def factor(step):  # LambdaLR counts optimizer steps from 0; the paper's step_num is 1 at the first update
        progress = max(step / max_steps, budget.elapsed_fraction() if budget else 0.0)
        return warmup_factor(step + 1, warmup_steps) * cooldown_factor(progress, cooldown_fraction)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def warn_of_a_run_inside_the_warmup(args, steps, bound):
    """Warn that `bound` (the flag that ends the run, in words) ends it after `steps` steps, inside the §5.3 warm-up."""
    warmup = int(args.warmup_steps)
    logger.warning(
        "%s ends the run inside the %d warm-up steps of the §5.3 schedule: the learning rate rises to %.3g only, "
        "not to the peak %.3g (--learning_rate). Give --warmup_steps below %d, or --paper_lr_schedule false to use "
        "--lr_scheduler_type as transformers does",
        bound,
        warmup,
        args.learning_rate * warmup_factor(steps, warmup),
        args.learning_rate,
        steps,
    )


class WarmupEnd(TrainerCallback):
    """Warns when the run will end inside the §5.3 warm-up, the peak learning rate never reached: before the first
    step when its steps (--max_steps, or the epochs') end it there; with only a time budget of `seconds`, once a
    minute (or a twentieth of the budget) has passed, when the steps at that pace do."""

    def __init__(self, seconds):
        self.seconds = seconds

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.first = time.monotonic(), state.global_step
        if not args.timed_only and state.max_steps < args.warmup_steps:
            bound = (
                f"--max_steps {args.max_steps}"
                if args.max_steps > 0
                else f"--num_train_epochs {args.num_train_epochs:g} ({state.max_steps} steps)"
            )
            warn_of_a_run_inside_the_warmup(args, state.max_steps, bound)
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
