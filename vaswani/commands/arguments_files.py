"""Arguments files: `<prog> args.yaml` (or `.json`, or `--args_file FILE`) reads a tool's flags from a JSON or YAML
mapping `{flag_name: value}`, and flags given on the command line override it (`vaswani.commands.cli.parse_args` puts
each file's flags, `file_tokens`, before the command line). A file's flags are read as the command line's:
`HfArgumentParser` converts and refuses a value as it does the same flag typed, and a file's own mistakes (a flag the
tool lacks, two names of one flag with different values) are named with the file before any work starts."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from ..common.errors import UsageError

logger = logging.getLogger(__name__)

ARGS_FILE_FLAG = "--args_file"
ARGS_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def read_arguments_file(path: str | os.PathLike) -> dict[str, object]:
    """The mapping `{flag_name: value}` of a JSON or YAML file, without the entries whose value is `null`.

    A value is a scalar, a list of scalars (a flag that takes several values) or a mapping (given to the flag as its
    JSON text, for flags such as `--fsdp_config`). Raises `UsageError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"Arguments file {path} does not exist.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"Arguments file {path} is not UTF-8 text: {error.reason} at byte {error.start}"
        ) from None
    if path.suffix == ".json":
        try:
            values = json.loads(text)
        except ValueError as error:
            raise UsageError(f"Arguments file {path} is not valid JSON: {error}") from None
    else:
        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise UsageError(
                f"Arguments file {path} is not valid YAML: {' '.join(str(error).split())}"
            ) from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise UsageError(f"Arguments file {path} must hold a mapping of flag names to values.")
    mapping = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key.strip("-"):
            raise UsageError(f"Arguments file {path}: {key!r} is not a flag name.")
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            if not value:
                raise UsageError(f"Arguments file {path}: {key} is an empty list.")
            for item in value:
                _check_scalar(path, key, item)
        elif not isinstance(value, dict):
            _check_scalar(path, key, value)
        mapping[key.lstrip("-")] = value
    return mapping


def _check_scalar(path: Path, key: str, value) -> None:
    if isinstance(value, (dict, list)):
        raise UsageError(f"Arguments file {path}: {key} holds a nested {type(value).__name__}.")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"Arguments file {path}: {key} is {value}.")


def _as_text(value) -> str:
    """A file's value as it would be written on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, dict) else str(value)


def file_tokens(parser: argparse.ArgumentParser, path: str, renamed: Mapping[str, str]) -> list[str]:
    """The flags of the arguments file `path` as a command line: `--flag=value`, or `--flag value ...` for a flag that
    takes several values; a list for a flag of one value is refused."""
    tokens = []
    for key, value in read_arguments_file(path).items():
        texts = [_as_text(v) for v in value] if isinstance(value, (list, tuple)) else [_as_text(value)]
        action = parser._option_string_actions.get(f"--{renamed.get(key, key)}")
        if len(texts) > 1 and action is not None and action.nargs in (None, "?"):
            parser.error(f"argument --{action.dest}: expected one argument, got {len(texts)} ({path})")
        tokens += [f"--{key}={texts[0]}"] if len(texts) == 1 else [f"--{key}", *texts]
    return tokens
