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
  (`read_flags`); one name given twice keeps argparse's rule, the last wins.
- Arguments file: `<prog> args.yaml` (or `.json`, or `--args_file FILE`) reads flags from a JSON or YAML mapping
  `{flag_name: value}`; flags given on the command line override it (`read_arguments_file`, `file_tokens`).
- `--help` lists every flag, grouped by dataclass (`_argument_group_name`), in the order of the dataclasses, then the
  flags common to every tool; a dataclass whose `_inherited_argument_group_name` is set lists the fields it inherits
  (transformers' Trainer flags) under that title, last. `--help_all` is the same.
- Logs: `setup_logging()` gives this package's INFO messages and everyone else's warnings on standard error, no
  `datasets` progress bars; `--verbose` gives transformers' and datasets' INFO logs and bars too.
"""

import argparse
import collections
import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import re
import sys
from pathlib import Path

import yaml
from transformers import HfArgumentParser  # transformers.hf_argparser: light, without torch

from ..common.errors import UsageError, describe_error

logger = logging.getLogger(__name__)

ARGS_FILE_FLAG = "--args_file"
DEBUG_FLAG = "--debug"
VERBOSE_FLAG = "--verbose"


# The running tool: its name (`vaswani-train`, ...) and whether it was given `--verbose`.
_current = argparse.Namespace(
    prog=Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "vaswani", verbose=False
)


# ---------------------------------------------------------------------------------------------------------------------
# The tool: one-line errors, exit statuses, --debug and --verbose
# ---------------------------------------------------------------------------------------------------------------------
def _take_flag(argv, flag):
    """Remove every bare `flag` from `argv`, whether any was. Transformers' own `--debug underflow_overflow` (or
    `tpu_metrics_debug`) stays the Trainer's."""
    bare = [
        i
        for i, token in enumerate(argv)
        if token == flag and argv[i + 1 : i + 2] not in (["underflow_overflow"], ["tpu_metrics_debug"])
    ]
    for i in reversed(bare):
        del argv[i]
    return bool(bare)


# Messages of other libraries that say nothing to a tool's user, each silenced by its exact text, never a logger or a
# category: torchao's extensions for another Python (cp310) and for CUDA's sm_90a, which it cannot load here and does
# not need; torch's deprecation of the `register_constant` calls torchao makes on import; torchao's note that its
# Triton (GPU) kernels are missing, which int8 decoding on the CPU does not use; the ONNX exporter's note that it
# skips torchvision's operators, which no `vaswani` graph holds.
NOISE = {
    "torchao": r"Failed to load (\S+/torchao/_C_(mxfp8|cutlass_90a)\S*\.so): Could not load this library: \1",
    "torch.utils._pytree": re.escape(
        "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type. Calling "
        "register_constant() on Enum subclasses is deprecated and will be an error in a future release."
    ),
    "torch.onnx._internal.exporter._registration": re.escape("torchvision is not installed. Skipping %s"),
    "torchao.kernel.intmm": re.escape(
        "Warning: Detected no triton, on systems without Triton certain kernels will not work"
    ),
}


def _not_noise(record):
    return not (isinstance(record.msg, str) and re.fullmatch(NOISE[record.name], record.msg))


# On import of `vaswani.commands` (its `__init__` imports this module first), before a tool's own imports load torch
# and torchao (`vaswani-train`'s flags import transformers' training arguments).
for _name in NOISE:
    logging.getLogger(_name).addFilter(_not_noise)


def command(prog):
    """Decorate a tool's `main(argv)`; the result is `main(argv=None)`, which returns what `main` returns, or exits
    with a one-line error (see the module docstring). Called without `argv` (as a console command, whose wrapper
    exits with the return value), it reads `sys.argv[1:]` and returns None. `--debug` and `--verbose` are taken off
    the arguments here, before `main` sees them."""

    def decorate(main):
        @functools.wraps(main)
        def run(argv=None):
            global _current
            arguments = list(sys.argv[1:] if argv is None else argv)
            debug_environment = os.environ.get("VASWANI_DEBUG", "").lower() in ("1", "true", "yes")
            debug = _take_flag(arguments, DEBUG_FLAG) or debug_environment
            previous = _current
            _current = argparse.Namespace(prog=prog, verbose=_take_flag(arguments, VERBOSE_FLAG))
            try:
                result = main(arguments)
                return None if argv is None else result
            except (KeyboardInterrupt, Exception) as error:
                if debug:
                    raise
                interrupted = isinstance(error, KeyboardInterrupt)
                print(
                    f"{prog}: interrupted" if interrupted else f"{prog}: error: {describe_error(error)}",
                    file=sys.stderr,
                )
                raise SystemExit(130 if interrupted else 2 if isinstance(error, UsageError) else 1) from None
            finally:
                _current = previous

        return run

    return decorate


# ---------------------------------------------------------------------------------------------------------------------
# Renamed flags, fairseq's --lenpen, two names of one flag
# ---------------------------------------------------------------------------------------------------------------------
# A flag of a command line: its tokens `argv[start:end]`, its name as written (`--lr`), the new name of a renamed flag,
# the parser's action it sets and that action's dest, and the texts of its values.
_Flag = collections.namedtuple("_Flag", "start end name new action dest texts")


def _flags(parser, argv, renamed):
    """The flags of the parser in `argv` (up to a `--`), each with the values that argparse would give it (a flag the
    parser lacks takes none: argparse names it). A renamed flag is recognised as `--old`, `--old=value` and
    `--old-name`."""
    found, i = [], 0
    while i < len(argv) and argv[i] != "--":
        start, (name, equals, value) = i, argv[i].partition("=")
        i += 1
        new = renamed.get(name[2:].replace("-", "_"))
        action = parser._option_string_actions.get(f"--{new}" if new else name)
        if not name.startswith("--") or action is None:
            continue
        texts = [value] if equals else []
        # argparse's count: one value after `=`, or after a flag of nargs None or "?"; all that follow for "+"
        most = 0 if equals else {None: 1, "?": 1, 0: 0}.get(action.nargs, len(argv))
        # a value starts with a dash only as a negative number (`--device -1`)
        while (
            len(texts) < most
            and i < len(argv)
            and (argv[i][:1] != "-" or parser._negative_number_matcher.match(argv[i]))
        ):
            texts.append(argv[i])
            i += 1
        found.append(_Flag(start, i, name, new, action, action.dest, texts))
    return found


def typed_value(action, texts):
    """The values an occurrence of `action` with the values `texts` gives, as a list, converted as argparse converts
    them (the texts themselves when a value does not convert: argparse reports that later); `--flag` alone gives its
    constant (store_true/store_false, or a switch of nargs "?")."""
    try:
        return [(action.type or str)(text) for text in texts] or [action.const]
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return texts


def read_flags(parser, argv, renamed, path=None):
    """`argv` (a command line, or the flags of the arguments file `path`) for `parser`: renamed flags under their new
    names (each with a warning), `--lenpen A` as `--length_penalty A --length_penalty_form power` (fairseq divides a
    hypothesis' score by |Y| ** A, transformers' "power" form). Raises `UsageError` naming both flags when two names
    of one flag have different values: fairseq's and transformers' (`--lr` and `--learning_rate`), a renamed flag and
    its new name, `--flag-name` and `--flag_name`, `--flag` and `--no_flag`. The same value under both names is
    accepted; the same name given twice keeps argparse's rule (the last one wins). `--lenpen` is refused beside
    `--length_penalty`, and beside a `--length_penalty_form` other than power."""
    flags = _flags(parser, argv, renamed)
    where, dashes = (f"Arguments file {path}: ", "") if path else ("", "--")
    given = [flag for flag in flags if flag.texts or flag.action.nargs in (0, "?", "*")]
    for a, b in itertools.combinations(given, 2):
        if (
            a.dest == b.dest
            and a.name != b.name
            and typed_value(a.action, a.texts) != typed_value(b.action, b.texts)
        ):
            shown = [flag.name[2:] if path else " ".join(argv[flag.start : flag.end]) for flag in (a, b)]
            raise UsageError(
                f"{where}{shown[0]} and {shown[1]} are two names of one flag with different values: give one of them"
            )
    dests = {flag.dest: flag for flag in flags}
    if "lenpen" in dests:
        if "length_penalty" in dests:
            raise UsageError(
                f"{where}{dashes}lenpen is fairseq's name of {dashes}length_penalty: give one of them"
            )
        if not dests["lenpen"].texts:
            raise UsageError("--lenpen needs a value (fairseq's length penalty alpha)")
        form = getattr(dests.get("length_penalty_form"), "texts", ["power"])[:1]
        if form != ["power"]:
            raise UsageError(
                f"{where}{dashes}lenpen is fairseq's length penalty |Y| ** alpha ({dashes}length_penalty_form power), but "
                f"{dashes}length_penalty_form is {''.join(form)!r}: give {dashes}length_penalty with it instead"
            )
    result = list(argv)
    for flag in flags:
        if flag.new:
            logger.warning(
                "%s%s%s is deprecated; use %s%s",
                f"{path}: " if path else "",
                dashes,
                flag.name[2:].replace("-", "_"),
                dashes,
                flag.new,
            )
        if flag.new or flag.dest == "lenpen":  # the flag under its new name, its values where they stand
            result[flag.start] = f"--{flag.new or 'length_penalty'}{argv[flag.start][len(flag.name) :]}"
    return (["--length_penalty_form", "power"] if "lenpen" in dests else []) + result


# ---------------------------------------------------------------------------------------------------------------------
# Arguments files
# ---------------------------------------------------------------------------------------------------------------------
# `<prog> args.yaml` (or `.json`, or `--args_file FILE`) reads a tool's flags from a JSON or YAML mapping
# `{flag_name: value}`, and flags given on the command line override it (`parse_args` puts each file's flags,
# `file_tokens`, before the command line). A file's flags are read as the command line's:
# `HfArgumentParser` converts and refuses a value as it does the same flag typed, and a file's own mistakes (a flag
# the tool lacks, two names of one flag with different values) are named with the file before any work starts.
def read_arguments_file(path):
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
    kind, load = ("JSON", json.loads) if path.suffix == ".json" else ("YAML", yaml.safe_load)
    try:
        values = load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise UsageError(
            f"Arguments file {path} is not valid {kind}: {' '.join(str(error).split())}"
        ) from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise UsageError(f"Arguments file {path} must hold a mapping of flag names to values.")
    mapping = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key.strip("-"):
            raise UsageError(f"Arguments file {path}: {key!r} is not a flag name.")
        if value == []:
            raise UsageError(f"Arguments file {path}: {key} is an empty list.")
        for item in value if isinstance(value, list) else [] if isinstance(value, dict) else [value]:
            if isinstance(item, (dict, list)):
                raise UsageError(f"Arguments file {path}: {key} holds a nested {type(item).__name__}.")
            if isinstance(item, float) and not math.isfinite(item):
                raise UsageError(f"Arguments file {path}: {key} is {item}.")
        if value is not None:
            mapping[key.lstrip("-")] = value
    return mapping


def file_tokens(parser, path, renamed):
    """The flags of the arguments file `path` as a command line: `--flag=value`, or `--flag value ...` for a flag that
    takes several values, each value as it would be typed (a mapping as its JSON text); a flag the tool lacks, or a
    list for a flag of one value, is refused."""
    tokens = []
    for key, value in read_arguments_file(path).items():
        texts = [
            json.dumps(v) if isinstance(v, (bool, dict)) else str(v)
            for v in (value if isinstance(value, list) else [value])
        ]
        action = parser._option_string_actions.get(f"--{renamed.get(key.replace('-', '_'), key)}")
        # a field's flag (`--no_flag`, the negative spelling of a switch, is no entry of a file) or fairseq's --lenpen
        if getattr(action, "dest", None) not in parser.field_names | {"lenpen"} or action.nargs == 0:
            raise UsageError(
                f"Arguments file {path}: {key} is not a flag of {parser.prog} ({parser.prog} --help lists the flags)"
            )
        if len(texts) > 1 and action.nargs in (None, "?"):
            parser.error(f"argument --{action.dest}: expected one argument, got {len(texts)} ({path})")
        tokens += [f"--{key}={texts[0]}"] if len(texts) == 1 else [f"--{key}", *texts]
    return tokens


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

    @property
    def field_names(self):
        """The names of the fields of the parser's dataclasses."""
        return {item.name for dtype in self.dataclass_types for item in dataclasses.fields(dtype)}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each flag's default after its help (but None, "not given"); the description and the epilog (examples) as
    written; a flag's names once (`--learning_rate, --lr LEARNING_RATE`), without the `--flag-name` spelling that
    every flag also accepts."""

    def _get_help_string(self, action):
        if action.default is None:  # "not given": the help says what that means
            return action.help
        return super()._get_help_string(action)

    def _format_action_invocation(self, action):
        names = ", ".join(
            name
            for name in action.option_strings
            if "-" not in name[2:] or "--" + name[2:].replace("-", "_") not in action.option_strings
        )
        if action.nargs == 0:
            return names
        return f"{names} {self._format_args(action, self._get_default_metavar_for_optional(action))}"


def build_parser(dataclass_types, **options):
    """The parser of a tool: a flag per field of `dataclass_types`, grouped in `--help` by each dataclass's
    `_argument_group_name`, and the flags common to every tool. `options` are argparse's: the `description` and the
    `epilog` (examples), printed as written."""
    parser = _Parser(
        dataclass_types,
        prog=_current.prog,
        formatter_class=_HelpFormatter,
        usage=f"%(prog)s [ARGS.yaml | {ARGS_FILE_FLAG} FILE] [--flag value ...]",
        allow_abbrev=False,  # a prefix (--lr, --learning_rat) is an error, never silently another flag
        **options,
    )
    fields = parser.field_names
    trainer_debug = "debug" in fields  # transformers' --debug takes a value; a bare --debug is ours
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
    common.add_argument("--help_all", action="help", help=argparse.SUPPRESS)  # --help: it lists every flag
    if {"length_penalty", "length_penalty_form"} <= fields:
        common.add_argument(  # read as --length_penalty before parsing (`read_flags`)
            "--lenpen",
            metavar="ALPHA",
            nargs="+",
            help="fairseq's length penalty: --length_penalty ALPHA --length_penalty_form power (|Y| ** ALPHA)",
        )
    # The flags of the fields that a dataclass inherits (not declared in its own body) move from its group to one
    # titled `_inherited_argument_group_name`, after every other group (transformers' Trainer flags, last).
    for dtype in parser.dataclass_types:
        if title := getattr(dtype, "_inherited_argument_group_name", None):
            own = vars(dtype)["__annotations__"]
            (group,) = [group for group in parser._action_groups if group.title == dtype._argument_group_name]
            inherited = parser.add_argument_group(title)
            for action in list(group._group_actions):
                if action.dest not in own:
                    group._group_actions.remove(action)
                    inherited._group_actions.append(action)
    return parser


def parse_args(dataclass_types, argv, renamed=None, **options):
    """Parse `argv` (a list of strings) into instances of `dataclass_types`, in their order; `options` go to
    `build_parser` (`description`, `epilog`).

    Renamed flags are translated (`renamed`: old -> new name), arguments files' flags go before the command line's
    (`file_tokens`), then the parser reads the command line and `HfArgumentParser.parse_dict` makes the dataclasses;
    an unknown flag or a bad value raises `UsageError`, and a dataclass whose `__post_init__` rejects a value raises
    its own `ValueError`. `--help_all` is `--help`.
    """
    argv = list(argv)
    files = (
        [argv.pop(0)] if argv and argv[0][:1] != "-" and argv[0].endswith((".json", ".yaml", ".yml")) else []
    )
    parser = build_parser(dataclass_types, **options)
    renamed = renamed or {}
    for flag in _flags(parser, argv, renamed):
        if flag.dest == "args_file":
            if not flag.texts:
                raise UsageError(f"{ARGS_FILE_FLAG} needs a file name.")
            files.append(flag.texts[0])
    argv = read_flags(parser, argv, renamed)
    files = [
        token
        for path in files
        for token in read_flags(parser, file_tokens(parser, path, renamed), renamed, path)
    ]
    argv = files + argv  # the command line last: its flags win
    # an unknown flag is reported before any dataclass checks its values
    return parser.parse_dict(vars(parser.parse_args(argv)), allow_extra_keys=True)


# ---------------------------------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------------------------------
class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of each message (a tool called twice in one process, or under
    a test's capture, logs where standard error is now)."""

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


def setup_logging(main_process=True):
    """Quiet logs on standard error: this package's INFO messages, warnings from everyone else, no progress bars of
    transformers' loading and saving or of `datasets`; with `--verbose`, transformers' and datasets' INFO logs and bars as well. Processes other than
    the main one of a distributed run log warnings only."""
    import datasets  # here: a tool's --help needs neither
    import transformers

    root = logging.getLogger()
    if not any(isinstance(handler, _StderrHandler) for handler in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("vaswani").setLevel(logging.INFO if main_process else logging.WARNING)
    logging.captureWarnings(True)
    loud = _current.verbose and main_process
    for library in (transformers, datasets):  # transformers' bars: "Loading weights", "Writing model shards"
        library.utils.logging.set_verbosity(logging.INFO if loud else logging.WARNING)
        if loud:
            library.utils.logging.enable_progress_bar()
        else:
            library.utils.logging.disable_progress_bar()
