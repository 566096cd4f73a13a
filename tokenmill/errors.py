"""Errors that carry a message meant for the user, shown without a traceback by the CLI."""

import difflib
from collections.abc import Iterable


class TokenmillError(Exception):
    """A user-facing error: bad input, bad configuration, a missing file."""

    exit_status = 1  # the command's exit status when this error ends it


class ConfigError(TokenmillError):
    """A configuration key or value is wrong."""


def suggest(
    word: object, candidates: Iterable[object], cutoff: float = 0.6, form: str = " (did you mean `{}`?)"
) -> str:
    """A "did you mean" hint for a misspelt ``word``: ``form`` filled with the closest of
    ``candidates``, or "" when none is close enough."""
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=cutoff)
    return form.format(close[0]) if close else ""
