"""A verifier and its drafter, from config: the drafter a ``model/drafter`` spec describes, loaded or built for
its verifier. Above the drafters, below the tasks.

Drafters named in a config (``kind: drafter``): one module + one yaml per drafter.

The yaml names a :class:`~specbench.decoding.protocol.Drafter` subclass, or a factory returning one, by its dotted
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

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specbench.targets import import_target

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from specbench.decoding.protocol import Drafter
    from specbench.models.loading import LoadedModel
    from specbench.models.sharding import Placement
    from specbench.models.spec import ModelSpec

INJECTED = ("verifier", "vocab_size")


def _signature(factory: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(factory.__init__ if inspect.isclass(factory) else factory)


def is_deterministic(factory: Callable[..., Any]) -> bool:
    """Whether the drafter proposes without a distribution q (a class attribute; factories: False)."""
    return bool(getattr(factory, "deterministic", False)) if inspect.isclass(factory) else False


def check_drafter_spec(target: str, params: dict[str, Any], key: str = "model.drafter") -> Callable[..., Any]:
    """The target of a ``kind: drafter`` spec, with its parameter names (and, when it needs no verifier, its
    values) checked; raises ValueError naming ``<key>.params.<name>`` or the target."""
    from specbench.decoding.protocol import Drafter  # torch loads here, not when config validation starts

    factory = import_target(target, f"{key}.target")
    if inspect.isclass(factory) and not issubclass(factory, Drafter):
        raise ValueError(
            f"{key}.target={target!r} is not a specbench Drafter (specbench.decoding.protocol.Drafter)"
        )
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


def build_drafter(
    target: str, params: dict[str, Any], verifier: Any, vocab_size: int, name: str | None = None
):
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


def load_drafter(
    spec: ModelSpec,
    verifier: LoadedModel,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    placement: Placement | None = None,
) -> LoadedModel | Drafter | None:
    """The drafter ``spec`` describes, next to ``verifier``: for kind "drafter" the
    :class:`~specbench.decoding.protocol.Drafter` its ``target`` builds (:func:`build_drafter`), for a model
    kind the loaded model (:func:`specbench.models.loading.load_drafter`), None for kind "none"."""
    from specbench.models import loading
    from specbench.models.pair import verifier_vocab_size

    if spec.kind == "drafter":
        vocab = verifier_vocab_size(verifier.model, verifier.tokenizer)
        return build_drafter(spec.target, dict(spec.params or {}), verifier, vocab, spec.name or None)
    return loading.load_drafter(spec, verifier, device, dtype, placement)
