"""The training summary (`training_summary.json`): what was trained, on what, for how long and how; the model card
reports it (`vaswani.publishing.model_card.TrainingSummary`); and what a run says of its batches and learning rate
before it starts (`log_recipe`)."""

import logging
import os
import time

import torch

from .callbacks import TrainingClock

logger = logging.getLogger(__name__)


def training_summary(trainer, model_args, data_args, parameters, dropped, started):
    """The summary of the run `trainer` has trained (just now, or before: a finished run resumed) into a model of
    `parameters` parameters; `dropped`: the pairs filtering dropped, `started`: the run's start
    (`time.time()`)."""
    args = trainer.args
    processes = args.world_size
    schedule = args.lr_scheduler_type
    if args.paper_lr_schedule:
        schedule = "§5.3 inverse square root with linear warm-up"
        if args.lr_cooldown_fraction:
            schedule += f", falling linearly to 0 over the last {args.lr_cooldown_fraction:.0%} of the run"
    hardware = f"CPU ({os.cpu_count()} cores{f', {processes} processes' if processes > 1 else ''}, torch {torch.__version__})"
    if torch.cuda.is_available():
        hardware = f"{processes} x {torch.cuda.get_device_name(0)}"
    # seconds of training over the whole run (a killed and resumed run included)
    clock = next(c for c in trainer.callback_handler.callbacks if isinstance(c, TrainingClock))
    return {
        # the keys of vaswani.publishing.model_card.TrainingSummary, reported on the model card
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "dataset": data_args.source,
        "preset": None if model_args.model_name_or_path else model_args.preset,
        "steps": trainer.state.global_step,
        "batch_tokens": (args.max_tokens or 0) * args.gradient_accumulation_steps * processes or None,
        "schedule": schedule,
        "warmup_steps": args.warmup_steps,
        "peak_learning_rate": args.learning_rate,  # the peak itself, as in transformers
        "hardware": hardware,
        "precision": "bf16 autocast" if args.bf16 else "fp16 autocast" if args.fp16 else "fp32",
        "train_runtime": clock.seconds,
        # more detail
        "fine_tuned_from": model_args.model_name_or_path,
        "parameters": parameters,
        "wall_time_s": time.time() - started,
        "max_tokens_per_device": args.max_tokens,
        "sentences_per_device": args.max_sentences if args.max_tokens else args.per_device_train_batch_size,
        "learning_rate_constant": args.learning_rate_constant,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "label_smoothing": args.label_smoothing_factor,
        "max_grad_norm": args.max_grad_norm,  # 0: no clipping, as in the paper
        "dropped_pairs": dropped,
    }


def log_recipe(args):
    """Say how the run batches and which learning rate it trains with (`WarmupEnd` warns when the run ends inside
    the §5.3 warm-up)."""
    batches = f"token-budget batches of at most {args.max_tokens} tokens per device (--max_tokens, §5.1)"
    if not args.max_tokens:
        batches = f"batches of {args.per_device_train_batch_size} sentences per device (--per_device_train_batch_size)"
    elif args.max_sentences:
        batches = (
            f"token-budget batches of at most {args.max_tokens} tokens and {args.max_sentences} sentences per "
            "device (--max_tokens, --per_device_train_batch_size)"
        )
    logger.info("Batches: %s", batches)
    if not args.paper_lr_schedule:
        logger.info(
            "Learning rate: %.3g, schedule %s (--paper_lr_schedule false)",
            args.learning_rate,
            args.lr_scheduler_type.value,  # a transformers `SchedulerType`
        )
    else:
        logger.info(
            "Learning rate: the §5.3 schedule, rising to its peak %.3g at step %d (--warmup_steps), then falling as "
            "step^-0.5",
            args.learning_rate,
            int(args.warmup_steps),
        )
