"""What every command-line tool of the package shares: how it parses flags, reports errors and logs.

A tool is a function `main(argv)` decorated with `command`, whose flags are dataclasses parsed by `parse_args`:

    from vaswani.cli import command, parse_args, setup_logging

    @command("vaswani-export")
    def main(argv):
        (args,) = parse_args(ExportArguments, argv, description="Export a model folder to CTranslate2 or ONNX.")
        setup_logging()
        ...

    # pyproject.toml: [project.scripts] vaswani-export = "vaswani.export:main"; main(argv=None) reads sys.argv.

The conventions, the same in every tool:

- Errors: library code raises (`ValueError`, `OSError`, ...) with a message that names the file, line or flag; the tool
  prints `<prog>: error: <message>` on one line of standard error and exits with status 1 (2 for a wrong command line,
  `UsageError`), without a traceback. `--debug` (or `VASWANI_DEBUG=1`) lets the exception through with its traceback.
- Flags: `--name value` and `--name=value`; the flag names of transformers' `run_translation.py` where the meaning is
  the same. A renamed flag keeps working under its old name, with a warning naming the new one.
- Arguments file: `<prog> args.yaml` (or `.json`, or `--args_file FILE`) reads flags from a JSON or YAML mapping
  `{flag_name: value}`; flags given on the command line after it override the file.
- `--help` is short and grouped; a tool with many flags (training) also has `--help_all`.
- Logs: `setup_logging()` gives this package's INFO messages and everyone else's warnings on standard error, no
  `datasets` progress bars; `--verbose` gives transformers' and datasets' INFO logs and bars too.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from transformers import HfArgumentParser

from .errors import UsageError, describe_error, flag_errors

logger = logging.getLogger(__name__)

ARGS_FILE_FLAG = "--args_file"
ARGS_FILE_SUFFIXES = (".json", ".yaml", ".yml")
DEBUG_FLAG = "--debug"
VERBOSE_FLAG = "--verbose"
HELP_ALL_FLAG = "--help_all"
DEBUG_ENVIRONMENT = "VASWANI_DEBUG"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The values of transformers' own `--debug` training flag: `--debug underflow_overflow` stays the Trainer's.
_TRAINER_DEBUG_VALUES = ("underflow_overflow", "tpu_metrics_debug")


@dataclasses.dataclass
class _Invocation:
    prog: str
    debug: bool = False
    verbose: bool = False


_current = _Invocation(prog=Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "vaswani")


def current_prog() -> str:
    """The name of the running tool (`vaswani-train`, ...), for messages."""
    return _current.prog


def verbose() -> bool:
    """Whether the running tool was given `--verbose`."""
    return _current.verbose


def _take_flag(argv: list[str], flag: str, keep_if_followed_by: Collection[str] = ()) -> bool:
    """Remove every bare `flag` from `argv` (not one followed by one of `keep_if_followed_by`); whether any was."""
    found, i = False, 0
    while i < len(argv):
        if argv[i] == flag and not (i + 1 < len(argv) and argv[i + 1] in keep_if_followed_by):
            del argv[i]
            found = True
        else:
            i += 1
    return found


def command(prog: str) -> Callable:
    """Decorate a tool's `main(argv)`; the result is `main(argv=None)`, which returns what `main` returns, or exits
    with a one-line error (see the module docstring). Called without `argv` (as a console command, whose wrapper
    exits with the return value), it reads `sys.argv[1:]` and returns None. `--debug` and `--verbose` are taken off
    the arguments here, before `main` sees them."""

    def decorate(main: Callable) -> Callable:
        @functools.wraps(main)
        def run(argv: Sequence[str] | None = None):
            global _current
            arguments = list(sys.argv[1:] if argv is None else argv)
            debug = _take_flag(arguments, DEBUG_FLAG, keep_if_followed_by=_TRAINER_DEBUG_VALUES)
            debug = debug or os.environ.get(DEBUG_ENVIRONMENT, "").lower() in ("1", "true", "yes")
            previous = _current
            _current = _Invocation(prog=prog, debug=debug, verbose=_take_flag(arguments, VERBOSE_FLAG))
            try:
                result = main(arguments)
                return None if argv is None else result
            except KeyboardInterrupt:
                if debug:
                    raise
                print(f"{prog}: interrupted", file=sys.stderr)
                raise SystemExit(130) from None
            except Exception as error:
                if debug:
                    raise
                print(f"{prog}: error: {describe_error(error)}", file=sys.stderr)
                raise SystemExit(2 if isinstance(error, UsageError) else 1) from None
            finally:
                _current = previous

        return run

    return decorate


# ---------------------------------------------------------------------------------------------------------------------
# Arguments files
# ---------------------------------------------------------------------------------------------------------------------
def read_arguments_file(path: str | os.PathLike) -> list[str]:
    """The flags of a JSON or YAML file holding one mapping `{flag_name: value}`, as command-line tokens.

    `true`/`false` give `--flag true`/`--flag false`, a list gives `--flag a b c`, a mapping gives its JSON text
    (for flags such as `--fsdp_config`), `null` leaves the flag out. Raises `UsageError` naming the file.
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
        import yaml

        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise UsageError(
                f"Arguments file {path} is not valid YAML: {' '.join(str(error).split())}"
            ) from None
    if values is None:
        return []
    if not isinstance(values, dict):
        raise UsageError(f"Arguments file {path} must hold a mapping of flag names to values.")
    tokens: list[str] = []
    for key, value in values.items():
        if not isinstance(key, str) or not key.strip("-"):
            raise UsageError(f"Arguments file {path}: {key!r} is not a flag name.")
        flag = "--" + key.lstrip("-")
        if value is None:
            continue
        if isinstance(value, bool):
            tokens += [flag, "true" if value else "false"]
        elif isinstance(value, (list, tuple)):
            if not value:
                raise UsageError(f"Arguments file {path}: {key} is an empty list.")
            tokens += [flag, *(_scalar(path, key, item) for item in value)]
        elif isinstance(value, dict):
            tokens += [flag, json.dumps(value)]
        else:
            tokens += [flag, _scalar(path, key, value)]
    return tokens


def _scalar(path: Path, key: str, value) -> str:
    if isinstance(value, (dict, list)):
        raise UsageError(f"Arguments file {path}: {key} holds a nested {type(value).__name__}.")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"Arguments file {path}: {key} is {value}.")
    return str(value).lower() if isinstance(value, bool) else str(value)


def expand_arguments_file(argv: Sequence[str]) -> list[str]:
    """`argv` with an arguments file (a first argument ending in .json/.yaml/.yml, or `--args_file FILE` anywhere)
    replaced by its flags, in place, so that later flags override it."""
    argv = list(argv)
    if argv and not argv[0].startswith("-") and argv[0].endswith(ARGS_FILE_SUFFIXES):
        argv[:1] = read_arguments_file(argv[0])
    expanded: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == ARGS_FILE_FLAG or token.startswith(ARGS_FILE_FLAG + "="):
            if "=" in token:
                path = token.split("=", 1)[1]
                i += 1
            elif i + 1 < len(argv):
                path = argv[i + 1]
                i += 2
            else:
                raise UsageError(f"{ARGS_FILE_FLAG} needs a file name.")
            expanded += read_arguments_file(path)
            continue
        expanded.append(token)
        i += 1
    return expanded


# ---------------------------------------------------------------------------------------------------------------------
# Renamed flags
# ---------------------------------------------------------------------------------------------------------------------
def rename_flags(argv: Sequence[str], renamed: Mapping[str, str]) -> list[str]:
    """`argv` with deprecated flag names (`renamed`: old name -> new name, without dashes) replaced, each with a
    warning. `--old`, `--old=value`, `--old-name` and `--no_old` (for a boolean) are all recognised."""
    if not renamed:
        return list(argv)
    result = []
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            name, equals, value = token[2:].partition("=")
            key = name.replace("-", "_")
            negated = key.startswith("no_") and key[3:] in renamed and key not in renamed
            old = key[3:] if negated else key
            if old in renamed:
                new = ("no_" if negated else "") + renamed[old]
                logger.warning("--%s is deprecated; use --%s", key, new)
                token = f"--{new}{equals}{value}"
        result.append(token)
    return result


# ---------------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------------
class _Parser(HfArgumentParser):
    """`HfArgumentParser` whose errors raise `UsageError` (one line) instead of printing the whole usage and exiting."""

    def error(self, message):
        message = re.sub(
            r"(--\w+)/--[\w-]+", r"\1", message
        )  # not the `--flag-name` spelling beside each flag
        raise UsageError(f"{message} ({self.prog} --help lists the flags)")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _format_action_invocation(self, action):
        # `--d_model D_MODEL`, without the `--d-model` spelling that HfArgumentParser adds to every flag
        if not action.option_strings:
            return super()._format_action_invocation(action)
        names = []
        for name in action.option_strings:
            core = name.lstrip("-")
            underscored = name[: len(name) - len(core)] + core.replace("-", "_")
            if underscored == name or underscored not in action.option_strings:
                names.append(name)
        if action.nargs == 0:
            return ", ".join(names)
        metavar = self._format_args(action, self._get_default_metavar_for_optional(action))
        return ", ".join(f"{name} {metavar}" for name in names)

    def _get_help_string(self, action):
        # "(default: None)" and "(default: False)" on every optional flag say nothing.
        if action.default in (None, False, argparse.SUPPRESS) or action.help is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def build_parser(
    dataclass_types: Sequence[type] | type,
    *,
    description: str,
    epilog: str | None = None,
    sections: Mapping[str, Sequence[str]] | None = None,
    brief: Collection[type] = (),
    full_help: bool = False,
    helps: Mapping[str, str] | None = None,
) -> HfArgumentParser:
    """The parser of a tool. `sections` (title -> flag names) regroups flags under their own titles in `--help`;
    the flags of the dataclasses in `brief` that no section names are hidden from `--help` and listed by
    `--help_all` (`full_help`). `helps` (flag name -> text) replaces the help of flags whose own is long-winded.
    `description` and `epilog` are printed as written."""
    types = list(dataclass_types) if isinstance(dataclass_types, (list, tuple)) else [dataclass_types]
    parser = _Parser(
        types,
        prog=current_prog(),
        description=description,
        epilog=epilog,
        formatter_class=_HelpFormatter,
        usage=f"%(prog)s [ARGS.yaml | {ARGS_FILE_FLAG} FILE] [--flag value ...]",
    )
    common = parser.add_argument_group("common to every vaswani tool")
    common.add_argument(
        ARGS_FILE_FLAG,
        metavar="FILE",
        help="read flags from a JSON or YAML mapping {flag: value}; later flags override it",
    )
    trainer_debug = next((a for a in parser._actions if DEBUG_FLAG in a.option_strings), None)
    if trainer_debug is None:
        common.add_argument(DEBUG_FLAG, action="store_true", help="show the traceback of an error")
    else:  # transformers' own --debug takes a value; a bare --debug is ours (`command` takes it off)
        trainer_debug.help = "bare: show the traceback of an error; with a value: transformers' debug modes"
        _move(parser, trainer_debug, common)
    common.add_argument(VERBOSE_FLAG, action="store_true", help="INFO logs of transformers and datasets too")
    if brief:
        common.add_argument(HELP_ALL_FLAG, action="store_true", help="list every flag")
    parser._own_dests = {a.dest for a in common._group_actions if a is not trainer_debug}
    hidden_dests = set()
    for dtype in brief:
        hidden_dests |= {f.name for f in dataclasses.fields(dtype) if f.init}
    hidden_dests.discard("debug")
    for title, names in (sections or {}).items():
        group = parser.add_argument_group(title)
        for name in names:
            # the flag, then the `--no_<flag>` complement of a boolean flag
            for action in [a for a in parser._actions if a.dest == name]:
                _move(parser, action, group)
            hidden_dests.discard(name)
    for action in parser._actions:
        if action.dest in (helps or {}) and action.help is not argparse.SUPPRESS:
            action.help = helps[action.dest]
    if not full_help:
        for action in parser._actions:
            if action.dest in hidden_dests:
                action.help = argparse.SUPPRESS
    # Groups left without a visible flag are dropped from the help.
    parser._action_groups = [
        g
        for g in parser._action_groups
        if any(a.help is not argparse.SUPPRESS for a in g._group_actions)
        or g.title in ("positional arguments",)
    ]
    return parser


def _move(parser: argparse.ArgumentParser, action: argparse.Action, group) -> None:
    for old_group in parser._action_groups:
        if action in old_group._group_actions:
            old_group._group_actions.remove(action)
    group._group_actions.append(action)


def parse_args(
    dataclass_types: Sequence[type] | type,
    argv: Sequence[str] | None,
    *,
    description: str,
    epilog: str | None = None,
    renamed: Mapping[str, str] | None = None,
    sections: Mapping[str, Sequence[str]] | None = None,
    brief: Collection[type] = (),
    helps: Mapping[str, str] | None = None,
) -> tuple:
    """Parse `argv` (None: `sys.argv[1:]`) into instances of `dataclass_types`, in their order.

    An arguments file is expanded first, then renamed flags are translated (`renamed`: old -> new name), then
    argparse parses; an unknown flag or a bad value raises `UsageError`, and a dataclass whose `__post_init__`
    rejects a value raises its own `ValueError`. See `build_parser` for `sections`, `brief` and `helps`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = rename_flags(expand_arguments_file(argv), renamed or {})
    parser = build_parser(
        dataclass_types,
        description=description,
        epilog=epilog,
        sections=sections,
        brief=brief,
        full_help=HELP_ALL_FLAG in argv,
        helps=helps,
    )
    if HELP_ALL_FLAG in argv:
        parser.print_help()
        raise SystemExit(0)
    namespace = parser.parse_args(argv)
    for dest in parser._own_dests:
        namespace.__dict__.pop(dest, None)
    outputs = []
    for dtype in parser.dataclass_types:
        keys = {f.name for f in dataclasses.fields(dtype) if f.init}
        inputs = {k: v for k, v in vars(namespace).items() if k in keys}
        outputs.append(dtype(**inputs))
    return tuple(outputs)


# ---------------------------------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------------------------------
class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of each message (a tool called twice in one process, or under
    a test's capture, logs where standard error is now)."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def setup_logging(main_process: bool = True) -> None:
    """Quiet logs on standard error: this package's INFO messages, warnings from everyone else, no progress bars of
    transformers' loading and saving or of `datasets`; with `--verbose`, transformers' and datasets' INFO logs and bars as well. Processes other than
    the main one of a distributed run log warnings only."""
    import datasets
    import transformers

    level = logging.INFO if main_process else logging.WARNING
    root = logging.getLogger()
    if not any(isinstance(handler, _StderrHandler) for handler in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("vaswani").setLevel(level)
    logging.captureWarnings(True)
    if verbose() and main_process:
        transformers.utils.logging.set_verbosity_info()
        transformers.utils.logging.enable_progress_bar()
        datasets.utils.logging.set_verbosity_info()
        datasets.enable_progress_bars()
    else:
        transformers.utils.logging.set_verbosity_warning()
        transformers.utils.logging.disable_progress_bar()  # "Loading weights", "Writing model shards"
        datasets.utils.logging.set_verbosity_warning()
        datasets.disable_progress_bars()


__all__ = [
    "UsageError",
    "build_parser",
    "command",
    "current_prog",
    "describe_error",
    "expand_arguments_file",
    "flag_errors",
    "parse_args",
    "read_arguments_file",
    "rename_flags",
    "setup_logging",
    "verbose",
]
