"""The one exception type for mistakes a user can fix (bad path, option, prompt): the CLI
prints its message as one sentence without a traceback; the server maps it to a 4xx."""

from __future__ import annotations


class UserError(ValueError):
    """A mistake the user can fix; the message says how."""
