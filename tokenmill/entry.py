"""How a tokenmill process ends: the one place that turns what a command raised into a one-line
message and an exit status.

Shared by every entry point a user or a launcher starts: the `tokenmill` command (cli.py) and
the training ranks' own (train/worker.py), so a rank says a mistake, a full disk or a Ctrl-C the
same way the command does. The exit statuses are the ones docs/processes.md lists: 1 for an
error, the error's own `exit_status` (99: stopped at a checkpoint on request, 75: a peer or the
scheduler went away), 130 for Ctrl-C.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

from tokenmill.errors import TokenmillError
from tokenmill.infra.machine_faults import disk_full_error, is_disk_full
from tokenmill.infra.storage import redact
from tokenmill.logs import configure_logging, rewrite_every_record

DEBUG_FLAG = "--debug"
DEBUG_ENV = "TOKENMILL_DEBUG"
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C


SAID_BY_PARENT = "said_by_parent"


def said_by_parent(error: BaseException) -> BaseException:
    """``error`` marked as one the process that started this one says, in its own one line:
    Ctrl-C in the trainer of `tokenmill run` (the run says how to resume), a rank's collective
    that failed because another rank died (the launcher names that rank). This process ends
    with the error's status and says nothing, so that the user reads one line, not one a process."""
    setattr(error, SAID_BY_PARENT, True)
    return error


def interrupted_line(hint: str = "") -> str:
    """What Ctrl-C ends a command with: how to resume (`train`: with --resume), by default a rerun."""
    return f"tokenmill: interrupted; {hint or 'rerun to resume'}"


def take_debug_flag(argv: list[str]) -> tuple[bool, list[str]]:
    """Whether to show tracebacks (``--debug`` anywhere on the line, or ``TOKENMILL_DEBUG=1``),
    and ``argv`` without the flag. With it, the processes this one starts inherit it through the
    environment. Configures tokenmill's logging accordingly, and redacts every URL in what the
    process prints of itself: log records (any logger's) and tracebacks (--debug's, and a bug's
    that the interpreter prints)."""
    debug = DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV) == "1"
    if debug:
        os.environ[DEBUG_ENV] = "1"
    configure_logging(debug)
    rewrite_every_record(redact)
    sys.excepthook = _print_redacted_traceback
    return debug, [arg for arg in argv if arg != DEBUG_FLAG]


def _print_redacted_traceback(kind: type[BaseException], error: BaseException, trace: object) -> None:
    """Print a traceback as the interpreter does, with every URL in it redacted: an exception's
    message, or one it was raised from, may hold a URL as the user gave it, credentials and all."""
    print(redact("".join(traceback.format_exception(kind, error, trace))), end="", file=sys.stderr)


def print_traceback() -> None:
    """The traceback of the exception being handled, redacted (what --debug shows)."""
    _print_redacted_traceback(*sys.exc_info())


def run_reported(command: Callable[[], int | None], what: str, debug: bool = False) -> int:
    """Run ``command``; return its exit status, or the one line and status of what ended it:

    - a `TokenmillError` (a user's mistake, or a fault said in words): ``tokenmill: error: ...``
      and the error's ``exit_status``;
    - a full disk, raised in any shape by anything: ``tokenmill: error: WHAT: no space left ...``
      and 1;
    - Ctrl-C: ``tokenmill: interrupted; ...`` (the interruption's own hint, or "rerun to
      resume") and 130.

    An error marked `said_by_parent` ends the process with its status and no line (unless
    ``debug``).

    Anything else is a bug and keeps its traceback. ``debug`` prints the traceback behind the
    line as well."""
    try:
        result = command()
    except TokenmillError as error:
        if debug:
            print_traceback()
        if debug or not getattr(error, SAID_BY_PARENT, False):
            print(f"tokenmill: error: {redact(str(error))}", file=sys.stderr)
        return error.exit_status
    except Exception as error:
        # A full disk anywhere (a command's own writes, a library's, wrapped or not) is one
        # line too; the commands that write through Dask say which partitions they keep.
        if not is_disk_full(error):
            raise
        if debug:
            print_traceback()
        print(f"tokenmill: error: {redact(str(disk_full_error(error, what)))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:
        if debug:
            print_traceback()
        # A command may say how to resume (`train`: with --resume); by default a rerun resumes.
        if not getattr(interrupt, SAID_BY_PARENT, False):
            print(interrupted_line(str(interrupt)), file=sys.stderr)
        return INTERRUPTED_EXIT
    return int(result or 0)
