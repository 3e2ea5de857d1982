"""Dotted paths to objects: what a config's ``target:`` names (a drafter class, a verification rule)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def import_target(path: str, key: str = "model.drafter.target") -> Callable[..., Any]:
    """The object ``path`` (``package.module.Name``) names; ValueError naming ``key`` when it does not import."""
    module_name, _, attribute = str(path or "").rpartition(".")
    if not module_name:
        raise ValueError(
            f"{key} must be a dotted path such as specbench.drafters.ngram.NgramDrafter, got {path!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{key}={path!r}: cannot import {module_name!r} ({err})") from err
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{key}={path!r}: {module_name!r} has no {attribute!r}") from None
