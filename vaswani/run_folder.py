"""A run's folder (`--output_dir`) belongs to one run: `claim_output_dir` refuses a folder that holds another run's
files unless the run continues it or replaces it, and then removes exactly what this tool wrote there (`RUN_ENTRIES`).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
from pathlib import Path

from .errors import UsageError

logger = logging.getLogger(__name__)

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
