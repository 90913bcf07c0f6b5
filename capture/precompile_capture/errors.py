"""Errors of the capture tool."""


class PrecompileError(Exception):
    """A capture or an artifact cannot be produced; the message says why."""
