"""The package's errors as a user reads them: `UsageError` for a wrong command line, and one line per exception.

Library code raises (`ValueError`, `OSError`, ...) with a message that names the file, line or flag; a tool
(`vaswani.commands.cli.command`) prints `describe_error(error)` on one line and exits with status 1, or 2 for a `UsageError`.
"""

import contextlib


class UsageError(ValueError):
    """The command line is wrong: a flag, its value or a combination of flags. The message names the flag."""


def describe_error(error):
    """An exception as one line: its message (with its type when that says something the message does not)."""
    message = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, FileNotFoundError) and error.filename and str(error.filename) not in message:
        return f"{message}: {error.filename}"
    if isinstance(error, (ValueError, OSError, ImportError)):
        return message
    return f"{type(error).__name__}: {message} (run with --debug for the traceback)"


def require_positive(args, *names):
    """Refuse a flag of `names` whose value is below 1 (None: not given)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be at least 1, got {value}")


class PublishError(ValueError):
    """The inputs cannot make a valid published model (`vaswani.publishing.hub`); raised before anything is uploaded."""


@contextlib.contextmanager
def flag_errors(flag):
    """Re-raise a `ValueError` of the block as a `UsageError` that names `--flag` (`flag` without dashes)."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as error:
        raise UsageError(f"--{flag}: {describe_error(error)}") from error
