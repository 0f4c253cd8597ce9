"""The training recipe of §5 on transformers' own tools: `Seq2SeqTrainer` with token-budget batches (§5.1), Adam
with the paper's warm-up schedule (§5.3), label smoothing (§5.4), BLEU during training, and checkpoints that a
killed run resumes from.

`scripts/train.py` parses `PaperTrainingArguments` (all of `Seq2SeqTrainingArguments`, with the paper's values as
defaults) and calls into this module.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import extract_model_from_parallel
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback
from transformers.trainer_callback import ExportableState, ProgressCallback

from .fileio import replace_files, temporary_sibling

logger = logging.getLogger(__name__)

MODEL_INPUTS = ("input_ids", "attention_mask", "labels")


# ---------------------------------------------------------------------------------------------------------------------
# §5.1 Batches of similar length by token budget
# ---------------------------------------------------------------------------------------------------------------------
class TokenBudgetBatchSampler:
    """Batches of example indices holding at most `max_tokens` tokens each, sentences of similar length together.

    §5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch contained a set
    of sentence pairs containing approximately 25000 source tokens and 25000 target tokens." A batch's cost is its
    padded size, `len(batch) * max(length)`, where an example's length is the longer of its two sides.

    Each epoch shuffles examples of equal length and the order of the batches with a generator seeded by
    `(seed, epoch)`, so the batches of an epoch are a pure function of the epoch: a resumed run sees the same ones.
    The number of batches does not depend on the epoch. Under DDP, Accelerate deals the batches out to the ranks
    (rank r takes batches r, r + world, ...), so one global step sees `world` consecutive batches.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        max_sentences: int | None = None,
    ):
        if max_tokens <= 0:
            raise ValueError(f"`max_tokens` must be positive, got {max_tokens}.")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if len(self.lengths) == 0:
            raise ValueError("Cannot batch an empty dataset.")
        longest = int(self.lengths.max())
        if longest > max_tokens:
            raise ValueError(
                f"Example {int(self.lengths.argmax())} has {longest} tokens, more than `max_tokens`={max_tokens}: "
                "raise the token budget or filter long pairs (`max_length`)."
            )
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.batch_size = None  # batches vary in size; read by Accelerate
        self.drop_last = False
        self._num_batches = len(self._group(np.argsort(self.lengths, kind="stable")))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _group(self, order: np.ndarray) -> list[list[int]]:
        batches, batch, longest = [], [], 0
        for index in order.tolist():
            length = int(self.lengths[index])
            grown = max(longest, length)
            full = self.max_sentences is not None and len(batch) >= self.max_sentences
            if batch and (grown * (len(batch) + 1) > self.max_tokens or full):
                batches.append(batch)
                batch, grown = [], length
            batch.append(index)
            longest = grown
        batches.append(batch)
        return batches

    def batches(self) -> list[list[int]]:
        if not self.shuffle:
            return self._group(np.argsort(self.lengths, kind="stable"))
        rng = np.random.default_rng([self.seed, self.epoch])
        shuffled = rng.permutation(len(self.lengths))
        order = shuffled[np.argsort(self.lengths[shuffled], kind="stable")]  # by length, random among equals
        batches = self._group(order)
        return [batches[i] for i in rng.permutation(len(batches))]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        return self._num_batches


class _EpochSetter(TrainerCallback):
    """Tells the sampler which epoch begins. Accelerate's wrappers (skipping batches on resume, sharding under DDP)
    do not always forward `set_epoch`, so the epoch is taken from the trainer's own state instead."""

    def __init__(self, sampler: TokenBudgetBatchSampler):
        self.sampler = sampler
        self.next_epoch = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.next_epoch = math.floor((state.epoch or 0.0) + 1e-6)  # a resumed run continues its epoch

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(self.next_epoch)
        self.next_epoch += 1


class _AutocastInTheTrainer(TrainerCallback):
    """Once training begins (the model prepared by Accelerate), hands mixed precision from Accelerate's forward
    wrapper to the trainer's own autocast (`VaswaniTrainer.autocast_smart_context_manager`)."""

    def __init__(self, trainer: VaswaniTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.take_over_autocast()


class TimeBudget(TrainerCallback):
    """Ends training after `minutes` of wall time (counted from the start of this process's training), saving a
    checkpoint at the step that crosses the line. The §5.3 schedule does not depend on the number of steps, so a
    run may stop at any point; with `--lr_cooldown_fraction` the learning rate falls to 0 as the budget runs out."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60
        self.started = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.monotonic()

    def elapsed_fraction(self) -> float:
        """The share of the budget spent so far (0 before training starts)."""
        return 0.0 if self.started is None else (time.monotonic() - self.started) / self.seconds

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.started >= self.seconds:
            logger.info(
                "Time budget of %.1f minutes reached at step %d", self.seconds / 60, state.global_step
            )
            control.should_training_stop = True
            control.should_save = True
        return control


class TrainingClock(TrainerCallback, ExportableState):
    """Seconds of training over every process of a run. The Trainer's `train_runtime` counts one process: a run
    killed and resumed would report only its last part. Each checkpoint's `trainer_state.json` keeps the clock
    (`stateful_callbacks`), and `from_checkpoint` starts the resumed process from it."""

    def __init__(self, seconds_before: float = 0.0):
        self.seconds_before = float(seconds_before)
        self.started = time.monotonic()
        self.ended = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.ended = time.monotonic(), None

    def on_train_end(self, args, state, control, **kwargs):
        self.ended = time.monotonic()

    @property
    def seconds(self) -> float:
        return self.seconds_before + (self.ended or time.monotonic()) - self.started

    def state(self) -> dict:
        return {"args": {"seconds_before": self.seconds}, "attributes": {}}

    @classmethod
    def from_checkpoint(cls, checkpoint: str | os.PathLike) -> TrainingClock:
        """The clock as `checkpoint` saved it; from zero, with a warning, for a checkpoint written without one."""
        state = json.loads(Path(checkpoint, "trainer_state.json").read_text())
        saved = state.get("stateful_callbacks", {}).get(cls.__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        if not saved:
            logger.warning(
                "%s holds no training clock: the training time reported counts from this resumption only",
                checkpoint,
            )
            return cls()
        return cls(**saved.get("args", {}))


class RunProgress(ProgressCallback):
    """The training progress bar, ending where the run ends: at `max_steps`, or at `minutes` of wall time when
    `TimeBudget` stops the run first (`--max_train_minutes`), so that a 10-minute run never shows a 40-hour ETA.

    With a time budget the bar counts seconds, and moves ahead to the step fraction when steps run out first."""

    def __init__(self, minutes: float | None = None):
        super().__init__()
        self.seconds = None if minutes is None else minutes * 60
        self.started = None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.seconds is None:
            return super().on_train_begin(args, state, control, **kwargs)
        self.current_step = state.global_step
        self.started = time.monotonic()
        if state.is_world_process_zero:
            self.training_bar = tqdm(
                total=max(1, round(self.seconds)),
                dynamic_ncols=True,
                desc=f"Training ({self.seconds / 60:g} min or {state.max_steps} steps)",
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}{postfix}]",
            )

    def fraction(self, state) -> float:
        """How much of the run is done: the larger of the time and the step fractions."""
        elapsed = time.monotonic() - self.started
        return min(1.0, max(elapsed / self.seconds, state.global_step / max(state.max_steps, 1)))

    def on_step_end(self, args, state, control, **kwargs):
        if self.seconds is None:
            return super().on_step_end(args, state, control, **kwargs)
        self.current_step = state.global_step
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.n = round(self.fraction(state) * self.training_bar.total)
            self.training_bar.set_postfix(step=state.global_step, refresh=False)
            self.training_bar.refresh()

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and self.seconds is not None:
            self.training_bar.n = self.training_bar.total  # the run is over: the bar is full
            self.training_bar.refresh()
        return super().on_train_end(args, state, control, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# §5.3 Optimizer schedule
# ---------------------------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------------------------
# Arguments: all of Seq2SeqTrainingArguments, with the paper's values as defaults
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class PaperTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` whose defaults are the paper's recipe; every Trainer flag still works."""

    _argument_group_name = "the paper's training recipe (§5; Seq2SeqTrainingArguments with the paper's defaults)"

    output_dir: str | None = field(
        default="runs/vaswani",
        metadata={"help": "The run's folder: checkpoints, the final and averaged models, scores, pictures."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Replace the run in --output_dir (its checkpoints, models, scores); without it a folder that "
            "holds anything is refused unless --resume_from_checkpoint continues its run."
        },
    )
    do_train: bool = field(default=True, metadata={"help": "Always true: this tool trains."})
    do_eval: bool = field(
        default=False,
        metadata={
            "help": "Evaluate (loss, BLEU) on the validation data at the end of training; with --eval_strategy "
            "steps it also runs every --eval_steps."
        },
    )
    do_predict: bool = field(
        default=False,
        metadata={"help": "Translate and score the test data after training (--test_split, default 'test')."},
    )
    learning_rate: float = field(
        default=1.0,
        metadata={"help": "With --paper_lr_schedule, a multiplier of the §5.3 formula (1.0 = the paper)."},
    )
    warmup_steps: int = field(default=4000, metadata={"help": "warmup_steps of §5.3 (the paper: 4000)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam beta1 (§5.3: 0.9)."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2 (§5.3: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam epsilon (§5.3: 1e-9)."})
    weight_decay: float = field(default=0.0, metadata={"help": "No weight decay in the paper."})
    max_grad_norm: float = field(
        default=0.0,
        metadata={
            "help": "Gradient-norm clipping threshold; 0 disables it. The paper clips nothing (§5.3); transformers' "
            "Trainer defaults to 1.0, so clipping is a departure to ask for by setting this."
        },
    )
    optim: str = field(
        default="adamw_torch", metadata={"help": "Adam (weight decay 0 makes AdamW plain Adam)."}
    )
    label_smoothing_factor: float = field(
        default=0.1, metadata={"help": "eps_ls of §5.4 (0.1), applied by the recipe's loss."}
    )
    fused_output_loss: bool = field(
        default=True,
        metadata={
            "help": "In CPU training under bf16/fp16 autocast with the recipe's label-smoothed loss, compute the "
            "output projection and the loss together, chunk by chunk, without the (tokens x vocabulary) logits "
            "(kernels_vaswani.linear_label_smoothed_cross_entropy): the same loss and gradients to rounding, "
            "faster. False computes the logits, then the loss."
        },
    )
    paper_lr_schedule: bool = field(
        default=True,
        metadata={
            "help": "Use the §5.3 schedule; false falls back to --lr_scheduler_type with --learning_rate."
        },
    )
    lr_cooldown_fraction: float = field(
        default=0.0,
        metadata={
            "help": "A departure from §5.3 for runs of a known length: over the last FRACTION of the run "
            "(of --max_steps, or of --max_train_minutes when that ends it first) the learning rate falls "
            "linearly to 0. 0 (default) is the paper's schedule."
        },
    )
    max_tokens: int | None = field(
        default=4096,
        metadata={
            "help": "Token budget of one micro-batch per device (padded tokens of the longer side, §5.1). "
            "None batches by --per_device_train_batch_size sentences instead."
        },
    )
    batch_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per optimizer step across devices and accumulation; sets --gradient_accumulation_steps "
            "to ceil(batch_tokens / (max_tokens * world_size)). The paper: about 25000."
        },
    )
    predict_with_generate: bool = field(default=True, metadata={"help": "Evaluate BLEU with generate()."})
    generation_num_beams: int | None = field(
        default=1,
        metadata={"help": "Beams for BLEU during training (greedy for speed; the final test uses 4)."},
    )
    generation_max_length: int | None = field(
        default=None, metadata={"help": "Max length for eval generation."}
    )
    save_strategy: str = field(default="steps", metadata={"help": "Checkpoints at a fixed interval."})
    save_steps: float = field(default=500, metadata={"help": "Checkpoint interval in optimizer steps."})
    eval_strategy: str = field(default="steps", metadata={"help": "Evaluate with BLEU at a fixed interval."})
    eval_steps: float | None = field(
        default=500, metadata={"help": "Evaluation interval in optimizer steps."}
    )
    logging_steps: float = field(default=50, metadata={"help": "Log loss and learning rate every N steps."})
    report_to: str = field(default="none", metadata={"help": "Trackers (none by default)."})
    save_safetensors: bool = field(default=True, metadata={"help": "Checkpoints as safetensors."})

    max_train_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Stop (with a checkpoint) once training has run this long; the schedule does not care."
        },
    )

    def __post_init__(self):
        _check_training_length(self)
        if not self.do_train:
            raise ValueError(
                "--do_train false leaves nothing to do: this tool trains (translate with vaswani-translate)"
            )
        _check_launch()
        if self.deepspeed and not torch.cuda.is_available():
            raise ValueError(
                "--deepspeed needs a GPU: Accelerate runs DeepSpeed on accelerators only; shard the model on CPU "
                "processes with --fsdp instead"
            )
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
            # Several processes on a machine without GPUs (torchrun / accelerate launch): Accelerate forms the
            # gloo process group only when asked for the CPU; otherwise every rank would train alone.
            self.use_cpu = True
        if not torch.cuda.is_available():
            self.dataloader_pin_memory = False  # pinning needs an accelerator
        super().__post_init__()
        if not 0.0 <= self.lr_cooldown_fraction < 1.0 or not math.isfinite(self.lr_cooldown_fraction):
            raise ValueError(
                f"--lr_cooldown_fraction must be at least 0 and below 1 (the share of the run over which the "
                f"learning rate falls to 0), got {self.lr_cooldown_fraction}"
            )
        if self.lr_cooldown_fraction and not self.paper_lr_schedule:
            raise ValueError(
                "--lr_cooldown_fraction acts on the §5.3 schedule; with --paper_lr_schedule false choose a decaying "
                "--lr_scheduler_type (linear, cosine) instead"
            )
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise ValueError(f"`max_tokens` must be positive, got {self.max_tokens}.")
        if self.batch_tokens is not None:
            if self.max_tokens is None:
                raise ValueError("`batch_tokens` needs `max_tokens` (token-budget batches).")
            self.gradient_accumulation_steps = max(
                1, math.ceil(self.batch_tokens / (self.max_tokens * max(self.world_size, 1)))
            )


def _check_training_length(args) -> None:
    """Raise `ValueError` naming the flag unless the run has a length: a run of 0 or -5 steps would save an untrained
    model as if it were trained."""
    if args.max_steps == 0 or args.max_steps < -1:
        raise ValueError(
            f"--max_steps must be a positive number of optimizer steps (or -1 to train for --num_train_epochs), "
            f"got {args.max_steps}"
        )
    if args.max_steps == -1 and not args.num_train_epochs > 0:
        raise ValueError(
            f"--num_train_epochs must be positive (or give --max_steps), got {args.num_train_epochs}"
        )
    minutes = getattr(args, "max_train_minutes", None)
    if minutes is not None and not (minutes > 0 and math.isfinite(minutes)):
        raise ValueError(f"--max_train_minutes must be a positive number of minutes, got {minutes}")


_MPI_WORLD_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE")


def _check_launch() -> None:
    """`accelerate launch --cpu --num_processes N` (N > 1, no MPI host file) starts one process that would train
    alone: refuse it with the launch that works."""
    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    asked_for_several = (
        "MASTER_ADDR" in os.environ
    )  # accelerate's simple launcher sets it for num_processes > 1
    if cpu and asked_for_several and not any(name in os.environ for name in _MPI_WORLD_SIZE_VARIABLES):
        raise ValueError(
            "accelerate launch --cpu --num_processes N starts ONE process (Accelerate runs several CPU processes "
            "only through MPI): launch N processes on gloo with `accelerate launch --multi_gpu --num_processes N` "
            "or `torchrun --nproc_per_node N` (both work without a GPU)"
        )


# ---------------------------------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------------------------------
class VaswaniTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with token-budget batches, the paper's learning-rate schedule and label smoothing.

    Label smoothing (eps_ls = `--label_smoothing_factor`, 0.1, §5.4) is the recipe's, applied as transformers'
    `compute_loss_func` by `label_smoothed_loss`: the smoothed cross-entropy in float32 with one (N, V) buffer
    (`kernels_vaswani.label_smoothed_cross_entropy`), exact under gradient accumulation. The Trainer's own smoother,
    which would hold the logits of the whole batch in memory a second time, stays off. In bf16/fp16 CPU training the
    output projection runs inside that loss, so that the logits are never held (`compute_loss`, `--fused_output_loss`).
    The model's own loss (`model(labels=...)`) is the plain cross-entropy, and so is `eval_loss` when evaluation
    generates (`predict_with_generate`, as in the recipe): `Seq2SeqTrainer` then takes the model's loss.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._train_sampler = None
        self.add_callback(TrainingClock())
        if self._autocast_dtype is not None:
            self.add_callback(_AutocastInTheTrainer(self))
        minutes = getattr(self.args, "max_train_minutes", None)
        if minutes:
            self.add_callback(TimeBudget(minutes))
        if not self.args.disable_tqdm and self.pop_callback(ProgressCallback) is not None:
            self.add_callback(RunProgress(minutes))
        self._owns_loss = False
        if self.args.label_smoothing_factor and self.compute_loss_func is None:
            self.compute_loss_func = partial(label_smoothed_loss, epsilon=self.args.label_smoothing_factor)
            self.label_smoother = None
            self._owns_loss = True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """transformers' `compute_loss`, except in the training steps that `fuses_output_loss` picks: there the
        decoder's output goes to `fused_output_loss` (the output projection and the label-smoothed loss in one
        kernel) instead of through the model's logits to `label_smoothed_loss`. Same loss, same normalisation."""
        if return_outputs or not self.fuses_output_loss(model, inputs):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return fused_output_loss(model, inputs, self.args.label_smoothing_factor, num_items_in_batch)

    def fuses_output_loss(self, model, inputs) -> bool:
        """Whether this step takes `fused_output_loss`: `--fused_output_loss` (the default), the recipe's own
        label-smoothed loss, a training step of the bare model in one process (not wrapped for DDP, FSDP or PEFT)
        on the CPU, under the trainer's bf16/fp16 autocast (where it is measured faster: BENCHMARKS.md)."""
        from .modeling_vaswani import VaswaniForConditionalGeneration

        return (
            getattr(self.args, "fused_output_loss", False)
            and self._owns_loss
            and "labels" in inputs
            and self.accelerator.num_processes == 1
            and not self.is_fsdp_enabled
            and isinstance(model, VaswaniForConditionalGeneration)
            and model.training
            and model.device.type == "cpu"
            and torch.is_autocast_enabled("cpu")
        )

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        _enable_fsdp_on_cpu(self)
        self._autocast_dtype = None
        self._owns_autocast = False  # set by take_over_autocast
        if self.accelerator.native_amp:  # bf16 or fp16 mixed precision
            self._autocast_dtype = torch.bfloat16 if self.args.bf16 else torch.float16

    def take_over_autocast(self) -> None:
        """Run mixed precision through `autocast_smart_context_manager` instead of Accelerate's forward wrapper.

        Under bf16 or fp16 mixed precision, Accelerate wraps the model's forward in autocast and converts every
        half-precision output to float32: the logits too, (tokens, V), which the loss then reads and differentiates in
        float32 and whose gradient is converted back. At the en->de recipe's shape (8160 x 8000 logits) that costs
        two extra (N, V) float32 tensors per step. Here the wrapper is removed (`extract_model_from_parallel(...,
        keep_fp32_wrapper=False)`, Accelerate's own way to undo it) and the trainer enters the same autocast around
        the loss and around generation in evaluation, so the label-smoothed loss receives the logits in the autocast
        dtype and computes in float32 chunk by chunk (`kernels_vaswani.label_smoothed_cross_entropy`). Weights,
        gradients and Adam's state stay in float32, as before.
        """
        if self._autocast_dtype is None or self._owns_autocast:
            return
        extract_model_from_parallel(self.model_wrapped, keep_fp32_wrapper=False)
        self._owns_autocast = True

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """transformers leaves autocast to Accelerate's forward wrapper; once `take_over_autocast` has removed that
        wrapper, the trainer's loss and evaluation enter torch's autocast here, in the same dtype."""
        if not self._owns_autocast:
            return super().autocast_smart_context_manager(cache_enabled)
        return torch.autocast(
            device_type=self.accelerator.device.type,
            dtype=self._autocast_dtype,
            cache_enabled=cache_enabled,
        )

    def create_optimizer(self, model=None):
        if self.is_fsdp_enabled:
            shard_with_fsdp2(self.model, self.accelerator)
        return super().create_optimizer(model)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Save the model folder (a checkpoint's or the final one) as transformers does, with three differences:
        every file appears whole (written beside the folder, then renamed into it), the folder also carries the
        translation pipeline (`pipeline("translation", model=folder, trust_remote_code=True)` works on it), and
        `training_args.bin` never holds the Hub token."""
        from .saving import add_translation_pipeline

        output_dir = output_dir if output_dir is not None else self.args.output_dir
        token, self.args.hub_token = self.args.hub_token, None
        try:
            if not self.args.should_save:
                return super()._save(output_dir, state_dict=state_dict)
            if self.is_fsdp_enabled and state_dict:
                # A gathered FSDP state dict holds a tied matrix once per name: tie them again, so that it is saved
                # once, as without FSDP.
                for target, source in self.model.get_expanded_tied_weights_keys(all_submodels=True).items():
                    if target in state_dict and source in state_dict:
                        state_dict[target] = state_dict[source]
            building = temporary_sibling(output_dir)
            try:
                super()._save(str(building), state_dict=state_dict)
                if self.is_fsdp_enabled:
                    # transformers copies the source files of the saved class, which FSDP2 has swapped for its own
                    # (`FSDPVaswani...` from torch's package): keep the model's code files only.
                    for stray in building.glob("_fsdp_*.py"):
                        stray.unlink()
                add_translation_pipeline(building)
            except BaseException:
                shutil.rmtree(building, ignore_errors=True)
                raise
            replace_files(building, output_dir)
        finally:
            self.args.hub_token = token

    def token_sampler(self) -> TokenBudgetBatchSampler:
        if self._train_sampler is None:
            columns = self.train_dataset.select_columns(["input_ids", "labels"])
            lengths = [
                max(len(s), len(t)) for s, t in zip(columns["input_ids"], columns["labels"], strict=True)
            ]
            self._train_sampler = TokenBudgetBatchSampler(lengths, self.args.max_tokens, seed=self.args.seed)
            self.add_callback(_EpochSetter(self._train_sampler))
            logger.info(
                "Token-budget batches: %d batches of at most %d tokens per device and epoch",
                len(self._train_sampler),
                self.args.max_tokens,
            )
        return self._train_sampler

    def get_train_dataloader(self) -> DataLoader:
        if getattr(self.args, "max_tokens", None) is None:
            return super().get_train_dataloader()
        dataset = self.train_dataset.select_columns(
            [c for c in MODEL_INPUTS if c in self.train_dataset.column_names]
        )
        loader = DataLoader(
            dataset,
            batch_sampler=self.token_sampler(),
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Generation during evaluation stops at source length + 50 tokens (§6.1) unless a maximum is given."""
        from .generation_vaswani import EXTRA_OUTPUT_TOKENS

        if self.args.predict_with_generate and not prediction_loss_only:
            if not gen_kwargs:
                gen_kwargs = dict(getattr(self, "_gen_kwargs", {}))
            if gen_kwargs.get("max_length") is None and gen_kwargs.get("max_new_tokens") is None:
                gen_kwargs.pop("max_length", None)
                gen_kwargs["max_new_tokens"] = inputs["input_ids"].shape[1] + EXTRA_OUTPUT_TOKENS
        # transformers' Seq2SeqTrainer.prediction_step writes every default into the model's generation config, and
        # checkpoints would save them all: `max_length: 20` among them, so that each later
        # `generate(max_new_tokens=...)` on the saved model warned that both were set. The model keeps its own.
        own = copy.deepcopy(self.model.generation_config)
        try:
            # Generation in evaluation under the trainer's autocast once it has taken autocast over from Accelerate.
            with self.autocast_smart_context_manager():
                return super().prediction_step(
                    model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs
                )
        finally:
            self.model.generation_config = own

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if not getattr(self.args, "paper_lr_schedule", False):
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            d_model = self.model.config.d_model
            budgets = [c for c in self.callback_handler.callbacks if isinstance(c, TimeBudget)]
            self.lr_scheduler = paper_schedule(
                optimizer or self.optimizer,
                d_model,
                int(self.args.warmup_steps),
                cooldown_fraction=getattr(self.args, "lr_cooldown_fraction", 0.0),
                max_steps=num_training_steps,
                budget=budgets[0] if budgets else None,
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler


def _enable_fsdp_on_cpu(trainer) -> None:
    """Accelerate turns its FSDP plugin on for accelerator devices only; torch's FSDP2 also runs on CPU processes
    over gloo (several CPU machines, or tests). With `--fsdp` on such a run, switch the plugin on here."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    plugin_args = trainer.args.fsdp_plugin_args
    if plugin_args is None or state.distributed_type != DistributedType.MULTI_CPU:
        return
    if plugin_args.get("fsdp_version", 2) != 2:
        raise ValueError("FSDP on CPU processes needs FSDP2: drop `version: 1` from --fsdp_config")
    plugin_args = {**plugin_args, "sync_module_states": False}  # no accelerator device to broadcast from
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin_args)
    # Both shared states: each later `AcceleratorState()` copies the process state's distributed type over its own.
    state.distributed_type = PartialState().distributed_type = DistributedType.FSDP
    trainer.is_fsdp_enabled = True
    logger.info("FSDP2 on %d CPU processes (gloo)", state.num_processes)


def shard_with_fsdp2(model: torch.nn.Module, accelerator) -> None:
    """Shard `model` with FSDP2: each encoder and decoder layer is one unit, and the rest (the shared embedding,
    which the encoder, the decoder and the output projection all use, §3.4) is the root unit.

    Accelerate's own FSDP2 wrapping puts the input and output embeddings into a unit of their own, which torch refuses
    for this model: the encoder's and decoder's `embed_tokens` hold the same tied matrix, which would then belong to
    two units. Sharded here first, the model is left as it is by Accelerate (`fsdp2_prepare_model` returns an
    FSDP module unchanged)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if isinstance(model, FSDPModule) or accelerator.state.fsdp_plugin.fsdp_version != 2:
        return
    plugin = accelerator.state.fsdp_plugin
    # Resolve the plugin's wrap policy on the plain model (its layer classes by name; from `_no_split_modules`
    # unless --fsdp_config names others): Accelerate resolves it again on the sharded model, whose classes are renamed.
    plugin.set_auto_wrap_policy(model)
    layer_names = set(plugin.transformer_cls_names_to_wrap or model._no_split_modules or ())
    options = {
        "reshard_after_forward": plugin.reshard_after_forward,
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
    }
    for module in [m for m in model.modules() if type(m).__name__ in layer_names]:
        fully_shard(module, **options)
    fully_shard(model, **{k: v for k, v in options.items() if k != "reshard_after_forward"})


def label_smoothed_loss(outputs, labels: torch.Tensor, num_items_in_batch=None, epsilon: float = 0.1):
    """The training loss of §5.4 as a `compute_loss_func`: label-smoothed cross-entropy of the model's logits against
    `labels` (-100 ignored), the mean over target tokens or the sum divided by `num_items_in_batch` (all target tokens
    of a gradient-accumulation step)."""
    from .kernels_vaswani import label_smoothed_cross_entropy

    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    total = label_smoothed_cross_entropy(logits, labels, epsilon)
    return _per_target_token(total, labels, num_items_in_batch)


def fused_output_loss(model, inputs: dict, epsilon: float, num_items_in_batch=None) -> torch.Tensor:
    """`label_smoothed_loss(model(**inputs without labels), labels, ...)` without the logits: the decoder's last
    hidden states (`model.base_model`) and the output projection's weights go to
    `kernels_vaswani.linear_label_smoothed_cross_entropy`, which never holds the (tokens, V) logits. The mean over
    target tokens, or the sum divided by `num_items_in_batch`."""
    from .kernels_vaswani import linear_label_smoothed_cross_entropy

    inputs = dict(inputs)
    labels = inputs.pop("labels")
    if inputs.get("decoder_input_ids") is None and inputs.get("decoder_inputs_embeds") is None:
        inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels)
    hidden = model.base_model(**inputs, use_cache=False).last_hidden_state
    head = model.get_output_embeddings()
    total = linear_label_smoothed_cross_entropy(hidden, head.weight, head.bias, labels, epsilon)
    return _per_target_token(total, labels, num_items_in_batch)


def _per_target_token(total: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum().clamp(min=1)
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def bleu_metric_fn(tokenizer, references: Sequence[str]) -> Callable:
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`: sacreBLEU and chrF of the decoded
    predictions against the raw reference text, case-insensitive if the tokenizer lowercases (its model writes
    lowercase only). Under DDP the gathered predictions can carry padded duplicates at the end; only the first
    `len(references)` rows, which are the dataset's rows in order, are scored."""
    from .metrics import compute_bleu
    from .tokenization import lowercases

    lowercase = lowercases(tokenizer)

    def compute(eval_prediction) -> dict:
        predictions = eval_prediction.predictions
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        predictions = np.where(predictions < 0, tokenizer.pad_token_id, predictions)[: len(references)]
        texts = [t.strip() for t in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        scores = compute_bleu(texts, list(references), lowercase=lowercase)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return compute


# ---------------------------------------------------------------------------------------------------------------------
# Nothing lost: checkpoints are checked before a run resumes from them
# ---------------------------------------------------------------------------------------------------------------------
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders of a run, oldest first (by step number)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))
    ]
    return [p for _, p in sorted(found)]


# What transformers' Trainer reads from a checkpoint when it resumes (all with `torch.load(weights_only=True)`), and
# the JSON files it parses. Nothing else in the folder is opened, so a file dropped into a checkpoint is never run.
TORCH_STATE_FILES = (
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
    "rng_state.pth",
    "rng_state_*.pth",
    # FSDP runs (Accelerate's full-state-dict files)
    "pytorch_model_fsdp*.bin",
    "optimizer*.bin",
)
JSON_FILES = ("config.json", "generation_config.json", "trainer_state.json")


def _check_torch_archive(path: Path) -> None:
    """Check a `torch.save` file without unpickling it: it is a zip archive (torch's format) whose every member's
    CRC matches, which a file cut short or damaged is not."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ValueError(f"Checkpoint file {path} is corrupt or truncated: {error}") from None
    if bad is not None:
        raise ValueError(f"Checkpoint file {path} is corrupt: member {bad} fails its CRC check")


def verify_checkpoint(folder: str | os.PathLike) -> None:
    """Raise `ValueError` naming the file when a checkpoint is incomplete, corrupt or truncated.

    Reads the safetensors headers and tensors, parses the JSON files, and checks the archives of the files the
    Trainer loads on resume (`TORCH_STATE_FILES`) without unpickling anything.
    """
    from .averaging import check_safetensors

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Checkpoint folder {folder} does not exist.")
    for required in ("config.json", "trainer_state.json"):
        if not (folder / required).is_file():
            raise ValueError(f"Checkpoint {folder} is incomplete: {folder / required} is missing.")
    for name in JSON_FILES:
        path = folder / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as error:
                raise ValueError(f"Checkpoint file {path} is corrupt or truncated: {error}") from None
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"Checkpoint {folder} is incomplete: no *.safetensors weights file.")
    for path in weights:
        try:
            check_safetensors(path)
        except ValueError as error:
            raise ValueError(f"Checkpoint file {error}") from None
    for pattern in TORCH_STATE_FILES:
        for path in sorted(folder.glob(pattern)):
            _check_torch_archive(path)


def checkpoint_step(folder: str | os.PathLike) -> int:
    """The global step a checkpoint was saved at, from its `trainer_state.json`."""
    path = Path(folder) / "trainer_state.json"
    try:
        return int(json.loads(path.read_text(encoding="utf-8"))["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"Cannot read the step of {path}: {error}") from None


def resolve_resume_checkpoint(resume: str | bool | None, output_dir: str | os.PathLike) -> str | None:
    """The checkpoint to resume from: an explicit folder (verified; an error names a bad file) or, for
    `True`/"last", the newest checkpoint in `output_dir` that verifies (a checkpoint cut short by a kill while it
    was written is skipped with a warning, so the run loses at most one checkpoint interval)."""
    if resume in (None, False, "", "False", "false", "no"):
        return None
    if resume in (True, "True", "true", "last", "yes"):
        for candidate in reversed(checkpoints(output_dir)):
            try:
                verify_checkpoint(candidate)
            except ValueError as error:
                logger.warning("Skipping checkpoint %s: %s", candidate, error)
                continue
            return str(candidate)
        logger.warning("No usable checkpoint in %s: starting from scratch.", output_dir)
        return None
    verify_checkpoint(resume)
    return str(resume)
