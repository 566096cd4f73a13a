"""Errors that carry a message meant for the user, shown without a traceback by the CLI."""


class TokenmillError(Exception):
    """A user-facing error: bad input, bad configuration, a missing file."""

    exit_status = 1  # the command's exit status when this error ends it


class ConfigError(TokenmillError):
    """A configuration key or value is wrong."""
