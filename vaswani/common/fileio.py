"""Every file a tool writes appears whole or not at all.

A file is written to a temporary sibling (`.<name>.<random>.tmp`, same folder, so the same file system), flushed to
disk and renamed over its destination: a reader, a kill at any moment or a second process writing the same path sees
the old complete file or the new complete file, never a prefix or a mix (POSIX `rename` is atomic). A folder is built
the same way, beside its destination, and swapped in by two renames.

- `atomic_write(path)`: a context manager yielding the open temporary file (text or binary).
- `write_json(path, value)`: the usual one-liner on top of it.
- `atomic_folder(path)`: a context manager yielding a temporary folder that replaces `path` on success.
- `replace_files(source_dir, destination_dir)`: move every file of a folder built beside `destination_dir` into it, one
  atomic rename per file (for folders that also hold other things, such as a run folder).

And what a tool reads, checked before any work starts: `read_json(path)` names the file that is not valid JSON,
`check_input_file(path, flag)` and `check_input_folder(path, flag)` name the flag of a path that is not there.
"""

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path


def _fsync_folder(folder):
    """Make a rename in `folder` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


@contextlib.contextmanager
def atomic_write(path, mode="w"):
    """Open a temporary sibling of `path` for writing; on a clean exit it replaces `path`, on an error it is removed.

    `mode` is "w" (UTF-8 text, "\\n" line ends) or "wb". The parent folder is created if needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    text = {"encoding": "utf-8", "newline": "\n"} if mode == "w" else {}
    try:
        with os.fdopen(descriptor, mode, **text) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _umask():
    current = os.umask(0)
    os.umask(current)
    return current


def follow_umask(folder):
    """Give `folder` and everything in it the permissions of new files and folders under the process' umask.
    Libraries write some files privately (safetensors saves its weights 0600, `mkdtemp` makes folders 0700); what a
    tool publishes by renaming it into place must be readable as any file its user writes."""
    mask = _umask()
    for path in [Path(folder), *Path(folder).rglob("*")]:
        if path.is_symlink():
            continue
        executable = path.is_dir() or os.stat(path).st_mode & 0o111
        os.chmod(path, (0o777 if executable else 0o666) & ~mask)


def write_json(path, value):
    """Write `value` as indented JSON (UTF-8, "\\n" line ends) to `path` atomically."""
    with atomic_write(path) as handle:
        handle.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def temporary_sibling(path, tag="tmp"):
    """A new empty folder beside `path` (same file system), for building what will be renamed to `path`. `mkdtemp`
    makes it 0700: `atomic_folder` and `replace_files` give what they rename into place the permissions of any new
    file under the process' umask (`follow_umask`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.{tag}-", dir=path.parent))


@contextlib.contextmanager
def atomic_folder(path):
    """Yield a temporary folder to fill; on a clean exit it becomes `path`, replacing any folder there.

    The old folder is first renamed aside, then the new one into place, then the old one is deleted: a kill at any
    point leaves `path` either the old complete folder, the new complete folder, or absent (with the old one beside
    it as `.<name>.old-*`), never a mix of both.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a folder")
    building = temporary_sibling(path)
    try:
        yield building
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    follow_umask(building)
    old = None
    if path.exists():
        old = temporary_sibling(path, "old")
        os.replace(path, old / path.name)
    os.replace(building, path)
    _fsync_folder(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def replace_files(source_dir, destination_dir):
    """Move every file under `source_dir` to the same relative path under `destination_dir`, each by one atomic
    rename (so each file is old or new, never torn), then remove `source_dir`.

    `source_dir` must be on the same file system (build it with `temporary_sibling`).
    """
    source_dir, destination_dir = Path(source_dir), Path(destination_dir)
    follow_umask(source_dir)
    for source in sorted(p for p in source_dir.rglob("*") if p.is_file()):
        target = destination_dir / source.relative_to(source_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
    _fsync_folder(destination_dir)
    shutil.rmtree(source_dir, ignore_errors=True)


def read_json(path):
    """The JSON value in the file `path`; a file that is not UTF-8 JSON (cut short, edited by hand) raises `ValueError`
    naming it and where the parser stopped."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # UnicodeDecodeError included
        raise ValueError(f"{path} is not valid JSON ({error}): repair or replace the file") from None


def check_input_file(path, flag):
    """Raise `UsageError` naming `--flag` unless `path` is a file that can be read ("-", standard input, and None
    pass; so does a pipe such as bash's `<(zcat file.gz)`): checked before a model is loaded, so that a typo costs no
    minute of loading."""
    from .errors import UsageError  # here: this module also loads alone, without its package

    if path is None or str(path) == "-":
        return
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--{flag} {path} is a folder: give a file")
    if not path.exists():
        raise UsageError(f"--{flag} {path}: no such file")
    if not os.access(path, os.R_OK):
        raise UsageError(f"--{flag} {path}: the file cannot be read (permission denied)")


def check_input_folder(path, flag):
    """Raise `UsageError` naming `--flag` unless `path` (when given) is an existing folder."""
    from .errors import UsageError

    if path is None:
        return
    path = Path(path)
    if path.is_file():
        raise UsageError(f"--{flag} {path} is a file: give a folder")
    if not path.is_dir():
        raise UsageError(f"--{flag} {path}: no such folder")
