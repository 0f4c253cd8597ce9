"""From raw parallel text to a trained model: the steps behind `vaswani-train` (`scripts/train.py`).

0. check every flag before any data is read (`check_run`): the model configuration, the data sources, the output
   folder (a folder belongs to one run), the checkpoint to resume from;
1. load the corpus through `datasets` (`vaswani.data`), 2. train or load the joint BPE tokenizer
(`vaswani.tokenization`), 3. tokenize and filter, 4. build the model from a preset plus any config field given on the
command line (or load one to fine-tune), 5. train with `VaswaniTrainer` (`vaswani.training`), resuming from the last
good checkpoint when asked; 6. `finish`: average (the last N checkpoints, or the best of several N on the validation
split), translate the test split, score, draw, publish (§6.1).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
import json
import logging
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import DataCollatorForSeq2Seq, set_seed

from .configuration_vaswani import (
    ACTIVATIONS,
    POSITION_EMBEDDING_TYPES,
    PRESETS,
    SINUSOID_FREQUENCIES,
    SINUSOID_LAYOUTS,
    VaswaniConfig,
)
from .data import iter_text, load_parallel_dataset, load_parallel_file, parallel_file_paths, tokenize_dataset
from .errors import UsageError
from .fileio import atomic_folder, replace_files, temporary_sibling, write_json
from .generation_vaswani import (
    LENGTH_PENALTY_FORMS,
    PAPER_LENGTH_PENALTY,
    PAPER_LENGTH_PENALTY_FORM,
    PAPER_NUM_BEAMS,
    paper_decoding,
)
from .kernels_vaswani import FAST_ATTENTION
from .modeling_vaswani import VaswaniForConditionalGeneration
from .tokenization import (
    load_tokenizers,
    lowercases,
    save_tokenizers,
    train_bpe_tokenizer,
    train_separate_tokenizers,
)
from .training import (
    PaperTrainingArguments,
    TrainingClock,
    VaswaniTrainer,
    bleu_metric_fn,
    checkpoint_step,
    resolve_resume_checkpoint,
)

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


@dataclass
class DataArguments:
    """Where the parallel text comes from, the languages, and the tokenizer (the flags of transformers'
    `run_translation.py` where the meaning is the same)."""

    _argument_group_name = "data"

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "A Hub dataset (a `translation` column as in wmt14, or one column per language as in "
            "bentrevett/multi30k), or a local folder of {split}.{lang}[.gz] text files, JSON lines or save_to_disk."
        },
    )
    dataset_config_name: str | None = field(
        default=None, metadata={"help": "The Hub dataset's configuration, e.g. de-en for wmt14."}
    )
    train_file: str | None = field(
        default=None,
        metadata={
            "help": "Training pairs from files: a JSON-lines file, or the prefix P of the text files P.<source_lang> "
            "and P.<target_lang> (.gz allowed). Instead of, or over, --dataset_name's train split."
        },
    )
    validation_file: str | None = field(
        default=None, metadata={"help": "Validation pairs from files, as --train_file."}
    )
    test_file: str | None = field(
        default=None, metadata={"help": "Test pairs from files, as --train_file (translated after training)."}
    )
    source_lang: str = field(default="de", metadata={"help": "Source language code."})
    target_lang: str = field(default="en", metadata={"help": "Target language code."})
    train_split: str = field(
        default="train", metadata={"help": "Name of the training split of --dataset_name."}
    )
    validation_split: str = field(
        default="validation", metadata={"help": "Validation split of --dataset_name (multi30k files: val)."}
    )
    test_split: str | None = field(
        default=None,
        metadata={
            "help": "Translate this split of --dataset_name with beam search after training and score it "
            "(e.g. test; multi30k files: test_2016_flickr)."
        },
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "A trained tokenizer folder; default: the --model_name_or_path folder's, else one trained "
            "into <output_dir>/tokenizer."
        },
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
    max_source_length: int = field(
        default=256,
        metadata={
            "help": "Drop training pairs whose source has more tokens than this (nothing is truncated)."
        },
    )
    max_target_length: int | None = field(
        default=None,
        metadata={"help": "Drop training pairs whose target has more tokens (default: --max_source_length)."},
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use only the first N training pairs."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Evaluate on the first N pairs only."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenization."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Cache folder of the datasets library."})

    def __post_init__(self):
        for name in ("source_lang", "target_lang"):
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", getattr(self, name) or ""):
                raise UsageError(
                    f"--{name} must be a language code such as de or en, got {getattr(self, name)!r}"
                )
        if self.source_lang == self.target_lang:
            raise UsageError(
                f"--source_lang and --target_lang are both {self.source_lang!r}: translation needs two languages"
            )
        for name in (
            "vocab_size",
            "max_source_length",
            "max_target_length",
            "max_train_samples",
            "max_eval_samples",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name} must be positive, got {value}")
        if self.preprocessing_num_workers is not None and self.preprocessing_num_workers < 1:
            raise UsageError(
                f"--preprocessing_num_workers must be positive, got {self.preprocessing_num_workers}"
            )

    @property
    def source(self) -> str:
        """What the data is, for the training summary and the model card."""
        return self.dataset_name or self.train_file or "?"


@dataclass
class ModelArguments:
    _argument_group_name = "model"

    preset: str = field(
        default="base",
        metadata={"help": "base or big (Table 3), or small or tiny (CPU).", "choices": sorted(PRESETS)},
    )
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Fine-tune this model (a folder or Hub id) instead of training one from scratch."},
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": f"Attention kernel: eager, sdpa, {FAST_ATTENTION}, ... Default: {FAST_ATTENTION} on the CPU "
            "(this package's faster CPU path), sdpa elsewhere."
        },
    )


@dataclass
class FinishArguments:
    """What happens after training (§6.1): checkpoint averaging, beam search on the test set, BLEU, pictures."""

    _argument_group_name = "after training (§6.1)"

    average_last: list[int] = field(
        default_factory=lambda: [0],
        metadata={
            "help": "Average the last N checkpoints (§6.1: 5 for base, 20 for big); 0: none. Several numbers "
            "(--average_last 10 20 40; not the paper, which fixes N) average each, translate the validation split "
            "with the test's beam search, and keep the average of the highest BLEU."
        },
    )
    num_beams: int = field(
        default=PAPER_NUM_BEAMS, metadata={"help": "Beam size for the test set (§6.1: 4)."}
    )
    length_penalty: list[float] = field(
        default_factory=lambda: [PAPER_LENGTH_PENALTY],
        metadata={
            "help": "Length penalty alpha of the test's beam search, saved in the final model's generation config "
            "(§6.1: 0.6). Several values (--length_penalty 0.6 1.0 1.5 2.0; not the paper, which fixes alpha) "
            "each translate the validation split with the final model, and the highest BLEU is kept (the first "
            "given among equals); averages chosen on validation are compared with the first."
        },
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

    def __post_init__(self):
        if isinstance(self.average_last, int):  # FinishArguments(average_last=5) in code
            self.average_last = [self.average_last]
        if not self.average_last or any(n < 0 for n in self.average_last):
            raise UsageError(
                f"--average_last must be 0 (none) or numbers of checkpoints, got {self.average_last}"
            )
        if len(self.average_last) > 1 and 0 in self.average_last:
            raise UsageError(
                f"--average_last {' '.join(map(str, self.average_last))}: 0 (no averaging) cannot be one of "
                "several choices; 1 is the last checkpoint alone"
            )
        for name in ("num_beams", "translate_batch_size"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if isinstance(self.length_penalty, (int, float)):  # FinishArguments(length_penalty=1.0) in code
            self.length_penalty = [float(self.length_penalty)]
        if not self.length_penalty or not all(math.isfinite(a) for a in self.length_penalty):
            raise UsageError(f"--length_penalty must be finite numbers, got {self.length_penalty}")

    @property
    def chooses_average(self) -> bool:
        """Whether several averages are compared on the validation split (`--average_last` with several numbers)."""
        return len(set(self.average_last)) > 1

    @property
    def chooses_length_penalty(self) -> bool:
        """Whether several length penalties are compared on the validation split."""
        return len(set(self.length_penalty)) > 1


# ---------------------------------------------------------------------------------------------------------------------
# Model configuration flags: every VaswaniConfig field that is not fixed by the tokenizer
# ---------------------------------------------------------------------------------------------------------------------
# Set from the tokenizer (sizes, special ids, sharing) or not a modelling choice.
_CONFIG_FIELDS_NOT_FLAGS = {
    "vocab_size",
    "decoder_vocab_size",
    "share_encoder_decoder_embeddings",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "use_cache",
    "is_encoder_decoder",
}
_CONFIG_CHOICES = {
    "activation_function": ACTIVATIONS,
    "position_embedding_type": POSITION_EMBEDDING_TYPES,
    "sinusoid_layout": SINUSOID_LAYOUTS,
    "sinusoid_frequencies": SINUSOID_FREQUENCIES,
}


def _config_field_help() -> dict[str, str]:
    """The first sentence of each field's entry in `VaswaniConfig`'s docstring (its Args section)."""
    helps: dict[str, str] = {}
    lines = (VaswaniConfig.__doc__ or "").splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^ {8}([a-z_]+) \((.*)\):\s*(.*)$", line)
        if not match:
            continue
        text = [match.group(3)]
        for following in lines[i + 1 :]:
            if not following.startswith(" " * 12):
                break
            text.append(following.strip())
        entry = " ".join(part for part in text if part)
        helps[match.group(1)] = entry.split(". ")[0].rstrip(".") + "."
    return helps


def _config_arguments_dataclass() -> type:
    """A dataclass with one optional flag per `VaswaniConfig` field (None: the --preset's or the loaded model's)."""
    helps = _config_field_help()
    fields = []
    for name, parameter in inspect.signature(VaswaniConfig.__init__).parameters.items():
        if name in ("self", "kwargs") or name in _CONFIG_FIELDS_NOT_FLAGS:
            continue
        kind = parameter.annotation
        base = next((t for t in getattr(kind, "__args__", (kind,)) if t is not type(None)), kind)
        metadata = {"help": helps.get(name, "A VaswaniConfig field.")}
        if name in _CONFIG_CHOICES:
            metadata["choices"] = list(_CONFIG_CHOICES[name])
        if base is bool:
            metadata.update(nargs="?", const=True)
        fields.append((name, base | None, field(default=None, metadata=metadata)))
    cls = dataclasses.make_dataclass("ModelConfigArguments", fields)
    cls._argument_group_name = "model configuration (VaswaniConfig fields over the --preset; §3, Table 3)"
    cls.__doc__ = (
        "VaswaniConfig fields set on the command line; None keeps the preset's (or loaded model's) value."
    )
    return cls


ModelConfigArguments = _config_arguments_dataclass()


def config_overrides(config_args) -> dict:
    """The `VaswaniConfig` fields given on the command line."""
    return {k: v for k, v in dataclasses.asdict(config_args).items() if v is not None}


# ---------------------------------------------------------------------------------------------------------------------
# Checks before any data is read
# ---------------------------------------------------------------------------------------------------------------------
# What this tool writes into a run folder; --overwrite_output_dir removes exactly these.
RUN_ENTRIES = (
    "checkpoint-*",
    "averaged",
    "tokenizer",
    "source",
    "target",
    "runs",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "*_vaswani.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "training_args.bin",
    "trainer_state.json",
    "*results.json",
    "training_summary.json",
    "learning_curves.png",
    "attention_*.png",
    "*.hyp.*",
    ".*.tmp*",
    ".*.old-*",
)


def claim_output_dir(output_dir: str | os.PathLike, overwrite: bool, resuming: bool) -> None:
    """Make `output_dir` this run's folder. A folder that holds anything belongs to an earlier run: it is refused
    (`UsageError`) unless the run continues it (`resuming`) or replaces it (`overwrite`: what this tool wrote there is
    deleted first, so no checkpoint, model or score of the earlier run survives next to the new ones)."""
    path = Path(output_dir)
    if overwrite and resuming:
        raise UsageError(
            "--overwrite_output_dir and --resume_from_checkpoint contradict each other: pick one"
        )
    if not path.exists():
        return
    if not path.is_dir():
        raise UsageError(f"--output_dir {path} is a file, not a folder")
    entries = sorted(p.name for p in path.iterdir())
    if not entries or resuming:
        return
    if not overwrite:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise UsageError(
            f"--output_dir {path} already holds a run ({shown}): continue it with --resume_from_checkpoint last, "
            "replace it with --overwrite_output_dir, or choose another --output_dir"
        )
    removed = []
    for entry in sorted(path.iterdir()):
        if any(fnmatch.fnmatch(entry.name, pattern) for pattern in RUN_ENTRIES):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            removed.append(entry.name)
    logger.info(
        "--overwrite_output_dir: removed the earlier run's %s from %s", ", ".join(removed) or "nothing", path
    )
    kept = sorted(set(entries) - set(removed))
    if kept:
        logger.warning("Left in %s (not written by this tool): %s", path, ", ".join(kept))


def default_attention(device: torch.device | str) -> str:
    """The attention kernel of a model that runs on `device`: this package's faster CPU path on the CPU."""
    return FAST_ATTENTION if torch.device(device).type == "cpu" else "sdpa"


def check_model_config(model_args: ModelArguments, data_args: DataArguments, overrides: dict) -> None:
    """Build the configuration the run will train (with the flag's vocabulary size in place of the tokenizer's), so
    that a bad field is reported before any data is read."""
    if model_args.model_name_or_path:
        from transformers import AutoConfig

        from .translation import check_model_path

        try:
            check_model_path(model_args.model_name_or_path)
        except (OSError, ValueError) as error:
            raise UsageError(f"--model_name_or_path: {error}") from None
        try:
            config = AutoConfig.from_pretrained(model_args.model_name_or_path)
        except (OSError, ValueError) as error:
            raise UsageError(f"--model_name_or_path {model_args.model_name_or_path}: {error}") from None
        if not isinstance(config, VaswaniConfig):
            raise UsageError(
                f"--model_name_or_path {model_args.model_name_or_path} holds a {config.model_type!r} model, "
                "not a vaswani one"
            )
        for key, value in overrides.items():
            setattr(config, key, value)
        config.validate_fields()
        return
    VaswaniConfig.from_preset(model_args.preset, vocab_size=max(data_args.vocab_size, 8), **overrides)


def _check_data_sources(data_args: DataArguments, training_args, finish_args: FinishArguments) -> None:
    if not data_args.dataset_name and not data_args.train_file:
        raise UsageError(
            "No training data: give --dataset_name (a Hub dataset or a local folder) or --train_file"
        )
    for split in SPLITS:
        path = getattr(data_args, f"{split}_file")
        if path:
            try:
                parallel_file_paths(path, data_args.source_lang, data_args.target_lang)
            except FileNotFoundError as error:
                raise UsageError(f"--{split}_file: {error}") from None
    if data_args.dataset_name:
        path = Path(data_args.dataset_name)
        looks_local = (
            path.is_absolute()
            or data_args.dataset_name.startswith(".")
            or data_args.dataset_name.count("/") > 1
        )
        if looks_local and not path.exists():
            raise UsageError(f"--dataset_name {data_args.dataset_name}: no such file or folder")
    wants_validation = training_args.eval_strategy != "no" or training_args.do_eval
    if wants_validation and not (data_args.validation_file or data_args.dataset_name):
        raise UsageError(
            "Evaluation needs validation data: give --validation_file (or --dataset_name), or --eval_strategy no"
        )
    if training_args.do_predict and not (data_args.test_split or data_args.test_file):
        data_args.test_split = "test"
    if data_args.test_split and not data_args.dataset_name and not data_args.test_file:
        raise UsageError(f"--test_split {data_args.test_split} needs --dataset_name (or give --test_file)")
    has_validation = data_args.validation_file or data_args.dataset_name
    for flag, chooses in (
        ("--average_last", finish_args.chooses_average),
        ("--length_penalty", finish_args.chooses_length_penalty),
    ):
        if chooses and not has_validation:
            raise UsageError(
                f"{flag} with several numbers chooses among them on validation data: give --validation_file "
                "(or --dataset_name)"
            )


def check_run(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: PaperTrainingArguments,
    finish_args: FinishArguments,
    overrides: dict,
) -> str | None:
    """Every check that needs no data, before any is read; returns the checkpoint to resume from (or None).

    Raises `UsageError` / `ValueError` naming the flag: a model configuration that cannot be built, missing data
    sources or files, an output folder that holds another run, a checkpoint that cannot be resumed from."""
    check_model_config(model_args, data_args, overrides)
    _check_data_sources(data_args, training_args, finish_args)
    if data_args.tokenizer_name and not Path(data_args.tokenizer_name).exists():
        raise UsageError(f"--tokenizer_name {data_args.tokenizer_name}: no such folder")
    resuming = training_args.resume_from_checkpoint not in (None, False, "", "False", "false", "no")
    if training_args.process_index == 0:
        claim_output_dir(training_args.output_dir, training_args.overwrite_output_dir, resuming)
    try:
        return resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(f"--resume_from_checkpoint: {error}") from None


# ---------------------------------------------------------------------------------------------------------------------
# Data and tokenizers
# ---------------------------------------------------------------------------------------------------------------------
def load_split(data_args: DataArguments, split: str):
    """One split ("train", "validation" or "test") as a `Dataset` with the two language columns: from
    `--{split}_file`, else from `--dataset_name`'s `--{split}_split`."""
    path = getattr(data_args, f"{split}_file")
    src, tgt = data_args.source_lang, data_args.target_lang
    if path:
        return load_parallel_file(path, src, tgt, cache_dir=data_args.cache_dir)
    name = getattr(data_args, f"{split}_split")
    return load_parallel_dataset(
        data_args.dataset_name,
        src,
        tgt,
        splits={split: name},
        config_name=data_args.dataset_config_name,
        cache_dir=data_args.cache_dir,
    )[split]


def _tokenizer_source(
    data_args: DataArguments, model_args: ModelArguments | None, output_dir
) -> Path | str | None:
    if data_args.tokenizer_name:
        return data_args.tokenizer_name
    model = model_args.model_name_or_path if model_args else None
    if model and Path(model).is_dir():
        folder = Path(model)
        if (folder / "tokenizer.json").is_file() or (folder / "source" / "tokenizer.json").is_file():
            return folder
    saved = Path(output_dir) / "tokenizer"
    return saved if saved.is_dir() else None


def prepare_tokenizers(
    data_args: DataArguments,
    raw,
    output_dir: str,
    is_main_process: bool = True,
    model_args: ModelArguments | None = None,
):
    """The given tokenizer, else the fine-tuned model's, else the one a previous (resumed) run trained, else a new
    one (main process only; the others load what it saved). A new tokenizer is written whole or not at all."""
    path = _tokenizer_source(data_args, model_args, output_dir)
    if path is not None or not is_main_process:
        path = path or Path(output_dir) / "tokenizer"
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
            show_progress=False,
        )
    else:
        source = target = train_bpe_tokenizer(
            iter_text(train, [src, tgt]),
            vocab_size=data_args.vocab_size,
            lowercase=data_args.lowercase,
            show_progress=False,
        )
    with atomic_folder(Path(output_dir) / "tokenizer") as folder:
        save_tokenizers(source, target, folder)
    logger.info("Saved the new tokenizer to %s", Path(output_dir) / "tokenizer")
    return source, target


def build_model(model_args: ModelArguments, overrides: dict, source_tok, target_tok, training_args):
    """The model to train: the preset with the command line's fields over it and the tokenizer's vocabulary, or the
    `--model_name_or_path` model to fine-tune; with §6.1's decoding in its generation config."""
    attention = model_args.attn_implementation or default_attention(training_args.device)
    if model_args.model_name_or_path:
        model = VaswaniForConditionalGeneration.from_pretrained(
            model_args.model_name_or_path, attn_implementation=attention, **overrides
        )
        for name, tokenizer, size in (
            ("source", source_tok, model.config.vocab_size),
            ("target", target_tok, model.config.decoder_vocab_size),
        ):
            if len(tokenizer) > size:
                raise ValueError(
                    f"The {name} tokenizer has {len(tokenizer)} tokens but the model to fine-tune "
                    f"({model_args.model_name_or_path}) only {size}: pass its own tokenizer (--tokenizer_name)"
                )
    else:
        joint = source_tok is target_tok
        fields = dict(
            vocab_size=len(source_tok),
            decoder_vocab_size=len(target_tok),
            share_encoder_decoder_embeddings=joint,
        )
        fields.update(overrides)
        config = VaswaniConfig.from_preset(model_args.preset, attn_implementation=attention, **fields)
        model = VaswaniForConditionalGeneration(config)
    paper_decoding(model.generation_config)  # §6.1's decoding, saved with every checkpoint
    return model


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------
def train_main(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: PaperTrainingArguments,
    overrides: dict,
    finish_args: FinishArguments | None = None,
) -> VaswaniTrainer:
    """Run the whole training; returns the trainer (its model is the final one, the checkpoints are on disk)."""
    started = time.time()
    finish_args = finish_args or FinishArguments()
    with training_args.main_process_first(desc="checks"):
        resume = check_run(model_args, data_args, training_args, finish_args, overrides)
    raw = {"train": load_split(data_args, "train")}
    wants_validation = training_args.eval_strategy != "no" or training_args.do_eval
    if wants_validation:
        raw["validation"] = load_split(data_args, "validation")
    if data_args.max_train_samples:
        raw["train"] = raw["train"].select(range(min(data_args.max_train_samples, len(raw["train"]))))
    if data_args.max_eval_samples and "validation" in raw:
        raw["validation"] = raw["validation"].select(
            range(min(data_args.max_eval_samples, len(raw["validation"])))
        )
    from datasets import DatasetDict

    raw = DatasetDict(raw)
    with training_args.main_process_first(desc="tokenizer"):
        source_tok, target_tok = prepare_tokenizers(
            data_args,
            raw,
            training_args.output_dir,
            is_main_process=training_args.process_index == 0,
            model_args=model_args,
        )
    with training_args.main_process_first(desc="tokenization"):
        tokenized, dropped = tokenize_dataset(
            raw,
            source_tok,
            target_tok,
            data_args.source_lang,
            data_args.target_lang,
            max_length=data_args.max_source_length,
            max_target_length=data_args.max_target_length,
            num_proc=data_args.preprocessing_num_workers,
        )
    if len(tokenized["train"]) == 0:
        raise ValueError(
            f"All {len(raw['train'])} training pairs were dropped (an empty side, or longer than "
            f"--max_source_length {data_args.max_source_length} / --max_target_length "
            f"{data_args.max_target_length or data_args.max_source_length} tokens)"
        )
    logger.info("Pairs dropped by filtering: %s", dropped)

    set_seed(training_args.seed)  # the initial weights are part of the run: the same on every rank and rerun
    model = build_model(model_args, overrides, source_tok, target_tok, training_args)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "Model: %s, %s parameters, %s attention",
        model_args.model_name_or_path or f"{model_args.preset} preset",
        f"{n_params:,}",
        model.config._attn_implementation,
    )
    logger.debug("Model configuration: %s", model.config.to_diff_dict())

    # The Trainer would push every checkpoint with a default card; `finish` publishes the final model once.
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False
    collator = DataCollatorForSeq2Seq(source_tok, model=model, label_pad_token_id=-100)
    trainer = VaswaniTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized.get("validation"),
        data_collator=collator,
        processing_class=target_tok,
        compute_metrics=bleu_metric_fn(target_tok, raw["validation"][data_args.target_lang])
        if "validation" in raw
        else None,
    )
    finished = resume is not None and 0 < training_args.max_steps <= checkpoint_step(resume)
    result = None
    if finished:
        _finished_run(trainer, resume)
    else:
        if resume is not None:  # the training time counts every process of the run
            trainer.pop_callback(TrainingClock)
            trainer.add_callback(TrainingClock.from_checkpoint(resume))
        result = trainer.train(resume_from_checkpoint=resume)
        # The Trainer turns the cache off while training; the saved model is for use.
        trainer.model.config.use_cache = True
        trainer.save_model()  # the final weights in output_dir
    training_args.push_to_hub = push_to_hub
    if training_args.do_eval and training_args.eval_strategy == "no" and trainer.eval_dataset is not None:
        metrics = trainer.evaluate()
        if trainer.is_world_process_zero():
            write_json(Path(training_args.output_dir, "eval_results.json"), metrics)
    if trainer.is_world_process_zero() and result is not None:
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
            "dataset": data_args.source,
            "preset": model_args.preset if not model_args.model_name_or_path else None,
            "steps": trainer.state.global_step,
            "batch_tokens": tokens_per_step or None,
            "schedule": _schedule_name(training_args),
            "warmup_steps": training_args.warmup_steps,
            "peak_learning_rate": training_args.learning_rate
            * (model.config.d_model * training_args.warmup_steps) ** -0.5
            if training_args.paper_lr_schedule
            else training_args.learning_rate,
            "hardware": _hardware(training_args.world_size),
            "precision": _precision(training_args),
            "train_runtime": _training_clock(trainer, result),  # seconds, over every process of a resumed run
            # more detail
            "fine_tuned_from": model_args.model_name_or_path,
            "parameters": n_params,
            "wall_time_s": time.time() - started,
            "max_tokens_per_device": training_args.max_tokens,
            "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
            "label_smoothing": training_args.label_smoothing_factor,
            "max_grad_norm": training_args.max_grad_norm,  # 0: no clipping, as in the paper
            "dropped_pairs": dropped,
        }
        write_json(Path(training_args.output_dir, "training_summary.json"), summary)
    return trainer


def _schedule_name(training_args) -> str:
    if not training_args.paper_lr_schedule:
        return training_args.lr_scheduler_type
    name = "§5.3 inverse square root with linear warm-up"
    if training_args.lr_cooldown_fraction:
        name += f", falling linearly to 0 over the last {training_args.lr_cooldown_fraction:.0%} of the run"
    return name


def _training_clock(trainer: VaswaniTrainer, result) -> float | None:
    """Seconds of training over the whole run (a killed and resumed run included)."""
    clocks = [
        callback for callback in trainer.callback_handler.callbacks if isinstance(callback, TrainingClock)
    ]
    return clocks[0].seconds if clocks else result.metrics.get("train_runtime")


def _finished_run(trainer: VaswaniTrainer, checkpoint: str) -> None:
    """A run resumed from a checkpoint at or past --max_steps has nothing left to train: take its state (for the
    averaging and the learning curves), keep its final model, and restore that model from the checkpoint only if the
    run was killed before writing it."""
    from transformers import TrainerState

    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
    logger.info(
        "%s already reached --max_steps %d (step %d): nothing left to train",
        checkpoint,
        trainer.args.max_steps,
        trainer.state.global_step,
    )
    output_dir = Path(trainer.args.output_dir)
    if trainer.is_world_process_zero() and not (output_dir / "model.safetensors").is_file():
        building = temporary_sibling(output_dir)
        for path in Path(checkpoint).iterdir():
            if (
                path.is_file()
                and not path.name.endswith((".pt", ".pth", ".bin"))
                and path.name != "trainer_state.json"
            ):
                shutil.copy2(path, building / path.name)
        replace_files(building, output_dir)
        logger.info("Restored the final model of %s from %s", output_dir, checkpoint)


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
    averaged = None
    if max(finish_args.average_last) > 0:
        own = [c for c in checkpoints(output_dir) if int(c.name.split("-")[1]) <= trainer.state.global_step]
        if not own:
            logger.warning("No checkpoints in %s to average: the final model is the result", output_dir)
        elif finish_args.chooses_average:
            averaged = choose_average_on_validation(own, output_dir, data_args, finish_args)
            final_dir = output_dir / "averaged"
        else:
            averaged = own[-finish_args.average_last[0] :]
            if len(averaged) < finish_args.average_last[0]:
                logger.warning(
                    "Only %d checkpoints to average (asked for %d)",
                    len(averaged),
                    finish_args.average_last[0],
                )
            final_dir = average_checkpoints(averaged, output_dir / "averaged", tokenizer_dir=output_dir)
    alpha = finish_args.length_penalty[0]
    if finish_args.chooses_length_penalty:
        alpha = choose_length_penalty_on_validation(final_dir, output_dir, data_args, finish_args)
    save_length_penalty(final_dir, alpha)
    if finish_args.plots:
        from .plotting import plot_learning_curves

        plot_learning_curves(trainer.state.log_history, output_dir / "learning_curves.png")
    scores = None
    if data_args.test_split or data_args.test_file:
        scores = evaluate_test_split(
            final_dir, data_args, finish_args, plot_attention=finish_args.plots, length_penalty=alpha
        )
        if averaged is not None:
            scores["averaged_checkpoints"] = [c.name for c in averaged]
        write_json(output_dir / "test_results.json", scores)
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


def choose_average_on_validation(
    own: list[Path], output_dir: Path, data_args: DataArguments, finish_args: FinishArguments
) -> list[Path]:
    """The checkpoints whose average translates the validation split best: for each N of `--average_last` (several
    numbers), the last N of `own` (oldest first) are averaged and the validation split is translated with the test's
    beam search and scored. The highest BLEU wins, the fewest checkpoints among equals; its folder becomes
    `output_dir/averaged`. The scores of every candidate are written to `average_on_validation.json` in
    `output_dir`."""
    import tempfile

    from .averaging import average_checkpoints

    validation = load_split(data_args, "validation")
    sources, references = validation[data_args.source_lang], validation[data_args.target_lang]
    sizes = sorted({min(n, len(own)) for n in finish_args.average_last})
    if len(own) < max(finish_args.average_last):
        logger.warning(
            "Only %d checkpoints to average (asked for up to %d)", len(own), max(finish_args.average_last)
        )
    candidates, best = [], None
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".average-") as scratch:
        for size in tqdm(sizes, desc="Averages on validation", disable=len(sizes) < 2):
            chosen = own[-size:]
            folder = average_checkpoints(
                chosen, Path(scratch, f"last-{size}"), show_progress=False, tokenizer_dir=output_dir
            )
            scores = _validation_scores(
                folder, sources, references, data_args, finish_args, finish_args.length_penalty[0]
            )
            candidates.append({"checkpoints": [c.name for c in chosen], **scores})
            logger.info("Average of the last %d checkpoints: validation BLEU %.2f", size, scores["bleu"])
            if best is None or scores["bleu"] > best[1]:
                if best is not None:
                    shutil.rmtree(best[2])
                best = (chosen, scores["bleu"], folder)
            else:
                shutil.rmtree(folder)
        with atomic_folder(output_dir / "averaged") as building:
            replace_files(best[2], building)
    write_json(
        output_dir / "average_on_validation.json",
        _choice_record(
            data_args,
            finish_args,
            length_penalty=finish_args.length_penalty[0],
            chosen=[c.name for c in best[0]],
            candidates=candidates,
        ),
    )
    logger.info(
        "Chosen on validation: the average of the last %d checkpoints (BLEU %.2f)", len(best[0]), best[1]
    )
    return best[0]


def choose_length_penalty_on_validation(
    model_dir: Path, output_dir: Path, data_args: DataArguments, finish_args: FinishArguments
) -> float:
    """The length penalty alpha, among `--length_penalty`'s values, with which `model_dir` translates the validation
    split best (the test's beam size and form): the highest BLEU wins, the first given among equals. The scores of
    every value are written to `length_penalty_on_validation.json` in `output_dir`."""

    validation = load_split(data_args, "validation")
    sources, references = validation[data_args.source_lang], validation[data_args.target_lang]
    candidates, best = [], None
    for alpha in tqdm(list(dict.fromkeys(finish_args.length_penalty)), desc="Length penalties on validation"):
        scores = _validation_scores(model_dir, sources, references, data_args, finish_args, alpha)
        candidates.append({"length_penalty": alpha, **scores})
        logger.info("Length penalty %g: validation BLEU %.2f", alpha, scores["bleu"])
        if best is None or scores["bleu"] > best[1]:
            best = (alpha, scores["bleu"])
    write_json(
        output_dir / "length_penalty_on_validation.json",
        _choice_record(data_args, finish_args, model=str(model_dir), chosen=best[0], candidates=candidates),
    )
    logger.info("Chosen on validation: length penalty %g (BLEU %.2f)", *best)
    return best[0]


def _validation_scores(model_dir, sources, references, data_args, finish_args, length_penalty) -> dict:
    """The scores of the model folder's translation of the validation split with the test's decoding."""
    from .metrics import reported_scores

    hypotheses, target_tok = _translate_with(model_dir, sources, finish_args, length_penalty)
    return reported_scores(hypotheses, references, data_args.target_lang, lowercase=lowercases(target_tok))


def _choice_record(data_args: DataArguments, finish_args: FinishArguments, **choice) -> dict:
    """What a choice on the validation split writes down: the criterion, the split, the decoding, `choice`."""
    split = data_args.validation_split if not data_args.validation_file else data_args.validation_file
    return {
        "criterion": "bleu",
        "split": split,
        "num_beams": finish_args.num_beams,
        "length_penalty_form": finish_args.length_penalty_form,
        **choice,
    }


def save_length_penalty(model_dir: Path, alpha: float) -> None:
    """Write `alpha` into the model folder's generation config, so that `generate()`, the translation pipeline and
    `vaswani-translate` decode the saved model as its test score was made."""
    path = Path(model_dir, "generation_config.json")
    if not path.exists():
        return
    config = json.loads(path.read_text())
    if config.get("length_penalty") != alpha:
        config["length_penalty"] = alpha
        write_json(path, config)


def _translate_with(model_dir, sources, finish_args: FinishArguments, length_penalty: float):
    """`sources` translated by the model folder with the test's decoding; returns the texts and the target tokenizer."""
    from .translation import load_translation_model, translate

    model, source_tok, target_tok = load_translation_model(model_dir)
    hypotheses = translate(
        sources,
        model,
        source_tok,
        target_tok,
        batch_size=finish_args.translate_batch_size,
        num_beams=finish_args.num_beams,
        length_penalty=length_penalty,
        length_penalty_form=finish_args.length_penalty_form,
    )
    return hypotheses, target_tok


def evaluate_test_split(
    model_dir,
    data_args: DataArguments,
    finish_args: FinishArguments,
    plot_attention: bool = False,
    length_penalty: float | None = None,
) -> dict:
    """Beam-search translation of the test split (§6.1) and its scores; with `plot_attention`, the attention maps
    of the first test pair (source and its translation) as `attention_{encoder,decoder,cross}.png`. The length
    penalty is `length_penalty`, else the first of `--length_penalty`."""
    from .metrics import reported_scores
    from .translation import write_sentences

    alpha = finish_args.length_penalty[0] if length_penalty is None else length_penalty
    test = load_split(data_args, "test")
    split = data_args.test_split or Path(data_args.test_file).name
    hypotheses, target_tok = _translate_with(model_dir, test[data_args.source_lang], finish_args, alpha)
    references = test[data_args.target_lang]
    write_sentences(hypotheses, Path(model_dir, f"{split}.hyp.{data_args.target_lang}"))
    if plot_attention:
        from .plotting import attention_maps, load_attention_model, plot_attention_maps

        eager, src_tok, tgt_tok = load_attention_model(model_dir)
        maps = attention_maps(eager, src_tok, test[data_args.source_lang][0], hypotheses[0], tgt_tok)
        plot_attention_maps(maps, model_dir, prefix="attention")
    return {
        **reported_scores(hypotheses, references, data_args.target_lang, lowercase=lowercases(target_tok)),
        "dataset": data_args.source,
        "split": split,
        "num_beams": finish_args.num_beams,
        "length_penalty": alpha,
        "length_penalty_form": finish_args.length_penalty_form,
        "model": str(model_dir),
    }
