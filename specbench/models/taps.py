"""Reading hidden states out of a stock transformers decoder: one convention for every consumer.

Tap ``i`` (``0 <= i <= L`` for a model with ``L`` decoder layers) is the residual stream after ``i``
layers, before the final norm: the input of decoder layer ``i`` for ``i < L`` (``0`` is the embedding
output) and the input of the final norm for ``i = L``. The *last hidden state* is the input of the LM
head (the final-normed state, ``lm_head(last) == logits``). Both are recorded with forward pre-hooks
around one forward call, so they do not depend on how a transformers version fills
``output_hidden_states`` (in 5.24 its last entry is already normed while the others are not), and a
drafter that shares modules with the verifier (early exit) never records into the verifier's taps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    layers = getattr(getattr(model, "base_model", model), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"cannot find the decoder layers of {type(model).__name__} (expected base_model.layers)"
        )
    return layers


def final_norm(model: nn.Module) -> nn.Module:
    norm = getattr(getattr(model, "base_model", model), "norm", None)
    if not isinstance(norm, nn.Module):
        raise TypeError(f"cannot find the final norm of {type(model).__name__} (expected base_model.norm)")
    return norm


def depth(model: nn.Module) -> int:
    """Number of decoder layers the model runs (``L``; taps are ``0..L``)."""
    return int(getattr(model.config, "num_hidden_layers", len(decoder_layers(model))))


def check_taps(model: nn.Module, taps: Sequence[int], key: str = "taps") -> tuple[int, ...]:
    taps = tuple(int(i) for i in taps)
    top = depth(model)
    bad = [i for i in taps if not 0 <= i <= top]
    if bad:
        raise ValueError(
            f"{key}: tap indices must be in [0, {top}] (0 = embeddings, {top} = the last layer's output "
            f"before the final norm) for a model with {top} layers; got {list(taps)}"
        )
    return taps


class StateRecorder:
    """What :func:`record_states` captured in one forward: ``taps[i]`` and ``last`` (each (B, W, H))."""

    def __init__(self) -> None:
        self.taps: dict[int, torch.Tensor] = {}
        self.last: torch.Tensor | None = None


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor:
    if args:
        return args[0]
    return kwargs["hidden_states"] if "hidden_states" in kwargs else next(iter(kwargs.values()))


@contextlib.contextmanager
def record_states(model: nn.Module, taps: Sequence[int] = (), last: bool = False) -> Iterator[StateRecorder]:
    """Within the block, forwards of ``model`` record the requested taps and the LM head's input."""
    recorder = StateRecorder()
    handles = []

    def keep(key):
        def hook(module, args, kwargs):
            value = _first_tensor(args, kwargs)
            if key == "last":
                recorder.last = value
            else:
                recorder.taps[key] = value
        return hook

    try:
        if taps:
            layers, top = decoder_layers(model), depth(model)
            for i in sorted(set(taps)):
                module = final_norm(model) if i == top else layers[i]
                handles.append(module.register_forward_pre_hook(keep(i), with_kwargs=True))
        if last:
            handles.append(
                model.get_output_embeddings().register_forward_pre_hook(keep("last"), with_kwargs=True)
            )
        yield recorder
    finally:
        for handle in handles:
            handle.remove()
