"""The starting weights of a DFlash draft network for ``task=train``: the verifier's last layers
(``train.init_layer=verifier_last``) or a drafter trained before (``train.init_head``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specbench.drafters.dflash.model import DFlashDraftModel


@torch.no_grad()
def init_from_verifier(draft: DFlashDraftModel, verifier: torch.nn.Module) -> None:
    """``train.init_layer=verifier_last``: draft layer i starts as verifier layer ``L − n + i`` (attention,
    MLP, norms; a verifier without q/k norms leaves them at 1) and the final norm as the verifier's."""
    layers = verifier.base_model.layers
    n = len(draft.layers)
    for i, layer in enumerate(draft.layers):
        source = layers[len(layers) - n + i].state_dict()
        result = layer.load_state_dict(source, strict=False)
        extra = [k for k in result.missing_keys if not k.endswith(("q_norm.weight", "k_norm.weight"))]
        if extra or result.unexpected_keys:
            raise ValueError(
                f"train.init_layer=verifier_last: verifier layer {len(layers) - n + i} does not match a "
                "DFlash layer "
                f"(missing {extra[:3]}, unexpected {result.unexpected_keys[:3]}); use train.init_layer=random"
            )
    draft.norm.weight.copy_(verifier.base_model.norm.weight)


@torch.no_grad()
def warm_start(draft: DFlashDraftModel, path: str | Path, verifier: Any, vocab_size: int) -> None:
    """Start ``draft`` from a drafter trained before (``train.init_head``: the ``trained.pt`` / ``last.ckpt``
    of a task=train method=dflash run for this verifier, checked as when decoding), e.g. an SFT drafter that
    on-policy distillation continues. Its shape must be this training's (``train.dflash_*``)."""
    from specbench.drafters.dflash.checkpoint import DFlashCheckpointError, load_trained_dflash

    source, _ = load_trained_dflash(path, verifier, vocab_size)
    mine, theirs = draft.config.to_dict(), source.config.to_dict()
    differ = sorted(k for k in mine if mine.get(k) != theirs.get(k))
    if differ:
        shown = ", ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} here" for k in differ[:4])
        raise DFlashCheckpointError(
            f"train.init_head: {str(path)!r} is another DFlash shape ({shown}); set the train.dflash_* keys "
            "it was trained with"
        )
    draft.load_state_dict(source.state_dict())


def starting_weights(
    draft: DFlashDraftModel, init_layer: str, init_head: str | None, verifier: Any, vocab_size: int
) -> None:
    """Load ``train.init_head`` into ``draft`` when set (it excludes ``train.init_layer``)."""
    if init_head:
        if init_layer != "random":
            raise ValueError("train.init_head and train.init_layer both set the drafter's starting weights")
        warm_start(draft, init_head, verifier, vocab_size)
