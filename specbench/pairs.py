"""A verifier and its drafter, from config: the drafter a ``model/drafter`` spec describes, loaded or built
for its verifier. Above the drafters, below the tasks.

Drafters named in a config (``kind: drafter``): one module + one yaml per drafter.

The yaml names a :class:`~specbench.decoding.protocol.Drafter` subclass, or a factory returning one, by its
dotted path (``_target_``) and gives its arguments (``params``); it is built the way every configured thing
is, by :func:`specbench.targets.build_target` (Hydra's ``instantiate``)::

    kind: drafter
    name: prompt-lookup
    _target_: specbench.drafters.prompt_lookup.PromptLookupDrafter
    params: {max_matching_ngram_size: 2, num_output_tokens: 10}

The arguments sit under ``params`` because the node also holds what the framework reads about any drafter
(``name``, ``default_gamma``, ``tree_width``). A target whose signature has ``verifier`` / ``vocab_size``
receives the loaded verifier (a ``LoadedModel``) and the vocabulary p and q share. :func:`check_drafter_spec`
checks the target and its parameter names before any model loads (it imports the target's module), and builds
targets that need no verifier once, so their own value checks run then too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specbench.targets import accepted_names, build_target, check_target

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from specbench.decoding.protocol import Drafter
    from specbench.models.loading import LoadedModel
    from specbench.models.sharding import Placement
    from specbench.models.spec import ModelSpec

INJECTED = ("verifier", "vocab_size")


def is_deterministic(factory: Callable[..., Any]) -> bool:
    """Whether the drafter proposes without a distribution q (a class attribute; factories: False)."""
    return bool(getattr(factory, "deterministic", False)) if inspect.isclass(factory) else False


def check_drafter_spec(target: str, params: dict[str, Any], key: str = "model.drafter") -> Callable[..., Any]:
    """The ``_target_`` of a ``kind: drafter`` spec, with its parameter names (and, when it needs no
    verifier, its values) checked; raises ValueError naming ``<key>.params`` or ``<key>._target_``."""
    from specbench.decoding.protocol import Drafter  # torch loads here, not when config validation starts

    factory = check_target(target, params, key, INJECTED, f"{key}.params")
    if inspect.isclass(factory) and not issubclass(factory, Drafter):
        raise ValueError(
            f"{key}._target_={target!r} is not a specbench Drafter (specbench.decoding.protocol.Drafter)"
        )
    if not any(name in accepted_names(factory)[0] for name in INJECTED):
        try:
            build_target(target, params, key, f"{key}.params")
        except (TypeError, ValueError) as err:
            message = " ".join(str(err).split())
            raise ValueError(message if message.startswith(key) else f"{key}.params: {message}") from err
    return factory


def build_drafter(
    target: str, params: dict[str, Any], verifier: Any, vocab_size: int, name: str | None = None
):
    """The drafter a ``kind: drafter`` spec describes, for this verifier and shared vocabulary."""
    drafter = build_target(
        target, params, "model.drafter", "model.drafter.params", verifier=verifier, vocab_size=vocab_size
    )
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
        return build_drafter(spec._target_, dict(spec.params or {}), verifier, vocab, spec.name or None)
    return loading.load_drafter(spec, verifier, device, dtype, placement)
