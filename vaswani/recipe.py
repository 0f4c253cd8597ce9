"""From raw parallel text to a trained model: the steps behind `scripts/train.py`.

1. load the corpus through `datasets` (`vaswani.data`), 2. train or load the joint BPE tokenizer
(`vaswani.tokenization`), 3. tokenize and filter, 4. build the model from a preset plus any config field given on the
command line, 5. train with `VaswaniTrainer` (`vaswani.training`), resuming from the last good checkpoint when asked.
"""

from __future__ import annotations

import inspect
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
from .generation_vaswani import (
    LENGTH_PENALTY_FORMS,
    PAPER_LENGTH_PENALTY,
    PAPER_LENGTH_PENALTY_FORM,
    PAPER_NUM_BEAMS,
    paper_decoding,
)
from .modeling_vaswani import VaswaniForConditionalGeneration
from .tokenization import (
    load_tokenizers,
    lowercases,
    save_tokenizers,
    train_bpe_tokenizer,
    train_separate_tokenizers,
)
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
    lowercase: bool = field(
        default=False,
        metadata={
            "help": "Train the BPE on lowercased text, with a tokenizer that lowercases what it encodes, so the "
            "model reads and writes lowercase (not the paper; the form of published Multi30k results)."
        },
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
class FinishArguments:
    """What happens after training (§6.1): checkpoint averaging, beam search on the test set, BLEU, pictures."""

    average_last: int = field(
        default=0,
        metadata={"help": "Average the last N checkpoints (§6.1: 5 for base, 20 for big); 0: none."},
    )
    test_split: str | None = field(
        default=None, metadata={"help": "Translate this split with beam search and print BLEU (e.g. test)."}
    )
    num_beams: int = field(
        default=PAPER_NUM_BEAMS, metadata={"help": "Beam size for the test set (§6.1: 4)."}
    )
    length_penalty: float = field(
        default=PAPER_LENGTH_PENALTY, metadata={"help": "Length penalty alpha (§6.1: 0.6)."}
    )
    length_penalty_form: str = field(
        default=PAPER_LENGTH_PENALTY_FORM,
        metadata={
            "help": "gnmt: ((5 + |Y|) / 6) ** alpha, the form §6.1 cites; power: transformers' |Y| ** alpha.",
            "choices": list(LENGTH_PENALTY_FORMS),
        },
    )
    translate_batch_size: int = field(default=64, metadata={"help": "Sentences per generate() call."})
    plots: bool = field(default=True, metadata={"help": "Draw learning curves and an attention map."})


@dataclass
class ModelArguments:
    preset: str = field(default="base", metadata={"help": "base or big (Table 3), or small (CPU)."})
    init_from: str | None = field(default=None, metadata={"help": "Start from this model folder instead."})


def parse_config_overrides(remaining: list[str]) -> dict:
    """`--d_model 256 --dropout 0.3 ...` (any `VaswaniConfig` field) into a dict; unknown flags are an error."""
    names = set(inspect.signature(VaswaniConfig.__init__).parameters) - {"self", "kwargs"}
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
    if data_args.tokenizer or saved.is_dir() or not is_main_process:
        path = data_args.tokenizer or saved
        source, target = load_tokenizers(path)
        if {lowercases(source), lowercases(target)} != {data_args.lowercase}:
            raise ValueError(
                f"--lowercase is {data_args.lowercase} but the tokenizer in {str(path)!r} "
                f"{'keeps case' if data_args.lowercase else 'lowercases'}: train a new one, or match the flag."
            )
        return source, target
    train = raw["train"]
    src, tgt = data_args.source_lang, data_args.target_lang
    if data_args.separate_vocabularies:
        source, target = train_separate_tokenizers(
            iter_text(train, [src]),
            iter_text(train, [tgt]),
            vocab_size=data_args.vocab_size,
            lowercase=data_args.lowercase,
        )
    else:
        source = target = train_bpe_tokenizer(
            iter_text(train, [src, tgt]), vocab_size=data_args.vocab_size, lowercase=data_args.lowercase
        )
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
    )
    fields.update(overrides)
    config = VaswaniConfig.from_preset(model_args.preset, **fields)
    model = VaswaniForConditionalGeneration(config)
    paper_decoding(model.generation_config)  # §6.1's decoding, saved with every checkpoint
    return model


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

    # The Trainer would push every checkpoint with a default card; `finish` publishes the final model once.
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
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
    # The Trainer turns the cache off while training; the saved model is for use.
    trainer.model.config.use_cache = True
    trainer.save_model()  # the final weights in output_dir
    training_args.push_to_hub = push_to_hub
    if trainer.is_world_process_zero():
        save_tokenizers(source_tok, target_tok, training_args.output_dir)
        tokens_per_step = (
            (training_args.max_tokens or 0)
            * training_args.gradient_accumulation_steps
            * max(training_args.world_size, 1)
        )
        summary = {
            # the keys of vaswani.hub.TrainingSummary, reported on the model card
            "source_lang": data_args.source_lang,
            "target_lang": data_args.target_lang,
            "dataset": data_args.data,
            "preset": model_args.preset,
            "steps": trainer.state.global_step,
            "batch_tokens": tokens_per_step or None,
            "schedule": "§5.3 inverse square root with linear warm-up"
            if training_args.paper_lr_schedule
            else training_args.lr_scheduler_type,
            "warmup_steps": training_args.warmup_steps,
            "peak_learning_rate": training_args.learning_rate
            * (model.config.d_model * training_args.warmup_steps) ** -0.5
            if training_args.paper_lr_schedule
            else training_args.learning_rate,
            "hardware": _hardware(training_args.world_size),
            "precision": _precision(training_args),
            "train_runtime": result.metrics.get("train_runtime"),
            # more detail
            "parameters": n_params,
            "wall_time_s": time.time() - started,
            "max_tokens_per_device": training_args.max_tokens,
            "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
            "label_smoothing": training_args.label_smoothing_factor,
            "max_grad_norm": training_args.max_grad_norm,  # 0: no clipping, as in the paper
            "dropped_pairs": dropped,
        }
        Path(training_args.output_dir, "training_summary.json").write_text(json.dumps(summary, indent=2))
    return trainer


def _precision(training_args) -> str:
    if training_args.bf16:
        return "bf16 autocast"
    return "fp16 autocast" if training_args.fp16 else "fp32"


def _hardware(world_size: int = 1) -> str:
    if torch.cuda.is_available():
        return f"{max(world_size, 1)} x {torch.cuda.get_device_name(0)}"
    processes = f", {world_size} processes" if world_size > 1 else ""
    return f"CPU ({os.cpu_count()} cores{processes}, torch {torch.__version__})"


def finish(trainer, data_args: DataArguments, finish_args: FinishArguments) -> dict | None:
    """§6.1 after training, on the main process: average the last checkpoints, translate the test split with beam
    search, score it (sacreBLEU, chrF, and BLEU comparable to published Multi30k figures), draw the pictures, and
    publish if `--push_to_hub`. Returns the test scores (or None without a test split)."""
    from .averaging import average_checkpoints
    from .training import checkpoints

    args = trainer.args
    if not trainer.is_world_process_zero():
        return None
    output_dir = Path(args.output_dir)
    final_dir = output_dir
    if finish_args.average_last > 0:
        own = [c for c in checkpoints(output_dir) if int(c.name.split("-")[1]) <= trainer.state.global_step]
        chosen = own[-finish_args.average_last :]
        if len(chosen) < finish_args.average_last:
            logger.warning(
                "Only %d checkpoints to average (asked for %d)", len(chosen), finish_args.average_last
            )
        final_dir = average_checkpoints(chosen, output_dir / "averaged")
        save_tokenizers(*load_tokenizers(output_dir), final_dir)
    if finish_args.plots:
        from .plotting import plot_learning_curves

        plot_learning_curves(trainer.state.log_history, output_dir / "learning_curves.png")
    scores = None
    if finish_args.test_split:
        scores = evaluate_test_split(final_dir, data_args, finish_args, plot_attention=finish_args.plots)
        (output_dir / "test_results.json").write_text(json.dumps(scores, indent=2))
        logger.info("Test scores written to %s", output_dir / "test_results.json")
    if args.push_to_hub:
        from .hub import publish

        published = publish(
            final_dir,
            repo_id=args.hub_model_id or output_dir.name,
            results=output_dir / "test_results.json" if scores else None,
            summary=output_dir / "training_summary.json",
            private=args.hub_private_repo,
            token=args.hub_token,
            revision=getattr(args, "hub_revision", None),
        )
        logger.info("Published: %s", published)
    return scores


def evaluate_test_split(
    model_dir, data_args: DataArguments, finish_args: FinishArguments, plot_attention: bool = False
) -> dict:
    """Beam-search translation of the test split (§6.1) and its scores; with `plot_attention`, the attention maps
    of the first test pair (source and its translation) as `attention_{encoder,decoder,cross}.png`."""
    from .metrics import reported_scores
    from .translation import load_translation_model, translate

    test = load_parallel_dataset(
        data_args.data,
        data_args.source_lang,
        data_args.target_lang,
        splits={"test": finish_args.test_split},
        config_name=data_args.data_config,
    )["test"]
    model, source_tok, target_tok = load_translation_model(model_dir)
    hypotheses = translate(
        test[data_args.source_lang],
        model,
        source_tok,
        target_tok,
        batch_size=finish_args.translate_batch_size,
        num_beams=finish_args.num_beams,
        length_penalty=finish_args.length_penalty,
        length_penalty_form=finish_args.length_penalty_form,
    )
    references = test[data_args.target_lang]
    Path(model_dir, f"{finish_args.test_split}.hyp.{data_args.target_lang}").write_text(
        "\n".join(hypotheses) + "\n"
    )
    if plot_attention:
        from .plotting import attention_maps, load_attention_model, plot_attention_maps

        eager, src_tok, tgt_tok = load_attention_model(model_dir)
        maps = attention_maps(eager, src_tok, test[data_args.source_lang][0], hypotheses[0], tgt_tok)
        plot_attention_maps(maps, model_dir, prefix="attention")
    return {
        **reported_scores(hypotheses, references, data_args.target_lang, lowercase=lowercases(target_tok)),
        "dataset": data_args.data,
        "split": finish_args.test_split,
        "num_beams": finish_args.num_beams,
        "length_penalty": finish_args.length_penalty,
        "length_penalty_form": finish_args.length_penalty_form,
        "model": str(model_dir),
    }
