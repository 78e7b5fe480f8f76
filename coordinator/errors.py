"""The coordinator's expected errors, which the CLI turns into one paragraph and an
exit code (never a traceback) and the Python API raises as they are."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as one paragraph, exit code 2."""


class CommandFailed(Exception):
    """The command started and failed for a reason it has already explained in the
    message (exit 1), e.g. an image build that broke."""
