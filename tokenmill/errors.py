"""Errors that carry a message meant for the user, shown without a traceback by the CLI."""

import difflib
from collections.abc import Iterable

# EX_TEMPFAIL (sysexits.h): the command failed because something it depends on went away (a
# training peer, the Dask scheduler); the same command, rerun once that is back, resumes.
TEMPFAIL_EXIT = 75


class TokenmillError(Exception):
    """A user-facing error: bad input, bad configuration, a missing file."""

    exit_status = 1  # the command's exit status when this error ends it


class ConfigError(TokenmillError):
    """A configuration key or value is wrong."""


class YamlSyntaxError(ConfigError):
    """A YAML file that does not parse, named with the line and column of the problem."""

    def __init__(self, origin: str, error: Exception) -> None:
        super().__init__(yaml_error_message(str(origin), error))


def yaml_error_message(origin: str, error: Exception) -> str:
    """One line for a YAML parse error: `recipe.yaml:3:7: not valid YAML: <problem> (<context>)`.

    PyYAML's own message spans several lines and names the text it parsed (`in "<unicode
    string>"`) rather than the file, since callers parse text they read themselves.
    """
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if problem and mark is not None:
        context = getattr(error, "context", None)
        context_mark = getattr(error, "context_mark", None)
        where = f" at line {context_mark.line + 1}" if context and context_mark is not None else ""
        detail = f" ({context}{where})" if context else ""
        return f"{origin}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}{detail}"
    # Errors without a mark (an unreadable character): PyYAML's text on one line, the file named.
    text = " ".join(str(error).replace('"<unicode string>"', origin).replace('"<file>"', origin).split())
    return f"{origin}: not valid YAML: {text}"


def _sentence(*parts: str | None) -> str:
    return "; ".join(part for part in parts if part)


class DiskFullError(TokenmillError):
    """The disk (or quota) filled up while a command wrote `target`: `what` was running, `kept`
    says what it finished and keeps for a rerun, `hint` what to do."""

    def __init__(self, what: str, target: str | None, kept: str | None, hint: str = "free space and rerun") -> None:
        self.what, self.target, self.kept, self.hint = what, target, kept, hint
        where = f" for {target}" if target else ""
        super().__init__(_sentence(f"{what}: no space left on the device{where}", kept, hint))


class SchedulerLostError(TokenmillError):
    """The Dask scheduler at `address` went away while `what` ran; `kept` says what it finished."""

    exit_status = TEMPFAIL_EXIT

    def __init__(self, what: str, address: str, kept: str | None) -> None:
        self.what, self.address, self.kept = what, address, kept
        super().__init__(
            _sentence(
                f"lost the Dask scheduler at {address} during {what}",
                kept,
                "restart the scheduler and workers and rerun to resume",
            )
        )


def suggest(
    word: object, candidates: Iterable[object], cutoff: float = 0.6, form: str = " (did you mean `{}`?)"
) -> str:
    """A "did you mean" hint for a misspelt ``word``: ``form`` filled with the closest of
    ``candidates``, or "" when none is close enough."""
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=cutoff)
    return form.format(close[0]) if close else ""
