"""The paper's WMT 2014 experiment: the argument files in recipes/, checkpoints every N minutes (--save_minutes),
WMT's two BLEU scores in the tools, and evaluation that says what it decodes and how long it takes."""

from pathlib import Path

import pytest
from transformers import TrainerControl, TrainerState

from vaswani.arguments import (
    PaperTrainingArguments,
)
from vaswani.callbacks import TimedCheckpoints

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {path.stem: path for path in sorted((ROOT / "recipes").glob("*.yaml"))}


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---- --save_minutes ---------------------------------------------------------------------------------------------
def _step(callback, state, control=None):
    control = control or TrainerControl()
    state.global_step += 1
    callback.on_step_end(None, state, control)
    return control.should_save


def test_save_minutes_writes_a_checkpoint_every_interval_and_a_resumed_run_continues_it():
    clock = FakeClock()
    timed = TimedCheckpoints(minutes=10, clock=clock)
    state = TrainerState(max_steps=1000, stateful_callbacks=[timed])
    timed.on_train_begin(None, state, TrainerControl())
    saved = []
    for _ in range(25):  # a step a minute
        clock.now += 60
        if _step(timed, state):
            saved.append(state.global_step)
    assert saved == [10, 20]
    # Any checkpoint restarts the interval: one by --save_steps at step 27 moves the next timed one to step 37.
    for _ in range(2):
        clock.now += 60
        _step(timed, state)
    clock.now += 60
    by_steps = TrainerControl(should_save=True)
    _step(timed, state, by_steps)
    # What a checkpoint written now keeps in its trainer_state.json (the Trainer calls state() while saving).
    clock.now += 30
    kept = {"TimedCheckpoints": timed.state()}
    assert kept["TimedCheckpoints"]["args"] == {"minutes": 10.0, "seconds_since_save": 30.0}
    # Resumed in another process, with another clock: 9.5 minutes after the checkpoint, the interval is over.
    other = FakeClock(now=5.0)
    resumed = TimedCheckpoints(minutes=10, clock=other)
    state = TrainerState(max_steps=1000, global_step=28, stateful_callbacks=kept)
    resumed.on_train_begin(None, state, TrainerControl())
    steps = []
    for _ in range(12):
        other.now += 60
        steps.append(_step(resumed, state))
    assert steps.index(True) == 9  # 30 s before the kill + 9 minutes + 60 s: 10.5 minutes, step 38
    # The last step is always saved; a checkpoint written without the callback resumes from zero.
    last = TrainerState(max_steps=3, global_step=2, stateful_callbacks={})
    fresh = TimedCheckpoints(minutes=10, clock=FakeClock())
    fresh.on_train_begin(None, last, TrainerControl())
    assert (
        "TimedCheckpoints" in last.stateful_callbacks
    )  # so that the Trainer can store it at the next checkpoint
    assert _step(fresh, last)


@pytest.mark.parametrize("minutes", [0, -10, float("nan")])
def test_save_minutes_must_be_positive(tmp_path, minutes):
    with pytest.raises(ValueError, match="--save_minutes must be a positive number of minutes"):
        PaperTrainingArguments(output_dir=str(tmp_path), save_minutes=minutes)
