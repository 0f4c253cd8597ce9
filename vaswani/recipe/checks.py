"""The checks of `vaswani-train` before any data is read (`check_run`): the model configuration the flags ask for,
the data sources, the tokenizer folder (loaded), the Hub repo id to publish to, the run's folder
(`run_folder.take_output_dir`: refused when another run holds it, or it holds another run or files of the user's)
and the checkpoint to resume from (`checkpoints.resolve_resume_checkpoint`); nothing is created or written until
`take_run_folder` takes the folder for the run, once the data is read. A mistake is a `UsageError` that names the
flag, seconds after the start, not after the data has been read and tokenized.
"""

import contextlib
import logging
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig

from .. import register
from ..common.errors import UsageError
from ..configuration_vaswani import VaswaniConfig
from ..modeling_vaswani import VaswaniForConditionalGeneration
from ..publishing.hub import check_repo_id
from .checkpoints import asks_to_resume, resolve_resume_checkpoint
from .data import parallel_file_paths
from .model_folders import check_model_path, load_model
from .run_folder import take_output_dir
from .tokenization import load_model_tokenizers, lowercases

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def naming(flag):
    """Re-raise an error of the block (a file or folder that cannot be read, a bad value, a config field of the wrong
    type: `StrictDataclassError`) as a `UsageError` "`flag`: its message"."""
    try:
        yield
    except (OSError, ValueError, StrictDataclassError) as error:
        raise UsageError(f"{flag}: {error}") from None


def check_model_config(model_args, data_args, overrides):
    """Build the configuration the run will train (with the flag's vocabulary size in place of the tokenizer's), so
    that a bad field is reported before any data is read."""
    path = model_args.model_name_or_path
    if not path:
        VaswaniConfig.from_preset(
            model_args.preset, vocab_size=max(data_args.vocab_size or 8, 8), **overrides
        )
        return
    with naming("--model_name_or_path"):
        check_model_path(path)
    register()  # model_type="vaswani" loads with this package's classes
    with naming(f"--model_name_or_path {path}"):
        config = AutoConfig.from_pretrained(path)
        if isinstance(config, VaswaniConfig):  # weights that do not match the config are named now
            load_model(path, VaswaniForConditionalGeneration)
    if not isinstance(config, VaswaniConfig):
        raise UsageError(
            f"--model_name_or_path {path} holds a {config.model_type!r} model, not a vaswani one"
        )
    check_vocab_size(
        data_args, max(config.vocab_size, config.decoder_vocab_size), f"--model_name_or_path {path}"
    )
    config.update(overrides)
    config.validate_fields()


def _check_data_sources(data_args, training_args, finish_args):
    name, test = data_args.dataset_name, data_args.test_split or data_args.test_file
    if not name and not data_args.train_file:
        raise UsageError(
            "No training data: give --dataset_name (a Hub dataset or a local folder) or --train_file"
        )
    if training_args.do_predict and not test:
        data_args.test_split = "test"
    if training_args.do_predict is False and test:
        flag = "--test_split" if data_args.test_split else "--test_file"
        logger.info("--do_predict false: %s %s is not translated after training", flag, test)
        data_args.test_split = data_args.test_file = None
    for split in ("train", "validation", "test"):
        if path := getattr(data_args, f"{split}_file"):
            with naming(f"--{split}_file"):
                parallel_file_paths(path, data_args.source_lang, data_args.target_lang)
    if (
        name
        and (Path(name).is_absolute() or name.startswith(".") or name.count("/") > 1)
        and not Path(name).exists()
    ):
        raise UsageError(f"--dataset_name {name}: no such file or folder")
    has_validation = data_args.validation_file or name
    if (training_args.eval_strategy != "no" or training_args.do_eval) and not has_validation:
        raise UsageError(
            "Evaluation needs validation data: give --validation_file (or --dataset_name), or --eval_strategy no"
        )
    if data_args.test_split and not name and not data_args.test_file:
        raise UsageError(f"--test_split {data_args.test_split} needs --dataset_name (or give --test_file)")
    for flag, chooses in (
        ("--average_last", finish_args.chooses_average),
        ("--length_penalty", finish_args.chooses_length_penalty),
    ):
        if chooses and not has_validation:
            raise UsageError(
                f"{flag} with several numbers chooses among them on validation data: give --validation_file "
                "(or --dataset_name)"
            )


def check_vocab_size(data_args, size, flag):
    """Raise `UsageError` when `--vocab_size` was given and the vocabulary `flag` brings (`size` tokens, which the
    run trains with) is larger: no BPE trained with that flag has it."""
    if data_args.vocab_size and size > data_args.vocab_size:
        raise UsageError(
            f"--vocab_size {data_args.vocab_size}, but {flag} brings a vocabulary of {size} tokens, which the run "
            "would train with: drop --vocab_size (it sizes a BPE trained for the run)"
        )


def check_lowercase(data_args, source, target, path):
    """Raise `ValueError` unless the tokenizers in `path` lowercase as `--lowercase` says."""
    if {lowercases(source), lowercases(target)} != {data_args.lowercase}:
        raise ValueError(
            f"--lowercase is {data_args.lowercase} but the tokenizer in {str(path)!r} "
            f"{'keeps case' if data_args.lowercase else 'lowercases'}: train a new one, or match the flag."
        )


def check_tokenizer_folder(data_args, model_path):
    """`--tokenizer_name` loads, is the tokenizer of the model to fine-tune (`model_path`), and lowercases as
    `--lowercase` says: a torn, missing or other tokenizer is named before any data is read."""
    path = data_args.tokenizer_name
    if not Path(path).exists():
        raise UsageError(f"--tokenizer_name {path}: no such folder")
    with naming(f"--tokenizer_name {path}"):
        source, target = load_model_tokenizers(model_path or path, path)
        check_lowercase(data_args, source, target, path)
    check_vocab_size(data_args, max(len(source), len(target)), f"--tokenizer_name {path}")


def check_run(model_args, data_args, training_args, finish_args, overrides):
    """Every check that needs no data, before any is read; nothing is written.

    Raises `UsageError` / `ValueError` naming the flag: a model configuration that cannot be built, missing data
    sources or files, an output folder that holds another run, a checkpoint that cannot be resumed from."""
    check_model_config(model_args, data_args, overrides)
    _check_data_sources(data_args, training_args, finish_args)
    if data_args.tokenizer_name:
        check_tokenizer_folder(data_args, model_args.model_name_or_path)
    if training_args.push_to_hub:
        if data_args.separate_vocabularies:
            raise UsageError(
                "--push_to_hub publishes a model with one shared tokenizer: not with --separate_vocabularies"
            )
        with naming(
            "--hub_model_id"
            if training_args.hub_model_id
            else "--push_to_hub (without --hub_model_id, the --output_dir name)"
        ):
            check_repo_id(training_args.hub_model_id or Path(training_args.output_dir).name)
    take_run_folder(training_args, claim=False)


def take_run_folder(training_args, claim=True):
    """The checkpoint to resume from, chosen under the run's lock on `--output_dir` (`run_folder.take_output_dir`),
    which the main process takes (`claim`) once the data is read: a command refused before that creates nothing.
    A refused checkpoint leaves the folder as it was."""
    if training_args.process_index:  # not the main process
        return resume_checkpoint(training_args)
    return take_output_dir(
        training_args.output_dir,
        training_args.overwrite_output_dir,
        asks_to_resume(training_args.resume_from_checkpoint),
        check=lambda: resume_checkpoint(training_args),
        claim=claim,
    )


def resume_checkpoint(training_args, tokenizer_digest=None):
    """The checkpoint `--resume_from_checkpoint` names or finds (`checkpoints.resolve_resume_checkpoint`), one of the
    tokenizers of `tokenizer_digest` when given; its checkpoints hold the optimizer's, schedule's and random state
    that a resumed run needs but with --save_only_model (DeepSpeed keeps its own)."""
    with naming("--resume_from_checkpoint"):
        return resolve_resume_checkpoint(
            training_args.resume_from_checkpoint,
            training_args.output_dir,
            not training_args.save_only_model and not training_args.deepspeed,  # the training state is needed
            tokenizer_digest,
        )
