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
    """Status lines as they are written; warnings and errors as `tokenmill: LEVEL: ...`; each
    through ``rewrite`` (what a message must never show, removed)."""

    def __init__(self, rewrite: Callable[[str], str]) -> None:
        super().__init__("%(message)s")
        self.rewrite = rewrite

    def format(self, record: logging.LogRecord) -> str:
        message = self.rewrite(super().format(record))
        return message if record.levelno == logging.INFO else f"tokenmill: {record.levelname}: {message}"


def configure_logging(debug: bool = False, rewrite: Callable[[str], str] = str) -> None:
    """tokenmill's own messages on stderr: status lines (info) as they are, warnings and errors
    as one `tokenmill: LEVEL: ...` line each; debug messages too with --debug. Results (tables,
    JSON, inspections) are printed on stdout by the commands themselves. ``rewrite`` is applied to
    every message (the entry points pass `tokenmill.infra.storage.redact`)."""
    logger = logging.getLogger("tokenmill")
    if not logger.handlers:
        handler = _Stderr()
        logger.addHandler(handler)
        logger.propagate = False
    for handler in logger.handlers:
        if isinstance(handler, _Stderr):
            handler.setFormatter(_Format(rewrite))
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
