"""Errors that carry a message meant for the user, shown without a traceback by the CLI."""

# EX_TEMPFAIL (sysexits.h): the command failed because something it depends on went away (a
# training peer, the Dask scheduler); the same command, rerun once that is back, resumes.
TEMPFAIL_EXIT = 75


class TokenmillError(Exception):
    """A user-facing error: bad input, bad configuration, a missing file."""

    exit_status = 1  # the command's exit status when this error ends it


class ConfigError(TokenmillError):
    """A configuration key or value is wrong."""


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
