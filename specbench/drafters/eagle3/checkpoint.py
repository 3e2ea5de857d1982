"""specbench's own EAGLE-3 checkpoints (``task=train method=eagle3``'s trained.pt / last.ckpt): the head's
weights under ``head.`` with the verifier's identity in the metadata, checked when a head loads, and
compacted to bf16 for committing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specbench.drafters.eagle3.head import Eagle3Head
from specbench.models.draft_vocab import DraftVocab

HEAD_PREFIX = "head."


IDENTITY_KEYS = (
    "verifier",
    "verifier_weights",
    "tokenizer_hash",
    "verifier_hidden",
    "verifier_layers",
    "vocab_size",
)


def verifier_identity(verifier: Any, vocab_size: int) -> dict[str, Any]:
    """The :data:`IDENTITY_KEYS` of a loaded verifier: what a trained head records and is checked against."""
    from specbench.drafters.trained import weights_fingerprint
    from specbench.models.pair import tokenizer_hash

    return {
        "verifier": verifier.name,
        "verifier_weights": weights_fingerprint(verifier.model),
        "tokenizer_hash": tokenizer_hash(verifier.tokenizer),
        "verifier_hidden": int(verifier.model.config.hidden_size),
        "verifier_layers": int(verifier.model.config.num_hidden_layers),
        "vocab_size": int(vocab_size),
    }


def check_verifier(metadata: dict, verifier: Any, vocab_size: int, where: str | Path) -> None:
    """Raise CheckpointMismatchError unless a trained head belongs to this verifier and vocabulary."""
    from specbench.models.pair import CheckpointMismatchError, metadata_differences

    if metadata.get("method") != "eagle3":
        raise CheckpointMismatchError(
            f"{str(where)!r} is a method={metadata.get('method')!r} checkpoint, not an EAGLE-3 head "
            "(method=eagle3)"
        )
    now = verifier_identity(verifier, vocab_size)
    shown = metadata_differences(metadata, now, IDENTITY_KEYS)
    if shown:
        raise CheckpointMismatchError(
            f"{str(where)!r} is an EAGLE-3 head for another verifier ({shown}); use model/verifier "
            f"{metadata.get('verifier')!r} or train a head for this one"
        )


def head_from_metadata(metadata: dict, verifier: Any, vocab_size: int) -> Eagle3Head:
    """The architecture a specbench EAGLE-3 checkpoint describes, on ``verifier`` (shared embedding; the
    final norm and, for ``lm_head: verifier``, the LM head rows initialised from the verifier)."""
    vocab = DraftVocab(metadata["draft_vocab_ids"], vocab_size)
    head = Eagle3Head.for_verifier(verifier.model, vocab, metadata["taps"])
    head.lm_head.requires_grad_(metadata.get("lm_head", "trained") == "trained")
    return head


def load_trained_eagle3(path: str | Path, verifier: Any, vocab_size: int) -> tuple[Eagle3Head, dict]:
    """The head that ``task=train method=eagle3`` saved (``trained.pt`` / ``last.ckpt``) and its metadata."""
    from specbench.models.checkpoints import read_checkpoint
    from specbench.models.pair import CheckpointMismatchError

    state, metadata = read_checkpoint(path)
    check_verifier(metadata, verifier, vocab_size, path)
    head = head_from_metadata(metadata, verifier, vocab_size)
    weights = {k.removeprefix(HEAD_PREFIX): v for k, v in state.items() if k.startswith(HEAD_PREFIX)}
    expected = {name for name, p in head.named_parameters() if p.requires_grad}
    if set(weights) != expected or len(weights) != len(state):
        raise CheckpointMismatchError(
            f"{str(path)!r} does not hold the weights of its EAGLE-3 head: missing "
            f"{sorted(expected - set(weights))[:4]}, unexpected "
            f"{sorted(set(state) - {HEAD_PREFIX + k for k in expected})[:4]}"
        )
    head.load_state_dict(weights, strict=False)
    param = next(verifier.model.parameters())
    return head.to(device=param.device, dtype=param.dtype).eval().requires_grad_(False), metadata


def compact_checkpoint(
    source: str | Path, out: str | Path, dtype: torch.dtype = torch.bfloat16, method: str = "eagle3"
) -> Path:
    """Write the weights of a ``method`` trained.pt / last.ckpt (an EAGLE-3 head, a DFlash drafter) in
    ``dtype`` with the same metadata (no optimiser state): the file to commit or share. Loading casts the
    weights back to the verifier's dtype."""
    from specbench.models.checkpoints import read_checkpoint
    from specbench.models.pair import CheckpointMismatchError

    state, metadata = read_checkpoint(source)
    if metadata.get("method") != method:
        what = {"eagle3": "an EAGLE-3 head", "dflash": "a DFlash drafter"}.get(method, f"method={method}")
        raise CheckpointMismatchError(
            f"{str(source)!r} is not {what} (a method={metadata.get('method')!r} checkpoint)"
        )
    weights = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stored = {**metadata, "stored_dtype": str(dtype).removeprefix("torch.")}
    torch.save({"state_dict": weights, "specbench": stored}, out)
    return out
