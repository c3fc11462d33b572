"""The two kinds of failure every command tells apart (exit 2 and exit 1).

Kept in a module of their own at the bottom of the import graph, so any
layer can raise them without importing the layer that reports them.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: the message is one line naming the key or file and the problem (exit 2)."""


class InternalError(RuntimeError):
    """A run stopped on a bug; its summary.json and metrics.jsonl (with the traceback) were written first (exit 1).

    ``details``: that traceback, for ``shoal --debug``.
    """

    def __init__(self, message: str, details: str | None = None) -> None:
        super().__init__(message)
        self.details = details


class ConfigDeprecation(FutureWarning):
    """A config key that still works under an older spelling; the CLI prints it as one ``warning:`` line."""
