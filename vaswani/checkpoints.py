"""A run's checkpoints and how a run resumes from them: nothing is lost when a run is killed.

The Trainer writes `checkpoint-<step>` folders into the run's folder. `--resume_from_checkpoint last` continues the
run from the newest one that verifies (`resolve_resume_checkpoint`; a checkpoint cut short by a kill is skipped), a
folder resumes from that checkpoint once it verifies, and `train_or_resume` trains from there: with the training
clock the checkpoint saved, or, for a run that had already reached `--max_steps`, nothing more than restoring its
state and final model (`restore_finished_run`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import zipfile
from pathlib import Path

from transformers import Trainer, TrainerState

from .averaging import check_safetensors, find_checkpoints
from .callbacks import TrainingClock
from .fileio import replace_files, temporary_sibling

logger = logging.getLogger(__name__)

# The values of `--resume_from_checkpoint` that start a run from scratch.
NO_RESUME = (None, False, "", "False", "false", "no")


def checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders of a run, oldest first (by step number); none when the folder is missing."""
    return find_checkpoints(run_dir) if Path(run_dir).is_dir() else []


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
    if not asks_to_resume(resume):
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


def asks_to_resume(resume: str | bool | None) -> bool:
    """Whether a `--resume_from_checkpoint` value continues a run (`last`, `true` or a checkpoint folder)."""
    return resume not in NO_RESUME


def train_or_resume(trainer: Trainer, checkpoint: str | None):
    """Train from scratch, or continue from `checkpoint` (as `resolve_resume_checkpoint` chose it) with the training
    clock it saved. Returns the Trainer's `TrainOutput`, or None when `checkpoint` had already reached
    `--max_steps`: then nothing is trained (`restore_finished_run`)."""
    if checkpoint is not None and 0 < trainer.args.max_steps <= checkpoint_step(checkpoint):
        restore_finished_run(trainer, checkpoint)
        return None
    if checkpoint is not None:  # the training time counts every process of the run
        trainer.pop_callback(TrainingClock)
        trainer.add_callback(TrainingClock.from_checkpoint(checkpoint))
    return trainer.train(resume_from_checkpoint=checkpoint)


def restore_finished_run(trainer: Trainer, checkpoint: str) -> None:
    """A run resumed from a checkpoint at or past --max_steps has nothing left to train: take its state (for the
    averaging and the learning curves), keep its final model, and restore that model from the checkpoint only if the
    run was killed before writing it."""
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
