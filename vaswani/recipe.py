"""From raw parallel text to a trained model: the steps behind `scripts/train.py`.

1. load the corpus through `datasets` (`vaswani.data`), 2. train or load the joint BPE tokenizer
(`vaswani.tokenization`), 3. tokenize and filter, 4. build the model from a preset plus any config field given on the
command line, 5. train with `VaswaniTrainer` (`vaswani.training`), resuming from the last good checkpoint when asked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DataCollatorForSeq2Seq, set_seed

from .configuration_vaswani import VaswaniConfig
from .data import iter_text, load_parallel_dataset, tokenize_dataset
from .modeling_vaswani import VaswaniForConditionalGeneration
from .tokenization import load_tokenizers, save_tokenizers, train_bpe_tokenizer, train_separate_tokenizers
from .training import PaperTrainingArguments, VaswaniTrainer, bleu_metric_fn, resolve_resume_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class DataArguments:
    data: str = field(
        default="bentrevett/multi30k",
        metadata={
            "help": "A directory of {split}.{lang}[.gz] files (e.g. ../shared/data/multi30k), JSON lines, or a Hub "
            "dataset id (a `translation` column as in wmt14, or one column per language as in bentrevett/multi30k)."
        },
    )
    data_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration, e.g. de-en."})
    source_lang: str = field(default="de", metadata={"help": "Source language code."})
    target_lang: str = field(default="en", metadata={"help": "Target language code."})
    train_split: str = field(default="train", metadata={"help": "Name of the training split in the source."})
    validation_split: str = field(
        default="validation", metadata={"help": "Validation split name in the source (multi30k files: val)."}
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "A trained tokenizer folder; None trains one into output_dir/tokenizer."},
    )
    vocab_size: int = field(default=37000, metadata={"help": "BPE vocabulary size when training one (§5.1)."})
    separate_vocabularies: bool = field(
        default=False, metadata={"help": "Separate source and target vocabularies (not the paper)."}
    )
    max_length: int = field(
        default=256, metadata={"help": "Drop training pairs with a side longer than this."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N training pairs."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Evaluate on the first N pairs only."}
    )
    num_proc: int | None = field(default=None, metadata={"help": "Processes for tokenization."})


@dataclass
class ModelArguments:
    preset: str = field(default="base", metadata={"help": "base or big (Table 3), or small (CPU)."})
    init_from: str | None = field(default=None, metadata={"help": "Start from this model folder instead."})


def parse_config_overrides(remaining: list[str]) -> dict:
    """`--d_model 256 --dropout 0.3 ...` (any `VaswaniConfig` field) into a dict; unknown flags are an error."""
    names = {f.name for f in dataclasses.fields(VaswaniConfig)}
    overrides, i = {}, 0
    while i < len(remaining):
        flag = remaining[i]
        key = flag[2:].replace("-", "_") if flag.startswith("--") else None
        if key is None or key not in names:
            raise ValueError(f"Unknown argument {flag!r}: neither a training flag nor a VaswaniConfig field.")
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(remaining):
            value = remaining[i + 1]
            i += 2
        else:
            raise ValueError(f"{flag} needs a value.")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = {"True": True, "False": False, "None": None}.get(value, value)
    return overrides


def prepare_tokenizers(data_args: DataArguments, raw, output_dir: str, is_main_process: bool = True):
    """The given tokenizer, else the one a previous (resumed) run trained, else a new one (main process only;
    the others load what it saved)."""
    saved = Path(output_dir) / "tokenizer"
    if data_args.tokenizer:
        return load_tokenizers(data_args.tokenizer)
    if saved.is_dir() or not is_main_process:
        return load_tokenizers(saved)
    train = raw["train"]
    src, tgt = data_args.source_lang, data_args.target_lang
    if data_args.separate_vocabularies:
        source, target = train_separate_tokenizers(
            iter_text(train, [src]), iter_text(train, [tgt]), vocab_size=data_args.vocab_size
        )
    else:
        source = target = train_bpe_tokenizer(iter_text(train, [src, tgt]), vocab_size=data_args.vocab_size)
    save_tokenizers(source, target, Path(output_dir) / "tokenizer")
    return source, target


def build_model(model_args: ModelArguments, overrides: dict, source_tok, target_tok, training_args):
    if model_args.init_from:
        return VaswaniForConditionalGeneration.from_pretrained(model_args.init_from, **overrides)
    joint = source_tok is target_tok
    fields = dict(
        vocab_size=len(source_tok),
        decoder_vocab_size=len(target_tok),
        share_encoder_decoder_embeddings=joint,
        label_smoothing=training_args.label_smoothing_factor,
    )
    fields.update(overrides)
    config = VaswaniConfig.from_preset(model_args.preset, **fields)
    return VaswaniForConditionalGeneration(config)


def train_main(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: PaperTrainingArguments,
    overrides: dict,
) -> VaswaniTrainer:
    """Run the whole training; returns the trainer (its model is the final one, the checkpoints are on disk)."""
    started = time.time()
    splits = {"train": data_args.train_split, "validation": data_args.validation_split}
    raw = load_parallel_dataset(
        data_args.data,
        data_args.source_lang,
        data_args.target_lang,
        splits=splits,
        config_name=data_args.data_config,
    )
    if data_args.max_train_samples:
        raw["train"] = raw["train"].select(range(min(data_args.max_train_samples, len(raw["train"]))))
    if data_args.max_eval_samples:
        raw["validation"] = raw["validation"].select(
            range(min(data_args.max_eval_samples, len(raw["validation"])))
        )
    with training_args.main_process_first(desc="tokenizer"):
        source_tok, target_tok = prepare_tokenizers(
            data_args, raw, training_args.output_dir, is_main_process=training_args.process_index == 0
        )
    with training_args.main_process_first(desc="tokenization"):
        tokenized, dropped = tokenize_dataset(
            raw,
            source_tok,
            target_tok,
            data_args.source_lang,
            data_args.target_lang,
            max_length=data_args.max_length,
            num_proc=data_args.num_proc,
        )
    logger.info("Pairs dropped by filtering: %s", dropped)

    set_seed(training_args.seed)  # the initial weights are part of the run: the same on every rank and rerun
    model = build_model(model_args, overrides, source_tok, target_tok, training_args)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "Model: %s preset, %d parameters, config %s", model_args.preset, n_params, model.config.to_diff_dict()
    )

    collator = DataCollatorForSeq2Seq(source_tok, model=model, label_pad_token_id=-100)
    trainer = VaswaniTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"],
        data_collator=collator,
        processing_class=target_tok,
        compute_metrics=bleu_metric_fn(target_tok, raw["validation"][data_args.target_lang]),
    )
    resume = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    result = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()  # the final weights + tokenizer in output_dir
    if trainer.is_world_process_zero():
        summary = {
            "preset": model_args.preset,
            "parameters": n_params,
            "global_step": trainer.state.global_step,
            "train_runtime_s": result.metrics.get("train_runtime"),
            "wall_time_s": time.time() - started,
            "max_tokens_per_device": training_args.max_tokens,
            "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
            "world_size": training_args.world_size,
            "warmup_steps": training_args.warmup_steps,
            "learning_rate_multiplier": training_args.learning_rate,
            "label_smoothing": model.config.label_smoothing,
            "dropped_pairs": dropped,
            "hardware": _hardware(),
            "source_lang": data_args.source_lang,
            "target_lang": data_args.target_lang,
            "data": data_args.data,
        }
        Path(training_args.output_dir, "training_summary.json").write_text(json.dumps(summary, indent=2))
    return trainer


def _hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"CPU ({os.cpu_count()} cores, torch {torch.__version__})"
