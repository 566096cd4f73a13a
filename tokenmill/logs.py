"""tokenmill's own messages on stderr, configured once per process: by the command line and by
each process a command starts (the ranks)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable


class _Stderr(logging.StreamHandler):
    """A handler that writes to the `sys.stderr` of the moment, which callers (and tests) may
    have replaced since logging was configured."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _Format(logging.Formatter):
    """Status lines as they are written; warnings and errors as `tokenmill: LEVEL: ...`."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if record.levelno == logging.INFO else f"tokenmill: {record.levelname}: {message}"


def configure_logging(debug: bool = False) -> None:
    """tokenmill's own messages on stderr: status lines (info) as they are, warnings and errors
    as one `tokenmill: LEVEL: ...` line each; debug messages too with --debug. Results (tables,
    JSON, inspections) are printed on stdout by the commands themselves."""
    logger = logging.getLogger("tokenmill")
    if not logger.handlers:
        handler = _Stderr()
        logger.addHandler(handler)
        logger.propagate = False
    for handler in logger.handlers:
        if isinstance(handler, _Stderr):
            handler.setFormatter(_Format())
    logger.setLevel(logging.DEBUG if debug else logging.INFO)


# The rewrite every log record of this process goes through (None: records are left as made).
_record_rewrite: Callable[[str], str] | None = None


def rewrite_every_record(rewrite: Callable[[str], str]) -> None:
    """Pass the message, traceback and stack of every log record this process makes, whatever
    its logger (tokenmill's, Dask's, tornado's, a library's) and wherever it is printed, through
    ``rewrite`` (the entry points and Dask's workers pass `tokenmill.infra.storage.redact`).

    A record factory rather than a `logging.Filter`: a logger's filter sees only the records
    logged on that very logger, not those of its children (`distributed.worker`), and a
    handler's only what that handler prints (Dask and tests add their own)."""
    global _record_rewrite
    if _record_rewrite is None:
        make_record = logging.getLogRecordFactory()

        def rewritten_record(*args: object, **kwargs: object) -> logging.LogRecord:
            record = make_record(*args, **kwargs)
            if _record_rewrite is not None:
                _rewrite_record(record, _record_rewrite)
            return record

        logging.setLogRecordFactory(rewritten_record)
    _record_rewrite = rewrite


def _rewrite_record(record: logging.LogRecord, rewrite: Callable[[str], str]) -> None:
    try:
        message = record.getMessage()
    except Exception:  # arguments that do not fit the message: logging reports them as it prints
        return
    if (rewritten := rewrite(message)) != message:
        record.msg, record.args = rewritten, ()
    if record.exc_info and not record.exc_text:
        # What a formatter would print, rewritten now; formatters print `exc_text` when it is set.
        record.exc_text = rewrite(logging.Formatter().formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = rewrite(record.stack_info)
