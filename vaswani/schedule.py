"""§5.3 The optimizer's learning-rate schedule: linear warm-up, then the inverse square root of the step (Eq. 3), with
an optional linear cool-down at the end of a run of known length (`--lr_cooldown_fraction`, not the paper)."""

from __future__ import annotations

from functools import partial

import torch

from .callbacks import TimeBudget


def paper_learning_rate(step: int, d_model: int, warmup_steps: int) -> float:
    """lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5) (§5.3, Eq. 3), step_num from 1."""
    step = max(step, 1)
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def cooldown_factor(progress: float, fraction: float) -> float:
    """The multiplier of `--lr_cooldown_fraction`: 1 until the last `fraction` of the run, then falling linearly
    to 0 at its end (`progress` 1). `fraction` 0 is the paper's schedule: always 1."""
    if fraction <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - progress) / fraction))


def paper_schedule(
    optimizer: torch.optim.Optimizer,
    d_model: int,
    warmup_steps: int,
    cooldown_fraction: float = 0.0,
    max_steps: int = 1,
    budget: TimeBudget | None = None,
):
    """A `LambdaLR` giving each parameter group `learning_rate * lrate(step)`: with `learning_rate` 1.0 (the default
    of `PaperTrainingArguments`) exactly Eq. 3; other values scale it (tensor2tensor's `learning_rate` multiplier).

    `cooldown_fraction` > 0 (`--lr_cooldown_fraction`, not the paper) multiplies it by `cooldown_factor`, with the
    run's progress the larger of the step fraction (`step / max_steps`) and, with a time budget, the share of
    `--max_train_minutes` spent: the learning rate reaches 0 where the run ends, whichever limit ends it."""
    if warmup_steps <= 0:
        raise ValueError(f"The paper's schedule needs `warmup_steps` > 0, got {warmup_steps}.")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        partial(
            _shifted_paper_learning_rate,
            d_model=d_model,
            warmup_steps=warmup_steps,
            cooldown_fraction=cooldown_fraction,
            max_steps=max_steps,
            budget=budget,
        ),
    )


def _shifted_paper_learning_rate(step, d_model, warmup_steps, cooldown_fraction, max_steps, budget) -> float:
    # LambdaLR counts optimizer steps from 0; the paper's step_num is 1 at the first update.
    rate = paper_learning_rate(step + 1, d_model, warmup_steps)
    if not cooldown_fraction:
        return rate
    progress = step / max(max_steps, 1)
    if budget is not None:
        progress = max(progress, budget.elapsed_fraction())
    return rate * cooldown_factor(progress, cooldown_fraction)
