"""Arguments files: `<prog> args.yaml` (or `.json`, or `--args_file FILE`) reads a tool's flags from a JSON or YAML
mapping `{flag_name: value}`, and flags given on the command line override it (`vaswani.commands.cli.parse_args`
calls `split_arguments_files`, then `apply_arguments_files`). Values are converted as argparse converts the same flag
on the command line, and a file's mistakes (a flag the tool lacks, a value outside its choices, two names of one flag
with different values) are named with the file before any work starts."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import logging
import math
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml
from transformers import HfArgumentParser  # transformers.hf_argparser: light, without torch

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


def split_arguments_files(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The arguments files of `argv` (a first argument ending in .json/.yaml/.yml, and every `--args_file FILE`),
    and the rest of `argv`."""
    argv = list(argv)
    files = []
    if argv and not argv[0].startswith("-") and argv[0].endswith(ARGS_FILE_SUFFIXES):
        files.append(argv.pop(0))
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == ARGS_FILE_FLAG or token.startswith(ARGS_FILE_FLAG + "="):
            if "=" in token:
                files.append(token.split("=", 1)[1])
                i += 1
            elif i + 1 < len(argv):
                files.append(argv[i + 1])
                i += 2
            else:
                raise UsageError(f"{ARGS_FILE_FLAG} needs a file name.")
            continue
        rest.append(token)
        i += 1
    return files, rest


def flag_fields(dataclass_types: Sequence[type]) -> dict[str, tuple[dataclasses.Field, object]]:
    """Every flag of the dataclasses: its field and its resolved annotation."""
    found = {}
    for dtype in dataclass_types:
        hints = typing.get_type_hints(dtype)
        for item in dataclasses.fields(dtype):
            if item.init:
                found[item.name] = (item, hints[item.name])
    return found


def _aliases(fields: Mapping[str, tuple[dataclasses.Field, object]]) -> dict[str, str]:
    """Each flag's other names (a field's `aliases` metadata, e.g. fairseq's `--lr`): alias -> field name."""
    found = {}
    for name, (item, _) in fields.items():
        aliases = item.metadata.get("aliases", ())
        for alias in [aliases] if isinstance(aliases, str) else aliases:
            found[alias.lstrip("-").replace("-", "_")] = name
    return found


def _members(hint) -> tuple:
    """The types of an annotation, `X | Y | None` taken apart."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _takes_a_list(hint) -> bool:
    return any(typing.get_origin(member) is list for member in _members(hint))


def _choices(item: dataclasses.Field, hint) -> list[str] | None:
    """The values a flag accepts, as `HfArgumentParser` restricts them: its `choices`, or an Enum's values."""
    if "choices" in item.metadata:
        return [str(choice) for choice in item.metadata["choices"]]
    for member in _members(hint):
        if isinstance(member, type) and issubclass(member, enum.Enum):
            return [str(choice.value) for choice in member]
        if typing.get_origin(member) is typing.Literal:
            return [str(choice) for choice in typing.get_args(member)]
    return None


def apply_arguments_files(
    parser: HfArgumentParser, files: Sequence[str], argv: Sequence[str], renamed: Mapping[str, str]
) -> list[str]:
    """Give the flags of the arguments `files` (later files first) to `parser`, so that `argv`'s flags override
    them; returns the command line to parse.

    `HfArgumentParser.parse_yaml_file`/`parse_json_file` fill the dataclasses without argparse: no type conversion
    (YAML reads `1e-3` as a string) and no command line over the file. Here the values become the parser's defaults
    (`set_defaults`): argparse converts a string default with the flag's type, as it converts a command-line value,
    and any flag on the command line wins. A flag the parser requires, or one that takes several values, is put in
    front of the command line instead (argparse reads those only there), where a later flag still wins.
    """
    fields = flag_fields(parser.dataclass_types)
    aliases = _aliases(fields)
    defaults: dict[str, str] = {}
    tokens: dict[str, list[str]] = {}
    for path in files:
        values = read_arguments_file(path)
        if "lenpen" in values and "length_penalty" in values:
            raise UsageError(
                f"Arguments file {path}: lenpen is fairseq's name of length_penalty: give one of them"
            )
        if "lenpen" in values and "length_penalty_form" in fields:
            form = values.get("length_penalty_form", "power")
            if form != "power":
                raise UsageError(
                    f"Arguments file {path}: lenpen is fairseq's length penalty |Y| ** alpha "
                    f"(length_penalty_form power), but length_penalty_form is {form!r}"
                )
            values = {**values, "length_penalty": values.pop("lenpen"), "length_penalty_form": "power"}
        given: dict[str, tuple[str, object]] = {}  # this file's flags: name -> (key, value)
        for key, value in values.items():
            name = key.replace("-", "_")
            name = aliases.get(name, name)
            if name in renamed:
                logger.warning("%s: %s is deprecated; use %s", path, name, renamed[name])
                name = renamed[name]
            if name not in fields:
                raise UsageError(
                    f"Arguments file {path}: {key} is not a flag of {parser.prog} "
                    f"({parser.prog} --help lists the flags)"
                )
            item, hint = fields[name]
            texts = [_as_text(v) for v in value] if isinstance(value, (list, tuple)) else [_as_text(value)]
            typed = typed_value(parser._option_string_actions[f"--{name}"], texts)
            if name in given and given[name][1] != typed:
                raise UsageError(
                    f"Arguments file {path}: {given[name][0]} and {key} are two names of one flag with different "
                    "values: give one of them"
                )
            given[name] = (key, typed)
            required = item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
            defaults.pop(name, None)
            tokens.pop(name, None)
            if required or _takes_a_list(hint):
                tokens[name] = [f"--{name}", *texts]
                continue
            if len(texts) > 1:
                parser.error(f"argument --{name}: expected one argument, got {len(texts)} ({path})")
            choices = _choices(item, hint)
            if choices is not None and texts[0] not in choices:
                parser.error(
                    f"argument --{name}: invalid choice: {texts[0]!r} (choose from "
                    f"{', '.join(map(repr, choices))})"
                )
            defaults[name] = texts[0]
    parser.set_defaults(**defaults)
    return [token for flag in tokens.values() for token in flag] + list(argv)


def typed_value(action: argparse.Action, texts: Sequence[str]):
    """The value an occurrence of `action` with the values `texts` gives, converted as argparse converts it (the
    texts themselves when a value does not convert: argparse reports that later)."""
    if not texts:
        return action.const  # --flag alone: store_true/store_false, or a switch (nargs "?")
    convert = action.type if callable(action.type) else str
    try:
        values = [convert(text) for text in texts]
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        values = list(texts)
    return values[0] if action.nargs in (None, "?") else tuple(values)
