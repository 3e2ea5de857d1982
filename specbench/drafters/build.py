"""Drafters named in a config (``model/drafter`` with ``kind: drafter``): one module + one yaml per drafter.

The yaml names a :class:`~specbench.drafters.base.Drafter` subclass, or a factory returning one, by its dotted
path (``target``) and gives its arguments (``params``)::

    kind: drafter
    name: prompt-lookup
    target: specbench.drafters.prompt_lookup.PromptLookupDrafter
    params: {max_matching_ngram_size: 2, num_output_tokens: 10}

A target whose signature has ``verifier`` / ``vocab_size`` receives the loaded verifier (a ``LoadedModel``)
and the vocabulary p and q share. :func:`check_drafter_spec` checks the target and its parameter names before
any model loads (it imports the target's module), and builds targets that need no verifier once, so their own
value checks run then too.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

INJECTED = ("verifier", "vocab_size")


def import_target(path: str, key: str = "model.drafter.target") -> Callable[..., Any]:
    module_name, _, attribute = str(path or "").rpartition(".")
    if not module_name:
        raise ValueError(f"{key} must be a dotted path such as specbench.drafters.ngram.NgramDrafter, got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{key}={path!r}: cannot import {module_name!r} ({err})") from err
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{key}={path!r}: {module_name!r} has no {attribute!r}") from None


def _signature(factory: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(factory.__init__ if inspect.isclass(factory) else factory)


def is_deterministic(factory: Callable[..., Any]) -> bool:
    """Whether the drafter proposes without a distribution q (a class attribute; factories: False)."""
    return bool(getattr(factory, "deterministic", False)) if inspect.isclass(factory) else False


def check_drafter_spec(target: str, params: dict[str, Any], key: str = "model.drafter") -> Callable[..., Any]:
    """The target of a ``kind: drafter`` spec, with its parameter names (and, when it needs no verifier, its
    values) checked; raises ValueError naming ``<key>.params.<name>`` or the target."""
    from specbench.drafters.base import Drafter

    factory = import_target(target, f"{key}.target")
    if inspect.isclass(factory) and not issubclass(factory, Drafter):
        raise ValueError(f"{key}.target={target!r} is not a specbench Drafter (specbench.drafters.base.Drafter)")
    parameters = _signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    accepted = [name for name in parameters if name not in ("self", *INJECTED)]
    unknown = [name for name in params if name in INJECTED or (name not in accepted and not takes_any)]
    if unknown:
        raise ValueError(
            f"{key}.params: {target} takes no parameter {unknown[0]!r}; allowed: {accepted}"
        )
    if not any(name in parameters for name in INJECTED):
        try:
            factory(**params)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{key}.params: {' '.join(str(err).split())}") from err
    return factory


def build_drafter(target: str, params: dict[str, Any], verifier: Any, vocab_size: int, name: str | None = None):
    """The drafter a ``kind: drafter`` spec describes, for this verifier and shared vocabulary."""
    factory = import_target(target)
    parameters = _signature(factory).parameters
    kwargs = dict(params)
    if "verifier" in parameters:
        kwargs["verifier"] = verifier
    if "vocab_size" in parameters:
        kwargs["vocab_size"] = vocab_size
    drafter = factory(**kwargs)
    if name:
        drafter.name = name
    return drafter
