"""What every command-line tool of the package shares: how it parses flags, reports errors and logs.

A tool is a function `main(argv)` in `vaswani.commands`, decorated with `command`, whose flags are dataclasses parsed
by `parse_args` (transformers' `HfArgumentParser`), followed by library calls:

    from vaswani.commands.cli import command, parse_args, setup_logging

    @command("vaswani-export")
    def main(argv):
        (args,) = parse_args(ExportArguments, argv, description="Export a model folder to CTranslate2 or ONNX.")
        setup_logging()
        return export(args.model_name_or_path, ...)

    # pyproject.toml: [project.scripts] vaswani-export = "vaswani.commands.export:main"; main(argv=None) reads sys.argv.

The conventions, the same in every tool:

- Errors: library code raises (`ValueError`, `OSError`, ...) with a message that names the file, line or flag; the tool
  prints `<prog>: error: <message>` on one line of standard error and exits with status 1 (2 for a wrong command line,
  `vaswani.common.errors.UsageError`), without a traceback. `--debug` (or `VASWANI_DEBUG=1`) lets the exception through
  with its traceback.
- Flags: `--name value` and `--name=value`, written out in full (a prefix of a flag is an error, never another flag);
  the flag names of transformers' `run_translation.py` where the meaning is the same, and fairseq's where it is the
  same too (`--lr`, `--beam`, `--nbest`; `--lenpen A` is `--length_penalty A --length_penalty_form power`, fairseq's
  |Y| ** A). A renamed flag keeps working under its old name, with a warning naming the new one. Two names of one
  flag given different values (`--lr 1e-4 --learning_rate 2e-4`, in one arguments file too) are refused by name
  (`refuse_conflicting_names`); one name given twice keeps argparse's rule, the last wins.
- Arguments file: `<prog> args.yaml` (or `.json`, or `--args_file FILE`) reads flags from a JSON or YAML mapping
  `{flag_name: value}`; flags given on the command line override it (`arguments_files.py`).
- `--help` lists every flag, grouped by dataclass (`_argument_group_name`), in the order of the dataclasses, then the
  flags common to every tool; a dataclass whose `_inherited_argument_group_name` is set lists the fields it inherits
  (transformers' Trainer flags) under that title, last. `--help_all` is the same.
- Logs: `setup_logging()` gives this package's INFO messages and everyone else's warnings on standard error, no
  `datasets` progress bars; `--verbose` gives transformers' and datasets' INFO logs and bars too.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from transformers import HfArgumentParser  # transformers.hf_argparser: light, without torch

from ..common.errors import UsageError, describe_error
from .arguments_files import (
    ARGS_FILE_FLAG,
    apply_arguments_files,
    flag_fields,
    read_arguments_file,
    split_arguments_files,
    typed_value,
)

logger = logging.getLogger(__name__)

DEBUG_FLAG = "--debug"
VERBOSE_FLAG = "--verbose"
HELP_ALL_FLAG = "--help_all"
DEBUG_ENVIRONMENT = "VASWANI_DEBUG"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# fairseq's length penalty: `--lenpen A` divides a hypothesis' score by |Y| ** A, transformers' "power" form.
LENPEN_FLAG = "--lenpen"
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


# ---------------------------------------------------------------------------------------------------------------------
# The tool: one-line errors, exit statuses, --debug and --verbose
# ---------------------------------------------------------------------------------------------------------------------
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


# Messages of other libraries that say nothing to a tool's user, each silenced by its exact text, never a logger or a
# category: torchao's extensions for another Python (cp310) and for CUDA's sm_90a, which it cannot load here and does
# not need; torch's deprecation of the `register_constant` calls torchao makes on import; torchao's note that its
# Triton (GPU) kernels are missing, which int8 decoding on the CPU does not use; the ONNX exporter's note that it
# skips torchvision's operators, which no `vaswani` graph holds.
NOISE = {
    "torchao": re.compile(
        r"Failed to load (\S+/torchao/_C_(mxfp8|cutlass_90a)\S*\.so): Could not load this library: \1"
    ),
    "torch.utils._pytree": re.compile(
        re.escape(
            "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type. Calling "
            "register_constant() on Enum subclasses is deprecated and will be an error in a future release."
        )
    ),
    "torch.onnx._internal.exporter._registration": re.compile(re.escape("torchvision is not installed. Skipping %s")),
    "torchao.kernel.intmm": re.compile(
        re.escape("Warning: Detected no triton, on systems without Triton certain kernels will not work")
    ),
}


def _not_noise(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and NOISE[record.name].fullmatch(record.msg))


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
            for name in NOISE:  # before anything imports torchao (transformers' model loading does)
                if _not_noise not in logging.getLogger(name).filters:
                    logging.getLogger(name).addFilter(_not_noise)
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


def expand_lenpen(argv: Sequence[str]) -> list[str]:
    """fairseq's `--lenpen A` as this package's flags: `--length_penalty A --length_penalty_form power` (fairseq
    divides a hypothesis' score by |Y| ** A, transformers' "power" form). A `--length_penalty_form` other than power
    beside it is refused, as is `--lenpen` beside `--length_penalty`."""
    argv = list(argv)
    if not any(token == LENPEN_FLAG or token.startswith(LENPEN_FLAG + "=") for token in argv):
        return argv
    result, i = [], 0
    for flag in ("--length_penalty", "--length-penalty"):
        if any(token == flag or token.startswith(flag + "=") for token in argv):
            raise UsageError(f"{LENPEN_FLAG} is fairseq's name of --length_penalty: give one of them")
    while i < len(argv):
        token = argv[i]
        if token == LENPEN_FLAG or token.startswith(LENPEN_FLAG + "="):
            if "=" in token:
                values, i = [token.split("=", 1)[1]], i + 1
            else:
                i += 1
                values = []
                while i < len(argv) and not (argv[i].startswith("--") and len(argv[i]) > 2):
                    values.append(argv[i])
                    i += 1
                if not values:
                    raise UsageError(f"{LENPEN_FLAG} needs a value (fairseq's length penalty alpha)")
            result += ["--length_penalty", *values, "--length_penalty_form", "power"]
            continue
        if token.startswith(("--length_penalty_form", "--length-penalty-form")):
            value = token.split("=", 1)[1] if "=" in token else (argv[i + 1] if i + 1 < len(argv) else "")
            if value != "power":
                raise UsageError(
                    f"{LENPEN_FLAG} is fairseq's length penalty |Y| ** alpha (--length_penalty_form power), "
                    f"but --length_penalty_form is {value!r}: give --length_penalty with it instead"
                )
        result.append(token)
        i += 1
    return result


# ---------------------------------------------------------------------------------------------------------------------
# Two names of one flag
# ---------------------------------------------------------------------------------------------------------------------
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # a value, as argparse reads `-1` after a flag


def _spelling(parser: argparse.ArgumentParser, token: str, renamed: Mapping[str, str]):
    """The parser's action that the flag `token` (`--name`, without its `=value`) sets, renamed flags included."""
    actions = parser._option_string_actions
    if token in actions:
        return actions[token]
    key = token[2:].replace("-", "_")
    negated = key.startswith("no_") and key[3:] in renamed and key not in renamed
    old = key[3:] if negated else key
    if old in renamed:
        return actions.get(f"--{'no_' if negated else ''}{renamed[old]}")
    return None


def refuse_conflicting_names(
    parser: argparse.ArgumentParser, argv: Sequence[str], renamed: Mapping[str, str] | None = None
) -> None:
    """Raise `UsageError` naming both flags when two names of one flag are given different values in `argv`:
    fairseq's and transformers' names (`--lr` and `--learning_rate`), a renamed flag and its new name, `--flag-name`
    and `--flag_name`, `--flag` and `--no_flag`. The same value under both names is accepted; the same name given
    twice keeps argparse's rule (the last one wins)."""
    renamed = renamed or {}
    seen: dict[str, list[tuple[str, str, object]]] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "--":
            break
        if not token.startswith("--") or len(token) == 2:
            continue
        name, equals, value = token.partition("=")
        action = _spelling(parser, name, renamed)
        if action is None or action.nargs == argparse.SUPPRESS:
            continue
        if equals:
            texts = [value]
        else:
            most = {None: 1, "?": 1, "+": len(argv), "*": len(argv)}.get(action.nargs, action.nargs)
            texts = []
            while len(texts) < most and i < len(argv):
                following = argv[i]
                if following.startswith("-") and not _NEGATIVE_NUMBER.match(following):
                    break
                texts.append(following)
                i += 1
            if not texts and action.nargs not in (0, "?", "*"):
                continue  # a flag without its value: argparse says so
        shown = " ".join([name, *texts]) if not equals else token
        seen.setdefault(action.dest, []).append((name, shown, typed_value(action, texts)))
    for occurrences in seen.values():
        for index, (name, shown, value) in enumerate(occurrences):
            for other_name, other_shown, other_value in occurrences[index + 1 :]:
                if other_name != name and other_value != value:
                    raise UsageError(
                        f"{shown} and {other_shown} are two names of one flag with different values: give one of "
                        "them"
                    )


# ---------------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------------
class _Parser(HfArgumentParser):
    """`HfArgumentParser` whose errors raise `UsageError` (one line) instead of printing the whole usage and exiting
    (`ArgumentParser.error` is the documented place for that)."""

    def error(self, message):
        # not the `--flag-name` spelling, nor the aliases, beside each flag
        message = re.sub(r"(--\w+)(?:/--[\w-]+)+", r"\1", message)
        raise UsageError(f"{message} ({self.prog} --help lists the flags)")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each flag's default after its help (but None, "not given"); the description and the epilog (examples) as
    written; a flag's names once (`--learning_rate, --lr LEARNING_RATE`), without the `--flag-name` spelling that
    every flag also accepts."""

    def _get_help_string(self, action):
        if action.default is None:  # "not given": the help says what that means
            return action.help
        return super()._get_help_string(action)

    def _format_action_invocation(self, action):
        if not action.option_strings:
            return super()._format_action_invocation(action)
        names = [
            name
            for name in action.option_strings
            if "-" not in name[2:] or "--" + name[2:].replace("-", "_") not in action.option_strings
        ]
        if action.nargs == 0:
            return ", ".join(names)
        return (
            f"{', '.join(names)} {self._format_args(action, self._get_default_metavar_for_optional(action))}"
        )


def build_parser(
    dataclass_types: Sequence[type] | type, *, description: str, epilog: str | None = None
) -> HfArgumentParser:
    """The parser of a tool: a flag per field of `dataclass_types`, grouped in `--help` by each dataclass's
    `_argument_group_name`, and the flags common to every tool. `description` and `epilog` are printed as written."""
    types_ = list(dataclass_types) if isinstance(dataclass_types, (list, tuple)) else [dataclass_types]
    parser = _Parser(
        types_,
        prog=current_prog(),
        description=description,
        epilog=epilog,
        formatter_class=_HelpFormatter,
        usage=f"%(prog)s [ARGS.yaml | {ARGS_FILE_FLAG} FILE] [--flag value ...]",
        allow_abbrev=False,  # a prefix (--lr, --learning_rat) is an error, never silently another flag
    )
    trainer_debug = "debug" in flag_fields(
        types_
    )  # transformers' --debug takes a value; a bare --debug is ours
    common = parser.add_argument_group(
        "common to every vaswani tool",
        "a bare --debug shows the traceback of an error (--debug with a value is transformers')"
        if trainer_debug
        else None,
    )
    common.add_argument(
        ARGS_FILE_FLAG,
        metavar="FILE",
        help="read flags from a JSON or YAML mapping {flag: value}; flags on the command line override it",
    )
    if not trainer_debug:
        common.add_argument(DEBUG_FLAG, action="store_true", help="show the traceback of an error")
    common.add_argument(VERBOSE_FLAG, action="store_true", help="INFO logs of transformers and datasets too")
    if {"length_penalty", "length_penalty_form"} <= flag_fields(types_).keys():
        common.add_argument(  # expanded before parsing (`expand_lenpen`); listed here for --help
            LENPEN_FLAG,
            metavar="ALPHA",
            nargs="+",
            type=float,
            help="fairseq's length penalty: --length_penalty ALPHA --length_penalty_form power (|Y| ** ALPHA)",
        )
    for dtype in types_:
        _list_inherited_flags_last(parser, dtype)
    return parser


def _list_inherited_flags_last(parser: argparse.ArgumentParser, dtype: type) -> None:
    """Move the flags of the fields that `dtype` inherits (not declared in its own body) from its group of `--help` to
    a group titled `dtype._inherited_argument_group_name`, after every other group; nothing without that title."""
    title = getattr(dtype, "_inherited_argument_group_name", None)
    if title is None:
        return
    own = set(vars(dtype).get("__annotations__", {}))
    (group,) = [group for group in parser._action_groups if group.title == dtype._argument_group_name]
    inherited = parser.add_argument_group(title)
    for action in list(group._group_actions):
        if action.dest not in own:
            group._group_actions.remove(action)
            inherited._group_actions.append(action)


def parse_args(
    dataclass_types: Sequence[type] | type,
    argv: Sequence[str] | None,
    *,
    description: str,
    epilog: str | None = None,
    renamed: Mapping[str, str] | None = None,
) -> tuple:
    """Parse `argv` (None: `sys.argv[1:]`) into instances of `dataclass_types`, in their order.

    Renamed flags are translated (`renamed`: old -> new name), arguments files give their flags to the parser
    (`apply_arguments_files`), then `HfArgumentParser.parse_args_into_dataclasses` parses the command line; an unknown
    flag or a bad value raises `UsageError`, and a dataclass whose `__post_init__` rejects a value raises its own
    `ValueError`. `--help_all` is `--help`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    files, argv = split_arguments_files(argv)
    parser = build_parser(dataclass_types, description=description, epilog=epilog)
    refuse_conflicting_names(parser, argv, renamed)
    argv = ["--help" if token == HELP_ALL_FLAG else token for token in rename_flags(argv, renamed or {})]
    if {"length_penalty", "length_penalty_form"} <= flag_fields(parser.dataclass_types).keys():
        argv = expand_lenpen(argv)
    argv = apply_arguments_files(parser, files, argv, renamed or {})
    # An unknown flag is reported before any dataclass checks its values, as `ArgumentParser.parse_args` does.
    _, remaining = parser.parse_known_args(argv)
    if remaining:
        parser.error(f"unrecognized arguments: {' '.join(remaining)}")
    outputs = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
    # The dataclasses, without the namespace of the common flags (--args_file, --debug, --verbose).
    return tuple(outputs[: len(parser.dataclass_types)])


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
    import datasets  # here: a tool's --help needs neither
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
    "apply_arguments_files",
    "build_parser",
    "command",
    "current_prog",
    "expand_lenpen",
    "parse_args",
    "read_arguments_file",
    "refuse_conflicting_names",
    "rename_flags",
    "setup_logging",
    "split_arguments_files",
    "verbose",
]
