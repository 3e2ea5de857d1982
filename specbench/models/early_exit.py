"""Early-exit (self-speculative) drafter: the verifier's first K layers sharing its weights."""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel


def _truncated_config(config: PreTrainedConfig, num_layers: int) -> PreTrainedConfig:
    """Copy ``config`` with ``num_hidden_layers=num_layers`` and per-layer lists sliced to match."""
    depth = config.num_hidden_layers
    new = copy.deepcopy(config)
    for key, value in vars(config).items():
        if "layer" in key and isinstance(value, (list, tuple)) and len(value) == depth:
            setattr(new, key, type(value)(value[:num_layers]))
    new.num_hidden_layers = num_layers
    return new


def early_exit_drafter(verifier: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """Build a drafter from ``verifier``'s first ``num_layers`` decoder layers + final norm + LM head.

    The result is an instance of the verifier's own class whose modules *are* the verifier's modules
    (no copy: same tensor storage), so it works as ``generate(assistant_model=...)``. It keeps its own
    KV cache (layer indices 0..K-1). Moving or casting it moves the verifier too; training it would
    change the verifier (train copies instead).
    """
    depth = verifier.config.num_hidden_layers
    if not isinstance(num_layers, int) or not 1 <= num_layers < depth:
        raise ValueError(
            f"early_exit num_layers must be an integer with 1 <= K < {depth} (the verifier's depth); "
            f"got {num_layers!r}."
        )
    prefix = verifier.base_model_prefix
    verifier_base = getattr(verifier, prefix, None)
    if verifier_base is None or not isinstance(getattr(verifier_base, "layers", None), nn.ModuleList):
        raise TypeError(
            f"early_exit_drafter needs a decoder-only model with `{prefix}.layers`; got "
            f"{type(verifier).__name__}."
        )

    config = _truncated_config(verifier.config, num_layers)
    config.name_or_path = f"{verifier.name_or_path}:early_exit_{num_layers}"
    with torch.device("meta"):
        drafter = type(verifier)(config)

    drafter_base = getattr(drafter, prefix)
    for name, _ in list(drafter_base.named_children()):
        if name == "layers":
            drafter_base.layers = nn.ModuleList(list(verifier_base.layers[:num_layers]))
        else:
            setattr(drafter_base, name, getattr(verifier_base, name))
    for name, _ in list(drafter.named_children()):
        if name != prefix:
            setattr(drafter, name, getattr(verifier, name))

    meta = [n for n, t in [*drafter.named_parameters(), *drafter.named_buffers()] if t.is_meta]
    if meta:
        raise RuntimeError(f"early_exit_drafter left tensors on the meta device: {meta[:5]}")
    drafter.generation_config = copy.deepcopy(verifier.generation_config)
    drafter.train(verifier.training)
    return drafter
