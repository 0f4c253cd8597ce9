"""From raw parallel text to a trained model: the steps behind `vaswani-train` (`vaswani.commands.train`).

0. check every flag before any data is read (`checks.check_run`): the model configuration, the data sources, the
   output folder (a folder belongs to one run), the checkpoint to resume from;
1. load the corpus through `datasets` (`vaswani.recipe.data`): every split the run reads, the test and validation splits
first, so that a bad file is named before any work, 2. train or load the joint BPE tokenizer
(`vaswani.recipe.tokenization`), 3. tokenize and filter, 4. build the model from a preset plus any config field given on the
command line (or load one to fine-tune), 5. log what runs after training and the most time it may take
(`evaluation.log_after_training`), then train with `VaswaniTrainer` (`vaswani.recipe.trainer`), resuming from the last
good checkpoint when asked (`vaswani.recipe.checkpoints`), and write the training summary (`vaswani.recipe.summary`). After
training, `vaswani.recipe.finish` averages, translates the test split, scores, draws and publishes (§6.1).
"""

import logging
import time
from pathlib import Path

from datasets import DatasetDict
from transformers import DataCollatorForSeq2Seq, set_seed

from ..common.fileio import atomic_folder, write_json
from ..configuration_vaswani import VaswaniConfig
from ..generation_vaswani import paper_decoding
from ..kernels import FAST_ATTENTION, use_cpu_kernels
from ..modeling_vaswani import VaswaniForConditionalGeneration
from .arguments import (
    PAPER_VOCAB_SIZE,
    FinishArguments,
)
from .batching import LENGTH_COLUMN
from .callbacks import RunTokenizer
from .checkpoints import train_or_resume
from .checks import check_lowercase, check_run, resume_checkpoint, take_run_folder
from .data import iter_text, load_parallel_dataset, load_parallel_file, sample_pairs, tokenize_dataset
from .evaluation import log_after_training, sort_by_source_length
from .metrics import bleu_metric_fn
from .model_folders import load_model
from .summary import log_recipe, training_summary
from .tokenization import (
    SOURCE_SUBDIR,
    TARGET_SUBDIR,
    load_tokenizers,
    save_tokenizers,
    saved_tokenizer_digest,
    tokenizer_digest,
    train_bpe_tokenizer,
    train_separate_tokenizers,
)
from .trainer import VaswaniTrainer

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------------
# Data and tokenizers
# ---------------------------------------------------------------------------------------------------------------------
def load_split(data_args, split):
    """One split ("train", "validation" or "test") as a `Dataset` with the two language columns: from
    `--{split}_file`, else from `--dataset_name`'s `--{split}_split`."""
    path, languages = getattr(data_args, f"{split}_file"), (data_args.source_lang, data_args.target_lang)
    if path:
        return load_parallel_file(path, *languages, cache_dir=data_args.cache_dir)
    return load_parallel_dataset(
        data_args.dataset_name,
        *languages,
        splits={split: getattr(data_args, f"{split}_split")},
        config_name=data_args.dataset_config_name,
        cache_dir=data_args.cache_dir,
    )[split]


def load_test_split(data_args):
    """The test pairs translated after training: `--test_file`, else `--test_split`; the first
    `--max_predict_samples` of them when given (run_translation.py's flag)."""
    return _first(load_split(data_args, "test"), data_args.max_predict_samples)


def test_split_name(data_args, pairs=None):
    """The test split's name in the scores: `--test_split` or the `--test_file` name, as `test[:N]` (datasets' slice
    notation) when `--max_predict_samples` cut it to its first N `pairs`."""
    name, cut = data_args.test_split or Path(data_args.test_file).name, data_args.max_predict_samples
    return f"{name}[:{cut}]" if cut and (pairs or 0) >= cut else name


def train_new_tokenizers(data_args, train, **options):
    """A new BPE vocabulary (§5.1: joint; one per side with `--separate_vocabularies`) learned from the training
    split, or from `--max_tokenizer_samples` of its pairs drawn uniformly at random with a fixed seed
    (`data.sample_pairs`). `options`: `min_frequency`, `model_max_length`, `show_progress` (default: a progress bar),
    `target_vocab_size` (separate only).
    Returns `(source, target)`, the same object twice for a joint vocabulary."""
    sample, languages = (
        sample_pairs(train, data_args.max_tokenizer_samples),
        [data_args.source_lang, data_args.target_lang],
    )
    options.update(vocab_size=data_args.vocab_size or PAPER_VOCAB_SIZE, lowercase=data_args.lowercase)
    logger.info(
        "Training the BPE vocabulary (%d tokens, %s) on %s sentences: %s",
        options["vocab_size"],
        "one per language" if data_args.separate_vocabularies else "joint",
        f"{len(sample) * 2:,}",
        f"{len(sample):,} of the {len(train):,} training pairs, drawn at random"
        if len(sample) < len(train)
        else f"all {len(train):,} training pairs",
    )
    if data_args.separate_vocabularies:
        sides = (iter_text(sample, [language]) for language in languages)
        return train_separate_tokenizers(*sides, length=len(sample), **options)
    options.pop("target_vocab_size", None)
    tokenizer = train_bpe_tokenizer(iter_text(sample, languages), length=2 * len(sample), **options)
    return tokenizer, tokenizer


def prepare_tokenizers(data_args, raw, args, model_args=None):
    """The given tokenizer, else the fine-tuned model's, else the one a previous (resumed) run trained, else a new
    one (main process only, with a progress bar unless `--disable_tqdm`; the others load what it saved) in the
    `--output_dir` of `args` (the training arguments). A new tokenizer is written whole or not at all."""
    saved, model = Path(args.output_dir) / "tokenizer", model_args and model_args.model_name_or_path
    own = model and (
        Path(model, "tokenizer.json").is_file() or Path(model, "source/tokenizer.json").is_file()
    )
    path = data_args.tokenizer_name or (own and model) or saved
    if path != saved or saved.is_dir() or args.process_index:
        source, target = load_tokenizers(path)
        check_lowercase(data_args, source, target, path)
        return source, target
    source, target = train_new_tokenizers(data_args, raw["train"], show_progress=not args.disable_tqdm)
    with atomic_folder(saved) as folder:
        save_tokenizers(source, target, folder)
    logger.info("Saved the new tokenizer to %s", saved)
    return source, target


# ---------------------------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------------------------
def build_model(model_args, overrides, source_tok, target_tok, training_args):
    """The model to train: the preset with the command line's fields over it and the tokenizer's vocabulary, or the
    `--model_name_or_path` model to fine-tune; with §6.1's decoding in its generation config. Its attention is
    `--attn_implementation`, else this package's faster CPU path on the CPU and SDPA elsewhere."""
    on_cpu, path = training_args.device.type == "cpu", model_args.model_name_or_path
    attention = model_args.attn_implementation or (FAST_ATTENTION if on_cpu else "sdpa")
    if path:
        model = load_model(path, VaswaniForConditionalGeneration, attn_implementation=attention, **overrides)
        for name, tokenizer, size in (
            ("source", source_tok, model.config.vocab_size),
            ("target", target_tok, model.config.decoder_vocab_size),
        ):
            if len(tokenizer) > size:
                raise ValueError(
                    f"The {name} tokenizer has {len(tokenizer)} tokens but the model to fine-tune "
                    f"({path}) only {size}: pass its own tokenizer (--tokenizer_name)"
                )
    else:
        config = VaswaniConfig.from_preset(
            model_args.preset,
            attn_implementation=attention,
            vocab_size=len(source_tok),
            decoder_vocab_size=len(target_tok),
            share_encoder_decoder_embeddings=source_tok is target_tok,
            **overrides,  # the command line's fields, never these (`arguments.CONFIG_FIELDS_NOT_FLAGS`)
        )
        model = VaswaniForConditionalGeneration(config)
    paper_decoding(model.generation_config)  # §6.1's decoding, saved with every checkpoint
    if on_cpu:
        use_cpu_kernels(model, attention=False)  # the attention was chosen above
    logger.info(
        "Model: %s, %s parameters, %s attention",
        path or f"{model_args.preset} preset",
        f"{model.num_parameters():,}",
        model.config._attn_implementation,
    )
    logger.debug("Model configuration: %s", model.config.to_diff_dict())
    return model


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------
def train_main(model_args, data_args, args, overrides, finish_args=None):
    """Run the whole training (`ModelArguments`, `DataArguments`, `PaperTrainingArguments`, the command line's config
    fields, `FinishArguments`); returns the trainer, whose model is the final one (the checkpoints are on disk)."""
    started = time.time()
    finish_args = finish_args or FinishArguments()
    with args.main_process_first(desc="checks"):
        check_run(model_args, data_args, args, finish_args, overrides)
    # The main process reads the text into datasets' Arrow cache first (the others map it), then takes the run folder
    with args.main_process_first(desc="loading the corpus"):
        raw, choice_sources, test_sources = read_splits(data_args, args, finish_args)
        resume = take_run_folder(args)
    with args.main_process_first(desc="tokenizer"):
        source_tok, target_tok = prepare_tokenizers(data_args, raw, args, model_args)
    tokenized, dropped = tokenize_splits(raw, source_tok, target_tok, data_args, args)
    digest = tokenizer_digest(source_tok, target_tok)
    if resume and saved_tokenizer_digest(resume) not in (None, digest):
        # trained with other tokenizers: refused when named, from "last" the newest checkpoint of these
        resume = resume_checkpoint(args, digest)
    set_seed(args.seed)  # the initial weights are part of the run: the same on every rank and rerun
    model = build_model(model_args, overrides, source_tok, target_tok, args)
    parameters = model.num_parameters()
    # The Trainer would push every checkpoint with a default card; `finish` publishes the final model once.
    push_to_hub, args.push_to_hub = args.push_to_hub, False
    validation = tokenized.get("validation")
    trainer = VaswaniTrainer(
        model=model,
        args=args,
        train_dataset=tokenized["train"],
        eval_dataset=validation,
        data_collator=DataCollatorForSeq2Seq(
            source_tok, model=model, pad_to_multiple_of=args.pad_to_multiple_of
        ),
        processing_class=target_tok,
        compute_metrics=None
        if validation is None
        else bleu_metric_fn(target_tok, raw["validation"][data_args.target_lang]),
    )
    log_after_training(trainer, finish_args, choice_sources, test_sources, source_tok)
    trainer.add_callback(RunTokenizer(digest))  # recorded in every checkpoint, checked on resume
    log_recipe(args)
    result = train_or_resume(trainer, resume)
    if result is not None:
        # the Trainer turns the cache off while training; the saved model is for use
        trainer.model.config.use_cache = True
        trainer.save_model()  # the final weights in output_dir
    args.push_to_hub, output_dir, main = push_to_hub, Path(args.output_dir), trainer.is_world_process_zero()
    if args.do_eval and args.eval_strategy == "no":  # validation data: checked (`checks.check_run`)
        metrics = trainer.evaluate()
        if main:
            write_json(output_dir / "eval_results.json", metrics)
    # A finished run resumed (result None) restores what a kill before the end left unwritten.
    sides = [""] if source_tok is target_tok else [SOURCE_SUBDIR, TARGET_SUBDIR]
    if main and (result is not None or not all((output_dir / s / "tokenizer.json").is_file() for s in sides)):
        save_tokenizers(source_tok, target_tok, output_dir)
        if result is None:
            logger.info("Restored the final tokenizer of %s", output_dir)
    if main and (result is not None or not (output_dir / "training_summary.json").is_file()):
        summary = training_summary(trainer, model_args, data_args, parameters, dropped, started)
        write_json(output_dir / "training_summary.json", summary)
    return trainer


def read_splits(data_args, training_args, finish_args):
    """Every split the run reads, the small ones first, so that a bad test or validation file is named before the
    training text is read, the BPE trained or the model built: the training and validation splits (cut to
    --max_train_samples / --max_eval_samples) to train and evaluate on, the sources of the whole validation split
    that the choices after training translate (when any) and those of the test split (when translated)."""
    source, test = data_args.source_lang, data_args.test_split or data_args.test_file
    test_sources = list(load_test_split(data_args)[source]) if test else None
    chooses = finish_args.chooses_average or finish_args.chooses_length_penalty
    wants_validation = training_args.eval_strategy != "no" or training_args.do_eval
    validation = load_split(data_args, "validation") if wants_validation or chooses else None
    raw = DatasetDict(train=_first(load_split(data_args, "train"), data_args.max_train_samples))
    if wants_validation:
        raw["validation"] = _first(validation, data_args.max_eval_samples)
    return raw, list(validation[source]) if chooses else None, test_sources


def tokenize_splits(raw, source_tok, target_tok, data_args, training_args):
    """The token ids of the splits the run trains and evaluates on, and the pairs filtering dropped (`dropped`); the
    validation split (ids and text) sorted longest source first, for batches of similar length (the references
    follow). The training text leaves `raw`: it is not read again, and its memory map (gigabytes of pages at WMT
    scale) goes, so that what a training process holds resident is the model and the token ids."""
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
    text_pairs = len(raw.pop("train"))
    if not len(tokenized["train"]):
        raise ValueError(
            f"All {text_pairs} training pairs were dropped (an empty side, or longer than "
            f"--max_source_length {data_args.max_source_length} / --max_target_length "
            f"{data_args.max_target_length or data_args.max_source_length} tokens)"
        )
    logger.info("Pairs dropped by filtering: %s", dropped)
    if "validation" in tokenized:
        # `length` is for the training sampler; with --remove_unused_columns false it would reach generate()
        tokenized["validation"], raw["validation"] = sort_by_source_length(
            tokenized["validation"].remove_columns(LENGTH_COLUMN), raw["validation"]
        )
    return tokenized, dropped


def _first(dataset, pairs):
    return dataset.select(range(min(pairs, len(dataset)))) if pairs else dataset
