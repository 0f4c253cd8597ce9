"""A run's checkpoints and how a run resumes from them: nothing is lost when a run is killed.

The Trainer writes `checkpoint-<step>` folders into the run's folder. `--resume_from_checkpoint last` continues the
run from the newest one that verifies (`resolve_resume_checkpoint`; a checkpoint cut short by a kill, without the
optimizer's, schedule's or random state, with weights that are not finite, with a `trainer_state.json` a resumed run
cannot rebuild, or saved with another tokenizer than the run's is skipped with a warning that names the reason; when
every checkpoint is refused for one reason, the error gives it), a folder resumes from that checkpoint once it
verifies (or is refused, with the reason), and `train_or_resume` trains from there: with the training clock the
checkpoint saved, or, for a run that had already reached `--max_steps`, nothing more than restoring its state and
final model.
"""

import inspect
import json
import logging
import shutil
import zipfile
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import EarlyStoppingCallback, TrainerControl, TrainerState

from ..common.fileio import replace_files, temporary_sibling
from .averaging import find_checkpoints as checkpoints  # a run's checkpoints, as finish.py names them
from .callbacks import RunTokenizer, TimedCheckpoints, TrainingClock, saved_args
from .model_folders import check_safetensors
from .tokenization import saved_tokenizer_digest

logger = logging.getLogger(__name__)

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
# The training state a resumed run needs beside the weights, as (what it is, the file names that hold it): without it,
# transformers restarts Adam, the schedule or the random streams in silence.
TRAINING_STATE = (
    ("the optimizer's state (Adam's moments)", ("optimizer.pt", "optimizer*.bin", "optimizer_*/")),
    ("the learning-rate schedule's state", ("scheduler.pt",)),
    ("the random state (dropout, data order)", ("rng_state.pth", "rng_state_*.pth")),
)
# The callbacks whose state trainer_state.json keeps (`stateful_callbacks`) and that a resumed run rebuilds from it
# (`train_or_resume`'s `TrainingClock`; transformers' `type(callback)(**args)` with
# --restore_callback_states_from_checkpoint).
STATEFUL_CALLBACKS = {
    cls.__name__: cls
    for cls in (TrainingClock, TimedCheckpoints, RunTokenizer, TrainerControl, EarlyStoppingCallback)
}


def _check_torch_archive(path):
    """Check a `torch.save` file without unpickling it: it is a zip archive (torch's format) whose every member's
    CRC matches, which a file cut short or damaged is not."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ValueError(f"Checkpoint file {path} is corrupt or truncated: {error}") from None
    if bad:  # the first bad member's name
        raise ValueError(f"Checkpoint file {path} is corrupt: member {bad} fails its CRC check")


def verify_checkpoint(folder, training_state=False, tokenizer_digest=None):
    """Raise `ValueError` naming the file when a checkpoint is incomplete, corrupt or truncated.

    Reads the safetensors headers and tensors, parses the JSON files, and checks the archives of the files the
    Trainer loads on resume (`TORCH_STATE_FILES`) without unpickling anything. For resuming, `training_state` also
    requires the optimizer's, schedule's and random state (`TRAINING_STATE`) and finite weights, and
    `tokenizer_digest` the tokenizer the checkpoint was saved with (`tokenizer_digest`; a checkpoint written before
    the digest was recorded is not checked).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Checkpoint folder {folder} does not exist.")
    for name in ("config.json", "generation_config.json", "trainer_state.json"):
        path = folder / name
        if not path.is_file():
            if name == "generation_config.json":  # the only optional one
                continue
            raise ValueError(f"Checkpoint {folder} is incomplete: {path} is missing.")
        try:
            parsed = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"Checkpoint file {path} is corrupt or truncated: {error}") from None
        if name == "trainer_state.json":
            check_trainer_state(path, parsed)
    saved = tokenizer_digest and saved_tokenizer_digest(folder)
    if saved and saved != tokenizer_digest:
        raise ValueError(
            f"Checkpoint {folder} was trained with another tokenizer than this run's (its token ids mean other "
            "tokens): resume with the run's own tokenizer (drop --tokenizer_name, or give the one it was trained "
            "with), or start a new run in another --output_dir"
        )
    if training_state:
        for what, patterns in TRAINING_STATE:
            if not any(any(folder.glob(pattern)) for pattern in patterns):
                raise ValueError(
                    f"Checkpoint {folder} is incomplete: it has no {patterns[0]}, {what}; resuming from it would "
                    "restart that state and train differently from the run it continues"
                )
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"Checkpoint {folder} is incomplete: no *.safetensors weights file.")
    for pattern in TORCH_STATE_FILES:
        for path in sorted(folder.glob(pattern)):
            _check_torch_archive(path)
    for path in weights:
        try:
            check_safetensors(path)
        except ValueError as error:
            raise ValueError(f"Checkpoint file {error}") from None
        # A run that diverged: training on from NaN or infinite weights trains nothing and saves a model that
        # outputs nothing.
        for key, tensor in load_file(path).items() if training_state else ():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise ValueError(
                    f"Checkpoint file {path} holds NaN or infinite weights ({key}): the run had diverged by then"
                )


def check_trainer_state(path, state):
    """Raise `ValueError` naming the file and the field when a `trainer_state.json` holds what a resumed run cannot
    rebuild: a field or value transformers' `TrainerState` does not take, or a saved callback state
    (`STATEFUL_CALLBACKS`) with a field or value its callback does not take. Resuming from it ended in a `TypeError`
    naming neither."""
    if not isinstance(state, dict):
        raise ValueError(f"Checkpoint file {path} is not a training state: it holds a {type(state).__name__}")
    checks = [(f"Checkpoint file {path} has", state, "transformers' TrainerState", TrainerState)]
    saved_callbacks = state.get("stateful_callbacks") or {}
    for name, saved in saved_callbacks.items() if isinstance(saved_callbacks, dict) else ():
        for entry in (saved if isinstance(saved, list) else [saved]) if name in STATEFUL_CALLBACKS else ():
            args = entry.get("args", {}) if isinstance(entry, dict) else None
            where = f"Checkpoint file {path} has in stateful_callbacks.{name}.args"
            checks.append((where, args, name, STATEFUL_CALLBACKS[name]))
    for where, given, owner, cls in checks:
        if not isinstance(given, dict):
            raise ValueError(f"{where} a {type(given).__name__}, not the fields of {owner}")
        accepted = [field for field in inspect.signature(cls).parameters if field != "clock"]  # no JSON
        if unknown := sorted(given.keys() - accepted):
            raise ValueError(
                f"{where} an unknown field {unknown[0]!r}: {owner} takes {', '.join(accepted) or 'none'}"
            )
        try:
            cls(**given)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where} a value {owner} does not take: {error}") from None


def resolve_resume_checkpoint(resume, output_dir, training_state=True, tokenizer_digest=None):
    """The checkpoint to resume from: an explicit folder (verified; an error names the reason) or, for
    `True`/"last", the newest checkpoint in `output_dir` that verifies (one cut short by a kill, without its
    training state, with weights that are not finite or of another tokenizer is skipped with a warning naming the
    reason, so the run loses at most one checkpoint interval). `training_state`: whether the run's checkpoints hold
    the optimizer's, schedule's and random state (not with `--save_only_model`); `tokenizer_digest`: the run's
    tokenizer (`tokenizer_digest`), None before it is known. A folder whose checkpoints are all unusable is refused rather
    than trained afresh among them."""
    if not asks_to_resume(resume):
        return None
    if resume not in (True, "True", "true", "last", "yes"):
        verify_checkpoint(resume, training_state, tokenizer_digest)
        return str(resume)
    candidates = checkpoints(output_dir)
    if not candidates:
        logger.warning("No checkpoint in %s: starting from scratch.", output_dir)
        return None
    reasons = {}  # each refused checkpoint's reason, its own path left out, so that equal reasons compare equal
    for candidate in reversed(candidates):
        try:
            verify_checkpoint(candidate, training_state, tokenizer_digest)
            return str(candidate)
        except ValueError as error:
            logger.warning("Skipping checkpoint %s: %s", candidate, error)
            reasons.setdefault(str(error).replace(str(candidate), ""), str(error))
    # Starting afresh would write new checkpoints among the old ones, and a later resume would mix them.
    why = "; the warnings above give each reason):"
    if len(reasons) == 1:  # the newest one's reason, which is every one's
        same = ", all for the same reason" if len(candidates) > 1 else ""
        why = f"){same}: {reasons.popitem()[1]};"
    raise ValueError(
        f"no checkpoint in {output_dir} can be resumed from ({', '.join(c.name for c in candidates)}{why} "
        "--overwrite_output_dir starts the run afresh"
    )


def asks_to_resume(resume):
    """Whether a `--resume_from_checkpoint` value continues a run (`last`, `true` or a checkpoint folder)."""
    return resume not in (None, False, "", "False", "false", "no")


def train_or_resume(trainer, checkpoint):
    """Train from scratch, or continue from `checkpoint` (as `resolve_resume_checkpoint` chose and verified it) with
    the training clock it saved (the training time counts every process of the run). Returns the Trainer's
    `TrainOutput`, or None when `checkpoint` had already reached `--max_steps`: then nothing is trained, the run takes
    the checkpoint's state (for the averaging and the learning curves) and keeps its final model, restored from the
    checkpoint only if the run was killed before writing it."""
    if checkpoint is None:
        return trainer.train()
    state = TrainerState.load_from_json(f"{checkpoint}/trainer_state.json")
    clock = saved_args(state.stateful_callbacks, "TrainingClock")
    if clock is None:
        logger.warning(
            "%s holds no training clock: the training time reported counts from this resumption only",
            checkpoint,
        )
    trainer.pop_callback(TrainingClock)
    trainer.add_callback(TrainingClock(**(clock or {})))  # its fields were checked by `check_trainer_state`
    if not 0 < trainer.args.max_steps <= state.global_step:
        logger.info("Resuming from %s (step %d)", checkpoint, state.global_step)
        return trainer.train(resume_from_checkpoint=checkpoint)
    trainer.state = state
    logger.info(
        "%s already reached --max_steps %d (step %d): nothing left to train",
        checkpoint,
        trainer.args.max_steps,
        state.global_step,
    )
    output_dir = Path(trainer.args.output_dir)
    if trainer.is_world_process_zero() and not (output_dir / "model.safetensors").is_file():
        building = temporary_sibling(output_dir)
        # the checkpoint's model folder, without its training state
        training_state = shutil.ignore_patterns(
            "*.pt", "*.pth", "*.bin", "trainer_state.json", "optimizer_*", "pytorch_model_fsdp*"
        )
        shutil.copytree(checkpoint, building, ignore=training_state, dirs_exist_ok=True)
        replace_files(building, output_dir)
        logger.info("Restored the final model of %s from %s", output_dir, checkpoint)
    return None
