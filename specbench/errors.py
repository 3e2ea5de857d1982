"""Errors a user can act on, shared by config validation, tasks and tracking (no heavy imports)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value is invalid; the one-line message names the key and the allowed values."""


class DatasetNotFoundError(ConfigError, FileNotFoundError):
    """``dataset.path`` names a file that does not exist."""
