"""A run's folder (`--output_dir`) belongs to one run at a time, and `vaswani-train` deletes nothing in it that a run
did not write.

- `take_output_dir` locks the folder for the run (an exclusive `flock` on `.vaswani-run.lock` inside it, held until
  `release_output_dir` or the process ends, a SIGKILL too), so that a second run into the same folder is refused at
  once instead of mixing its checkpoints with the first's; then it claims the folder. A refused command changes
  nothing there: the lock file names the process that holds it only once the folder is that run's.
- A run marks the folder it claims (`.vaswani-run.json`). A folder that holds a run that trained (`TRAINED_EVIDENCE`: a
  checkpoint, the Trainer's state, a model, scores) is refused unless the run continues it (`--resume_from_checkpoint`)
  or replaces it (`--overwrite_output_dir`); a run that stopped before its first step (a bad input found after the
  tokenizer was trained) is replaced without asking. A folder that holds no run (no marker, no checkpoint or training
  state of a run from before the marker) is refused either way, naming a few of its entries: it is the user's.
- `--overwrite_output_dir` (transformers' flag, which never deletes anything there) removes only the files a run
  writes (`RUN_FILES`, `RUN_FOLDERS`, checked one by one: a `config.json` of another model, a `source/` folder without
  a tokenizer, a file a user put into a checkpoint stay) and says what it kept.
"""

import contextlib
import fnmatch
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from ..common.errors import UsageError
from ..common.fileio import read_json, write_json
from ..utils_vaswani import CODE_FILES
from .model_folders import first_names

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not locked there
    fcntl = None

logger = logging.getLogger(__name__)

MARKER = ".vaswani-run.json"
LOCK_FILE = ".vaswani-run.lock"

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vaswani_tokenizer_pair.json",
)
# A model folder as `save_pretrained` and the tools write it (paths relative to the folder).
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
    "training_args.bin",
    "*.hyp.*",
    "attention_*.png",
    *CODE_FILES,
    *TOKENIZER_FILES,
)
CHECKPOINT_FILES = (
    *MODEL_FILES,
    "trainer_state.json",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
    "rng_state.pth",
    "rng_state_*.pth",
    "pytorch_model_fsdp*",
    "optimizer*.bin",
    "optimizer_*/*",
)
# What a run writes, by top-level entry: a folder's files matching the patterns are the run's. `source` and `target`
# (separate tokenizers) are the run's only when they hold a tokenizer.
RUN_FOLDERS = {
    "checkpoint-[0-9]*": CHECKPOINT_FILES,
    "averaged": MODEL_FILES,
    "tokenizer": (
        *TOKENIZER_FILES,
        *(f"{side}/{name}" for side in ("source", "target") for name in TOKENIZER_FILES),
    ),
    "source": TOKENIZER_FILES,
    "target": TOKENIZER_FILES,
    "custom_generate": ("generate.py",),
    "runs": ("*events.out.tfevents.*",),  # transformers' TensorBoard logs (--report_to tensorboard)
}
RUN_FILES = (
    *MODEL_FILES,  # (those inside a folder match no top-level entry)
    "trainer_state.json",
    "training_summary.json",
    "test_results.json",
    "eval_results.json",
    "train_results.json",
    "all_results.json",
    "average_on_validation.json",
    "length_penalty_on_validation.json",
    "learning_curves.png",
)
# The run's folders that a later run deletes or replaces whole (checkpoints rotated by --save_total_limit, the averaged
# model, a newly trained tokenizer): a file of the user's inside one would not survive.
REPLACED_WHOLE = ("checkpoint-[0-9]*", "averaged", "tokenizer")
# Temporary siblings of what the tools write whole (`fileio`), and the scratch folder of the averages' choice.
TEMPORARIES = (".*.tmp*", ".*.old-*", ".average-*")
# What only a run that trained leaves (besides its checkpoint-* folders): a folder without any of it is not protected.
TRAINED_EVIDENCE = (
    "checkpoint-*",
    "trainer_state.json",
    "training_summary.json",
    "model*.safetensors*",
    "*_results.json",
    "averaged",
    "runs",
)
UNTRAINED = "replacing a run that saved nothing of its training (no checkpoint, model or score)"
OVERWRITE = "--overwrite_output_dir"

_held = {}  # the output folders this process has locked: resolved path -> descriptor


def lock_output_dir(output_dir):
    """Take the run's exclusive lock on `output_dir` (created if needed) and name this process in its lock file, or
    raise `UsageError` naming the folder and the process that holds it. The lock is the kernel's (`flock`): it ends
    with the process however it ends. A process that holds the lock already takes it again at no cost."""
    path = Path(output_dir)
    _lock(path)
    if path.resolve() in _held:  # (not where there is no flock)
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        # written through a descriptor of its own: the lock stays with the one `_lock` holds
        (path / LOCK_FILE).write_text(json.dumps(holder) + "\n")


def release_output_dir(output_dir):
    """Release the lock `lock_output_dir` took (nothing if this process holds none)."""
    descriptor = _held.pop(Path(output_dir).resolve(), None)
    if descriptor is not None:
        os.close(descriptor)  # closing the descriptor releases the flock


def _lock(path, create=True):
    """Take the lock on `path`, writing nothing into it but what is missing (the folder, an empty lock file), which is
    returned, newest first, so that a refusal can remove it again. With `create` false, only refuse a folder another
    process holds, creating and keeping nothing."""
    lock, key = path / LOCK_FILE, path.resolve()
    created = [item for item in (lock, path, *path.parents) if create and not item.exists()]
    if create:
        path.mkdir(parents=True, exist_ok=True)
    if fcntl is None or key in _held or not (create or lock.exists()):
        return created
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT if create else os.O_RDONLY, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = " (process {pid} on {host}, since {since})".format(**json.loads(lock.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            holder = ""
        os.close(descriptor)
        raise UsageError(
            f"--output_dir {path} is in use by another run{holder}: two runs in one folder would mix their "
            "checkpoints; wait for it to end, or choose another --output_dir"
        ) from None
    if create:
        _held[key] = descriptor
    else:
        os.close(descriptor)  # which releases the lock at once
    return created


def take_output_dir(output_dir, overwrite, resuming, check, claim=True):
    """Lock `output_dir` and make it this run's folder, marked (`MARKER`), once `check()` (choosing the checkpoint
    to resume from) has run under the lock; returns its result. The run continues (`resuming`) or replaces
    (`overwrite`, or a run that never trained: `_replacing`) the run in it. A refusal, or an error of `check`,
    changes nothing: the lock file names this process only once the folder is the run's, and a folder or lock file
    the lock created is removed again. With `claim` false it only refuses what it would refuse and returns `check()`,
    creating and writing nothing: the check before any data is read."""
    if overwrite and resuming:
        raise UsageError(
            "--overwrite_output_dir and --resume_from_checkpoint contradict each other: pick one"
        )
    path = Path(output_dir)
    entries = _entries(
        path, overwrite
    )  # a folder of the user's is refused before a lock file is written into it
    created = _lock(path, create=claim)
    try:
        replacing = _replacing(path, entries, overwrite, resuming)
        result = check()
    except BaseException:
        if claim:
            release_output_dir(path)
        for item in created:  # removed unless something else wrote there since
            with contextlib.suppress(OSError):
                item.unlink() if item.name == LOCK_FILE else item.rmdir()
        raise
    if claim:
        lock_output_dir(path)  # held already: names this process in the lock file
        if replacing:
            _remove_run(path, replacing)
        if replacing or not (path / MARKER).is_file():
            write_json(
                path / MARKER, {"written_by": "vaswani-train", "claimed": time.strftime("%Y-%m-%d %H:%M:%S")}
            )
    return result


def _replacing(path, entries, overwrite, resuming):
    """Why claiming `path`, which holds `entries` (`_entries`), replaces the run in it (`OVERWRITE` or `UNTRAINED`;
    None: the claim only marks it), or the `UsageError` that refuses it; nothing is written."""
    if not entries or resuming:
        return None
    if not overwrite and any(_matches(name, TRAINED_EVIDENCE) for name in entries):
        raise UsageError(
            f"--output_dir {path} already holds a run ({_shown(entries)}): continue it with "
            "--resume_from_checkpoint last, replace it with --overwrite_output_dir, or choose another --output_dir"
        )
    # A file of the user's inside a folder that a run replaces whole would be lost later: replacing is refused.
    inside = [
        item.relative_to(path).as_posix()
        for name in entries
        if _matches(name, REPLACED_WHOLE) and _real_folder(path / name)
        for item in _sort_out(path / name)[1]
    ]
    if inside:
        what = OVERWRITE if overwrite else f"--output_dir {path} ({UNTRAINED})"
        raise UsageError(
            f"{what}: {path} holds files that a run did not write inside folders a run replaces "
            f"whole ({_shown(inside)}); move them out of {path} first (nothing was removed)"
        )
    return OVERWRITE if overwrite else UNTRAINED


def _entries(path, overwrite):
    """The folder's entries (none for a new or empty folder), or `UsageError` naming a few when `path` is a file, or a
    folder that holds things but no run: no marker, no training state of a run from before the marker."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"--output_dir {path} is a file, not a folder")
    entries = sorted(set(os.listdir(path)) - {MARKER, LOCK_FILE}) if path.is_dir() else []
    states = (MARKER, "training_summary.json", "trainer_state.json", "checkpoint-*/trainer_state.json")
    if entries and not any(item.is_file() for state in states for item in path.glob(state)):
        extra = (
            " (--overwrite_output_dir removes only what a run wrote, never other files)" if overwrite else ""
        )
        raise UsageError(
            f"--output_dir {path} holds files that are not a vaswani run ({_shown(entries)}): a run trains into "
            f"an empty folder or its own; choose another --output_dir{extra}"
        )
    return entries


def _shown(names):
    return ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")


def _matches(name, patterns):
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _real_folder(item):
    return item.is_dir() and not item.is_symlink()


def _sort_out(entry):
    """The paths under `entry`, a top-level entry of a run's folder, that a run wrote, and the others. A run's folder
    (`RUN_FOLDERS`; `source` and `target` only when they hold a tokenizer) is sorted file by file by its patterns;
    anything else is the run's whole (a temporary, a link to a run's folder, a file in `RUN_FILES`, but for another
    model's `config.json`) or not at all."""
    name = entry.name
    if _real_folder(entry) and not _matches(name, TEMPORARIES):
        patterns = next(
            (files for pattern, files in RUN_FOLDERS.items() if fnmatch.fnmatchcase(name, pattern)), None
        )
        if not patterns or (name in ("source", "target") and not (entry / "tokenizer.json").is_file()):
            return [], [entry]
        ours, others = [], []
        for item in sorted(entry.rglob("*")):
            if not _real_folder(item):
                (ours if _matches(item.relative_to(entry).as_posix(), patterns) else others).append(item)
        return ours, others
    if name == "config.json" and not entry.is_symlink():
        try:
            ours = read_json(entry).get("model_type") == "vaswani"
        except (OSError, ValueError, AttributeError):
            ours = False
    else:
        ours = _matches(name, TEMPORARIES + RUN_FILES) or (entry.is_symlink() and _matches(name, RUN_FOLDERS))
    return ([entry], []) if ours else ([], [entry])


def _remove_run(path, why):
    """Delete the files an earlier run wrote into `path`, and nothing else (`_replacing` has refused a folder where
    that would lose a file of the user's later), the folders it empties with them; `why`: the reason, for the log."""
    removed, kept = [], []
    for entry in sorted(set(path.iterdir()) - {path / MARKER, path / LOCK_FILE}):
        ours, others = _sort_out(entry)
        for item in ours:
            shutil.rmtree(item) if _real_folder(item) else item.unlink()
            for folder in item.parents:  # the folders this emptied, up to the run's folder
                if folder == path or any(folder.iterdir()):
                    break
                folder.rmdir()
        kept += [item.relative_to(path).as_posix() for item in others]
        removed += [] if others else [entry.name]
    logger.info(
        "%s: removed the earlier run's %s from %s",
        why.capitalize(),  # (both reasons are lower-case)
        ", ".join(removed) or "nothing",
        path,
    )
    if kept:
        logger.warning(
            "Left in %s (not written by a vaswani run, so not removed by %s): %s", path, why, first_names(kept, 10)
        )
