"""From raw parallel text to a trained model: the steps behind `vaswani-train` (`vaswani.commands.train`).

0. check every flag before any data is read (`checks.check_run`): the model configuration, the data sources, the
   output folder (a folder belongs to one run), the checkpoint to resume from;
1. load the corpus through `datasets` (`vaswani.recipe.data`): every split the run reads, the test and validation splits
first, so that a bad file is named before any work, 2. train or load the joint BPE tokenizer
(`vaswani.recipe.tokenization`), 3. tokenize and filter, 4. build the model from a preset plus any config field given on the
command line (or load one to fine-tune), 5. log what runs after training and the most time it may take
(`after_training_plan`), then train with `VaswaniTrainer` (`vaswani.recipe.trainer`), resuming from the last
good checkpoint when asked (`vaswani.recipe.checkpoints`), and write the training summary (`vaswani.recipe.summary`). After
training, `vaswani.recipe.finish` averages, translates the test split, scores, draws and publishes (§6.1).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from datasets import DatasetDict
from transformers import DataCollatorForSeq2Seq, set_seed

from ..common.errors import UsageError
from ..common.fileio import atomic_folder, write_json
from ..configuration_vaswani import VaswaniConfig
from ..generation_vaswani import paper_decoding
from ..kernels import FAST_ATTENTION, use_cpu_kernels
from ..modeling_vaswani import VaswaniForConditionalGeneration
from .arguments import (
    PAPER_VOCAB_SIZE,
    DataArguments,
    FinishArguments,
    ModelArguments,
    PaperTrainingArguments,
    log_recipe,
)
from .batching import LENGTH_COLUMN
from .callbacks import RunTokenizer
from .checkpoints import resolve_resume_checkpoint, train_or_resume
from .checks import check_lowercase, check_run, has_training_state, take_run_folder
from .data import iter_text, load_parallel_dataset, load_parallel_file, sample_pairs, tokenize_dataset
from .evaluation import (
    AfterTraining,
    decoder_steps,
    describe_decoding,
    describe_seconds,
    seconds_per_decoder_step,
    sort_by_source_length,
)
from .metrics import bleu_metric_fn
from .model_folders import load_model
from .summary import training_summary
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


def load_test_split(data_args: DataArguments):
    """The test pairs translated after training: `--test_file`, else `--test_split`; the first
    `--max_predict_samples` of them when given (run_translation.py's flag)."""
    test = load_split(data_args, "test")
    if data_args.max_predict_samples and data_args.max_predict_samples < len(test):
        test = test.select(range(data_args.max_predict_samples))
    return test


def test_split_name(data_args: DataArguments, pairs: int | None = None) -> str:
    """The test split's name in the scores: `--test_split` or the `--test_file` name, as `test[:N]` (datasets' slice
    notation) when `--max_predict_samples` cut it to its first N `pairs`."""
    name = data_args.test_split or Path(data_args.test_file).name
    if data_args.max_predict_samples and pairs is not None and pairs >= data_args.max_predict_samples:
        return f"{name}[:{data_args.max_predict_samples}]"
    return name


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


def train_new_tokenizers(data_args: DataArguments, train, show_progress: bool = True, **options):
    """A new BPE vocabulary (§5.1: joint; one per side with `--separate_vocabularies`) learned from the training
    split, or from `--max_tokenizer_samples` of its pairs drawn uniformly at random with a fixed seed
    (`data.sample_pairs`). `options`: `min_frequency`, `model_max_length`, `target_vocab_size` (separate only).
    Returns `(source, target)`, the same object twice for a joint vocabulary."""
    sample = sample_pairs(train, data_args.max_tokenizer_samples)
    src, tgt = data_args.source_lang, data_args.target_lang
    separate = data_args.separate_vocabularies
    vocab_size = data_args.vocab_size or PAPER_VOCAB_SIZE
    logger.info(
        "Training the BPE vocabulary (%d tokens, %s) on %s sentences: %s",
        vocab_size,
        "one per language" if separate else "joint",
        f"{len(sample) * 2:,}",
        f"{len(sample):,} of the {len(train):,} training pairs, drawn at random"
        if len(sample) < len(train)
        else f"all {len(train):,} training pairs",
    )
    common = dict(vocab_size=vocab_size, lowercase=data_args.lowercase, show_progress=show_progress)
    if separate:
        return train_separate_tokenizers(
            iter_text(sample, [src]), iter_text(sample, [tgt]), length=len(sample), **common, **options
        )
    options.pop("target_vocab_size", None)
    tokenizer = train_bpe_tokenizer(
        iter_text(sample, [src, tgt]), length=2 * len(sample), **common, **options
    )
    return tokenizer, tokenizer


def prepare_tokenizers(
    data_args: DataArguments,
    raw,
    output_dir: str,
    is_main_process: bool = True,
    model_args: ModelArguments | None = None,
    show_progress: bool = True,
):
    """The given tokenizer, else the fine-tuned model's, else the one a previous (resumed) run trained, else a new
    one (main process only, with a progress bar when `show_progress`; the others load what it saved). A new
    tokenizer is written whole or not at all."""
    path = _tokenizer_source(data_args, model_args, output_dir)
    if path is not None or not is_main_process:
        path = path or Path(output_dir) / "tokenizer"
        source, target = load_tokenizers(path)
        check_lowercase(data_args, source, target, path)
        return source, target
    source, target = train_new_tokenizers(data_args, raw["train"], show_progress=show_progress)
    with atomic_folder(Path(output_dir) / "tokenizer") as folder:
        save_tokenizers(source, target, folder)
    logger.info("Saved the new tokenizer to %s", Path(output_dir) / "tokenizer")
    return source, target


# ---------------------------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------------------------
def default_attention(device: torch.device | str) -> str:
    """The attention kernel of a model that runs on `device`: this package's faster CPU path on the CPU."""
    return FAST_ATTENTION if torch.device(device).type == "cpu" else "sdpa"


def build_model(model_args: ModelArguments, overrides: dict, source_tok, target_tok, training_args):
    """The model to train: the preset with the command line's fields over it and the tokenizer's vocabulary, or the
    `--model_name_or_path` model to fine-tune; with §6.1's decoding in its generation config."""
    attention = model_args.attn_implementation or default_attention(training_args.device)
    if model_args.model_name_or_path:
        model = load_model(
            model_args.model_name_or_path,
            VaswaniForConditionalGeneration,
            attn_implementation=attention,
            **overrides,
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
    if torch.device(training_args.device).type == "cpu":
        use_cpu_kernels(model, attention=False)  # the attention was chosen above
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
        check_run(model_args, data_args, training_args, finish_args, overrides)
    wants_validation = training_args.eval_strategy != "no" or training_args.do_eval
    # The main process reads the text into datasets' Arrow cache first; the others then map that cache. Every split
    # the run reads is read now, the small ones first, so that a bad test or validation file is named before the
    # training text is read, the BPE trained or the model built.
    with training_args.main_process_first(desc="loading the corpus"):
        test_sources = (
            load_test_split(data_args)[data_args.source_lang]
            if data_args.test_split or data_args.test_file
            else None
        )
        chooses = finish_args.chooses_average or finish_args.chooses_length_penalty
        validation = load_split(data_args, "validation") if wants_validation or chooses else None
        raw = {"train": load_split(data_args, "train")}
    with training_args.main_process_first(desc="output folder"):
        resume = take_run_folder(training_args)  # the data is read: the run's folder is taken now
    if wants_validation:
        raw["validation"] = validation
    if data_args.max_train_samples:
        raw["train"] = raw["train"].select(range(min(data_args.max_train_samples, len(raw["train"]))))
    # The choices after training translate the whole validation split (for the plan's estimate).
    choice_sources = validation[data_args.source_lang] if chooses else None
    del validation
    if data_args.max_eval_samples and "validation" in raw:
        raw["validation"] = raw["validation"].select(
            range(min(data_args.max_eval_samples, len(raw["validation"])))
        )
    raw = DatasetDict(raw)
    with training_args.main_process_first(desc="tokenizer"):
        source_tok, target_tok = prepare_tokenizers(
            data_args,
            raw,
            training_args.output_dir,
            is_main_process=training_args.process_index == 0,
            model_args=model_args,
            show_progress=not training_args.disable_tqdm,
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
    digest = tokenizer_digest(source_tok, target_tok)
    if resume is not None and saved_tokenizer_digest(resume) not in (None, digest):
        # trained with other tokenizers: refused when named, from "last" the newest checkpoint of these
        try:
            resume = resolve_resume_checkpoint(
                training_args.resume_from_checkpoint,
                training_args.output_dir,
                has_training_state(training_args),
                tokenizer_digest=digest,
            )
        except (ValueError, FileNotFoundError) as error:
            raise UsageError(f"--resume_from_checkpoint: {error}") from None
    # The training text is not read again: its memory map (gigabytes of pages at WMT scale) goes now, so that what
    # a training process holds resident is the model and the token ids.
    text_pairs = len(raw.pop("train"))
    if len(tokenized["train"]) == 0:
        raise ValueError(
            f"All {text_pairs} training pairs were dropped (an empty side, or longer than "
            f"--max_source_length {data_args.max_source_length} / --max_target_length "
            f"{data_args.max_target_length or data_args.max_source_length} tokens)"
        )
    logger.info("Pairs dropped by filtering: %s", dropped)
    if "validation" in tokenized:
        # Decoded in batches of similar length; the references (raw) follow the same order.
        validation = sort_by_source_length(tokenized["validation"], raw["validation"])
        tokenized["validation"], raw["validation"] = validation

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
    collator = DataCollatorForSeq2Seq(
        source_tok,
        model=model,
        label_pad_token_id=-100,
        pad_to_multiple_of=getattr(training_args, "pad_to_multiple_of", None),
    )
    trainer = VaswaniTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized["train"],
        # `length` is for the training sampler; with --remove_unused_columns false it would reach generate()
        eval_dataset=tokenized["validation"].remove_columns(LENGTH_COLUMN)
        if "validation" in tokenized
        else None,
        data_collator=collator,
        processing_class=target_tok,
        compute_metrics=bleu_metric_fn(target_tok, raw["validation"][data_args.target_lang])
        if "validation" in raw
        else None,
    )
    plan = after_training_plan(trainer, data_args, finish_args, choice_sources, test_sources, source_tok)
    trainer.evaluation_clock.after_training = plan
    logger.info(plan.describe())
    warn_of_a_long_finish(plan)
    trainer.add_callback(RunTokenizer(digest))  # recorded in every checkpoint, checked on resume
    log_recipe(training_args)
    result = train_or_resume(trainer, resume)
    if result is not None:
        # The Trainer turns the cache off while training; the saved model is for use.
        trainer.model.config.use_cache = True
        trainer.save_model()  # the final weights in output_dir
    training_args.push_to_hub = push_to_hub
    if training_args.do_eval and training_args.eval_strategy == "no" and trainer.eval_dataset is not None:
        metrics = trainer.evaluate()
        if trainer.is_world_process_zero():
            write_json(Path(training_args.output_dir, "eval_results.json"), metrics)
    output_dir = Path(training_args.output_dir)
    if trainer.is_world_process_zero():
        # A finished run resumed (result None) restores what a kill before the end left unwritten.
        if result is not None or not _has_tokenizers(output_dir, joint=source_tok is target_tok):
            save_tokenizers(source_tok, target_tok, output_dir)
            if result is None:
                logger.info("Restored the final tokenizer of %s", output_dir)
        if result is not None or not (output_dir / "training_summary.json").is_file():
            summary = training_summary(
                trainer, result, model, model_args, data_args, n_params, dropped, started
            )
            write_json(output_dir / "training_summary.json", summary)
    return trainer


def after_training_plan(
    trainer: VaswaniTrainer,
    data_args: DataArguments,
    finish_args: FinishArguments,
    choice_sources: list[str] | None,
    test_sources: list[str] | None,
    source_tok,
) -> AfterTraining:
    """What runs once training ends, for the log (`evaluation.AfterTraining`): the final evaluation (step-based
    evaluation evaluates the last step, at --max_steps or at the --max_train_minutes budget; --do_eval alone once at
    the end), the averaging, the choices on the whole validation split (`choice_sources`) and the test translation
    (`test_sources`), with the most time each should take: the decoder steps each would take if every output ran
    to its limit, as the untrained model's do, timed now on this model (main process only; the others train on)."""
    args = trainer.args
    validation = trainer.eval_dataset
    final = (
        len(validation)
        if validation is not None
        and (args.eval_strategy == "steps" or (args.do_eval and args.eval_strategy == "no"))
        else None
    )
    beams = args.generation_num_beams or trainer.model.generation_config.num_beams or 1
    choices = (len(set(finish_args.average_last)) if finish_args.chooses_average else 0) + (
        len(set(finish_args.length_penalty)) if finish_args.chooses_length_penalty else 0
    )
    test = len(test_sources) if test_sources is not None else None
    plan = AfterTraining(
        budget_minutes=getattr(args, "max_train_minutes", None),
        timed_only=getattr(args, "timed_only", False),
        max_steps=args.max_steps,
        validation_pairs=final,
        eval_decoding=describe_decoding(
            final or 0, beams, args.per_device_eval_batch_size, args.world_size, args.generation_max_length
        ),
        processes=args.world_size,
        average_last=tuple(finish_args.average_last),
        validation_translations=choices,
        choice_pairs=len(choice_sources) if choice_sources is not None else None,
        test_pairs=test,
        test_decoding=describe_decoding(test or 0, finish_args.num_beams, finish_args.translate_batch_size),
    )
    if not trainer.is_world_process_zero():
        return plan

    def encoded(sources) -> list[list[int]]:
        return source_tok([s for s in sources if s.strip()])["input_ids"]  # empty ones are not decoded

    model, pad = trainer.model, source_tok.pad_token_id
    if final:
        eval_lengths = [len(ids) for ids in validation["input_ids"]]
        plan.eval_steps = decoder_steps(
            eval_lengths, args.per_device_eval_batch_size, args.generation_max_length, args.world_size
        )
        longest = sorted(validation["input_ids"], key=len, reverse=True)[: args.per_device_eval_batch_size]
        plan.greedy_step_seconds = seconds_per_decoder_step(
            model, longest, pad, beams, bf16_autocast=args.bf16
        )
    beam_sources = []
    if choices and choice_sources:
        choice_ids = encoded(choice_sources)
        plan.choice_steps = decoder_steps([len(ids) for ids in choice_ids], finish_args.translate_batch_size)
        beam_sources += choice_ids
    if test:
        test_ids = encoded(test_sources)
        plan.test_steps = decoder_steps([len(ids) for ids in test_ids], finish_args.translate_batch_size)
        beam_sources += test_ids
    if beam_sources:
        longest = sorted(beam_sources, key=len, reverse=True)[: finish_args.translate_batch_size]
        plan.beam_step_seconds = seconds_per_decoder_step(model, longest, pad, finish_args.num_beams)
    return plan


def warn_of_a_long_finish(plan: AfterTraining) -> None:
    """Warn when the work after training may take longer than the --max_train_minutes training itself, naming the
    flags that shorten it."""
    bound = plan.bound()
    if not bound or not plan.budget_minutes or sum(bound.values()) <= plan.budget_minutes * 60:
        return
    logger.warning(
        "The work after training may take up to %s, more than the %g-minute training budget "
        "(--max_train_minutes bounds training only): --max_predict_samples N translates the first N test pairs "
        "only, --do_predict false none%s",
        describe_seconds(sum(bound.values())),
        plan.budget_minutes,
        ", --max_eval_samples N evaluates on fewer validation pairs" if bound.get("evaluation") else "",
    )


def _has_tokenizers(folder: Path, joint: bool) -> bool:
    if joint:
        return (folder / "tokenizer.json").is_file()
    return all((folder / side / "tokenizer.json").is_file() for side in (SOURCE_SUBDIR, TARGET_SUBDIR))
