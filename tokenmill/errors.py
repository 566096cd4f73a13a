"""Errors that carry a message meant for the user, shown without a traceback by the CLI."""


class TokenmillError(Exception):
    """A user-facing error: bad input, bad configuration, a missing file."""


class ConfigError(TokenmillError):
    """A configuration key or value is wrong."""
