"""The Trainer callbacks of the recipe: a wall-time budget (`--max_train_minutes`), checkpoints at intervals of time
(`--save_minutes`), a training clock that survives resuming, a progress bar that ends where the run ends, and the
hand-over of mixed precision to the trainer."""

import logging
import time

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState, ProgressCallback

logger = logging.getLogger(__name__)


def saved_args(stateful_callbacks, name):
    """The arguments that a `trainer_state.json`'s `stateful_callbacks` keeps of the callback class `name` (None: it
    keeps none). The Trainer stores every stateful callback's state under its class name at each checkpoint."""
    saved = (stateful_callbacks or {}).get(name)
    if isinstance(saved, list):
        saved = saved[0] if saved else None
    return saved.get("args", {}) if saved else None


def _state(**args):
    """An `ExportableState`'s state: the arguments that rebuild it."""
    return {"args": args, "attributes": {}}


class AutocastInTheTrainer(TrainerCallback):
    """Once training begins (the model prepared by Accelerate), hands mixed precision from Accelerate's forward
    wrapper to the trainer's own autocast (`VaswaniTrainer.autocast_smart_context_manager`)."""

    def __init__(self, trainer):  # a VaswaniTrainer
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.take_over_autocast()


def compiled_graphs():
    """The graphs `torch.compile` has compiled in this process so far, recompilations included."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompileCounter(TrainerCallback):
    """Under `--torch_compile`, logs each step at which `torch.compile` compiled (a first compilation or a
    recompilation for new shapes) and the total at the end of training, so that a run shows how often it compiled
    and whether that stopped."""

    def __init__(self):
        self.seen = self.at_start = compiled_graphs()

    def on_step_end(self, args, state, control, **kwargs):
        now = compiled_graphs()
        if now != self.seen:
            logger.info(
                "torch.compile: %d graphs compiled by step %d (%d in this run)",
                now,
                state.global_step,
                now - self.at_start,
            )
            self.seen = now

    def on_train_end(self, args, state, control, **kwargs):
        logger.info(
            "torch.compile: %d graphs compiled in %d steps",
            compiled_graphs() - self.at_start,
            state.global_step,
        )


class TimeBudget(TrainerCallback):
    """Ends training after `minutes` of wall time (counted from the start of this process's training), saving a
    checkpoint at the step that crosses the line. The §5.3 schedule does not depend on the number of steps, so a
    run may stop at any point; with `--lr_cooldown_fraction` the learning rate falls to 0 as the budget runs out."""

    def __init__(self, minutes):
        self.seconds = minutes * 60
        self.started = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.monotonic()

    def elapsed_fraction(self):
        """The share of the budget spent so far (0 before training starts)."""
        return 0.0 if self.started is None else (time.monotonic() - self.started) / self.seconds

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.started >= self.seconds:
            logger.info("Time budget of %g minutes reached at step %d", self.seconds / 60, state.global_step)
            control.should_training_stop = True
            control.should_save = True
            # The last step evaluates, as at --max_steps (transformers' step-based evaluation does that there).
            if args is not None and args.eval_strategy == "steps" and args.eval_delay <= state.global_step:
                control.should_evaluate = True


class TimedCheckpoints(TrainerCallback, ExportableState):
    """A checkpoint whenever `minutes` of wall time in training (evaluations included) have passed since the last
    checkpoint, whatever wrote it (`--save_minutes`; §6.1: "checkpoints, which were written at 10-minute
    intervals"), and one at the last step. Runs after the callbacks that ask for checkpoints by steps or by the time
    budget, so that any checkpoint restarts the interval. Each checkpoint keeps the time since the last one in its
    `trainer_state.json` (`stateful_callbacks`), where a resumed run picks the interval up (`on_train_begin`).
    `clock` returns seconds (tests pass a fake one)."""

    def __init__(self, minutes, seconds_since_save=0.0, clock=time.monotonic):
        self.minutes = float(minutes)
        self.clock = clock
        self.saved_at = clock() - float(seconds_since_save)  # the clock's time at the last checkpoint

    @property
    def seconds_since_save(self):
        return self.clock() - self.saved_at

    def state(self):
        return _state(minutes=self.minutes, seconds_since_save=self.seconds_since_save)

    def on_train_begin(self, args, state, control, **kwargs):
        # A resumed run continues from its checkpoint's count; a fresh one (or a checkpoint written without this
        # callback) from zero.
        saved = saved_args(state.stateful_callbacks, "TimedCheckpoints") or {}
        self.saved_at = self.clock() - float(saved.get("seconds_since_save", 0.0))
        state.stateful_callbacks["TimedCheckpoints"] = self.state()  # (a dict: `TrainerState.__post_init__`)

    def on_step_end(self, args, state, control, **kwargs):
        if self.seconds_since_save >= self.minutes * 60 or state.global_step >= state.max_steps:
            control.should_save = True
        if control.should_save:
            self.saved_at = self.clock()


class TrainingClock(TrainerCallback, ExportableState):
    """Seconds of training over every process of a run. The Trainer's `train_runtime` counts one process: a run
    killed and resumed would report only its last part. Each checkpoint's `trainer_state.json` keeps the clock
    (`stateful_callbacks`), where `checkpoints.train_or_resume` starts the resumed process from it."""

    def __init__(self, seconds_before=0.0):
        self.seconds_before = float(seconds_before)
        self.started = time.monotonic()
        self.ended = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.ended = time.monotonic(), None

    def on_train_end(self, args, state, control, **kwargs):
        self.ended = time.monotonic()

    @property
    def seconds(self):
        return self.seconds_before + (self.ended or time.monotonic()) - self.started

    def state(self):
        return _state(seconds_before=self.seconds)


class RunTokenizer(TrainerCallback, ExportableState):
    """Records the digest of the run's tokenizers (`tokenization.tokenizer_digest`) in every checkpoint's
    `trainer_state.json` (`stateful_callbacks`), so that a run resumed with another tokenizer of the same size is
    refused instead of training one vocabulary's embeddings on the other's ids (`checkpoints.verify_checkpoint`)."""

    def __init__(self, digest=None):
        self.digest = digest

    def state(self):
        return _state(digest=self.digest)


class RunProgress(ProgressCallback):
    """The training progress bar of a run with a time `budget` (a `TimeBudget`, `--max_train_minutes`), ending where
    the run ends: at `max_steps`, or where the budget stops the run first, so that a 10-minute run never shows a
    40-hour ETA (without a budget, transformers' `ProgressCallback` counts the steps).

    The bar fills with the time spent (the time left beside it, the step as a postfix), and moves ahead to the step
    fraction when steps run out first."""

    def __init__(self, budget):
        super().__init__()
        self.budget = budget

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        if self.training_bar is not None:  # on the main process
            steps = "" if getattr(args, "timed_only", False) else f" or {state.max_steps} steps"
            self.training_bar.reset(total=1000)  # per mille of the run: the bar shows the time spent and left
            self.training_bar.set_description_str(
                f"Training ({self.budget.seconds / 60:g} min{steps})", refresh=False
            )
            self.training_bar.bar_format = (
                "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]"
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:  # the larger of the time and the step fractions
            done = max(self.budget.elapsed_fraction(), state.global_step / max(state.max_steps, 1))
            self.training_bar.n = round(min(1.0, done) * self.training_bar.total)
            self.training_bar.set_postfix(step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            self.training_bar.n = self.training_bar.total  # the run is over: the bar is full
        super().on_train_end(args, state, control, **kwargs)
