"""One error family the CLI prints as a single clean line (no traceback).

Every message says what was wrong, what is allowed, and, where it helps, what to run next.
"""

from __future__ import annotations

import click


class DFlashTrtError(click.ClickException):
    """Base of every user-facing error; click prints `Error: <message>` and exits 1."""


class ConfigError(DFlashTrtError):
    """A config file or a config field is missing, malformed or out of range."""


class CheckpointError(DFlashTrtError):
    """A checkpoint folder is missing a file or tensor, or a tensor has the wrong shape."""


class UnsupportedModelError(DFlashTrtError):
    """The checkpoint is readable but its architecture or feature is not supported."""


class MissingDependencyError(DFlashTrtError):
    """An optional package or binary is not installed; the message names the install command."""


class RequestError(DFlashTrtError):
    """A generation request has invalid parameters (empty prompt, top_p out of range, ...)."""


class ServerStartError(DFlashTrtError):
    """tritonserver did not come up; the message carries the reason from its output."""


def field_error(path: str | object, field: str, problem: str) -> ConfigError:
    """`ConfigError` naming the file and the dotted field path: 'f.json: field a.b: problem'."""
    return ConfigError(f"{path}: field '{field}': {problem}")
