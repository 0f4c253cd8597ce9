"""The training summary (`training_summary.json`): what was trained, on what, for how long and how; the model card
reports it (`vaswani.publishing.model_card.TrainingSummary`)."""

from __future__ import annotations

import os
import time

import torch

from .arguments import DataArguments, ModelArguments, PaperTrainingArguments
from .callbacks import TrainingClock


def training_summary(
    trainer,
    result,
    model_args: ModelArguments,
    data_args: DataArguments,
    parameters: int,
    dropped: dict,
    started: float,
) -> dict:
    """The summary of the run `trainer` has just trained (`result`: its `TrainOutput`) into a model of `parameters`
    parameters; `dropped`: the pairs filtering dropped, `started`: the run's start (`time.time()`)."""
    training_args: PaperTrainingArguments = trainer.args
    tokens_per_step = (
        (training_args.max_tokens or 0)
        * training_args.gradient_accumulation_steps
        * max(training_args.world_size, 1)
    )
    return {
        # the keys of vaswani.publishing.model_card.TrainingSummary, reported on the model card
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "dataset": data_args.source,
        "preset": model_args.preset if not model_args.model_name_or_path else None,
        "steps": trainer.state.global_step,
        "batch_tokens": tokens_per_step or None,
        "schedule": _schedule_name(training_args),
        "warmup_steps": training_args.warmup_steps,
        "peak_learning_rate": training_args.learning_rate,  # the peak itself, as in transformers
        "hardware": _hardware(training_args.world_size),
        "precision": _precision(training_args),
        "train_runtime": _training_clock(trainer, result),  # seconds, over every process of a resumed run
        # more detail
        "fine_tuned_from": model_args.model_name_or_path,
        "parameters": parameters,
        "wall_time_s": time.time() - started,
        "max_tokens_per_device": training_args.max_tokens,
        "sentences_per_device": training_args.max_sentences
        if training_args.max_tokens is not None
        else training_args.per_device_train_batch_size,
        "learning_rate_constant": training_args.learning_rate_constant,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "label_smoothing": training_args.label_smoothing_factor,
        "max_grad_norm": training_args.max_grad_norm,  # 0: no clipping, as in the paper
        "dropped_pairs": dropped,
    }


def _schedule_name(training_args) -> str:
    if not training_args.paper_lr_schedule:
        return training_args.lr_scheduler_type
    name = "§5.3 inverse square root with linear warm-up"
    if training_args.lr_cooldown_fraction:
        name += f", falling linearly to 0 over the last {training_args.lr_cooldown_fraction:.0%} of the run"
    return name


def _training_clock(trainer, result) -> float | None:
    """Seconds of training over the whole run (a killed and resumed run included)."""
    clocks = [
        callback for callback in trainer.callback_handler.callbacks if isinstance(callback, TrainingClock)
    ]
    return clocks[0].seconds if clocks else result.metrics.get("train_runtime")


def _precision(training_args) -> str:
    if training_args.bf16:
        return "bf16 autocast"
    return "fp16 autocast" if training_args.fp16 else "fp32"


def _hardware(world_size: int = 1) -> str:
    if torch.cuda.is_available():
        return f"{max(world_size, 1)} x {torch.cuda.get_device_name(0)}"
    processes = f", {world_size} processes" if world_size > 1 else ""
    return f"CPU ({os.cpu_count()} cores{processes}, torch {torch.__version__})"
