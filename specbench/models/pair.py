"""Checks that a verifier/drafter pair can be compared token by token."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase


class PairMismatchError(ValueError):
    """The verifier and drafter cannot share one vocabulary."""


class CheckpointMismatchError(ValueError):
    """A trained checkpoint (drafter, SD² steering, DIVERSED head) belongs to another model pair or method."""


def metadata_differences(saved: Mapping[str, Any], now: Mapping[str, Any], keys: Iterable[str]) -> str:
    """``"key: checkpoint A vs now B, ..."`` for the keys where a checkpoint's metadata differs; "" if
    none."""
    return ", ".join(
        f"{k}: checkpoint {saved.get(k)!r} vs now {now.get(k)!r}" for k in keys if saved.get(k) != now.get(k)
    )


def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """First 16 hex chars of the sha256 of the tokenizer's vocabulary sorted by id (then token)."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    payload = json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(payload).hexdigest()[:16]


def _model_id(model: PreTrainedModel) -> str:
    return getattr(model, "name_or_path", "") or type(model).__name__


def _lm_head_size(model: PreTrainedModel) -> int:
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(model.config.vocab_size)


def verifier_vocab_size(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    """The vocabulary p is compared over for a verifier alone: its tokenizer's ids within its LM head."""
    return min(len(tokenizer), int(model.get_output_embeddings().weight.shape[0]))


def shared_vocab_size(
    verifier: PreTrainedModel,
    drafter: PreTrainedModel,
    verifier_tokenizer: PreTrainedTokenizerBase,
    drafter_tokenizer: PreTrainedTokenizerBase,
) -> int:
    """Return ``len(tokenizer)``, the vocabulary both models share; raise PairMismatchError otherwise.

    Both LM heads may be padded beyond it (slice logits to this size before comparing p and q).
    """
    v_id, d_id = _model_id(verifier), _model_id(drafter)
    fix = "choose a drafter that shares the verifier's tokenizer"
    v_len, d_len = len(verifier_tokenizer), len(drafter_tokenizer)
    if verifier_tokenizer is not drafter_tokenizer:
        if v_len != d_len:
            raise PairMismatchError(
                f"Tokenizer vocabularies differ in size: verifier {v_id!r} has {v_len} tokens, "
                f"drafter {d_id!r} has {d_len}; {fix}."
            )
        v_hash, d_hash = tokenizer_hash(verifier_tokenizer), tokenizer_hash(drafter_tokenizer)
        if v_hash != d_hash:
            v_vocab, d_vocab = verifier_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
            diff = sorted(set(v_vocab.items()) ^ set(d_vocab.items()), key=lambda kv: kv[1])[:3]
            raise PairMismatchError(
                f"Tokenizer vocabularies differ: verifier {v_id!r} ({v_len} tokens, hash {v_hash}) vs "
                f"drafter {d_id!r} ({d_len} tokens, hash {d_hash}); first differing (token, id): {diff}; "
                f"{fix}."
            )
    for role, model_id, model in (("verifier", v_id, verifier), ("drafter", d_id, drafter)):
        head = _lm_head_size(model)
        if head < v_len:
            raise PairMismatchError(
                f"The {role} {model_id!r} has an LM head of {head} rows, smaller than the shared tokenizer "
                f"vocabulary of {v_len} tokens (verifier {v_id!r}, drafter {d_id!r}); {fix}."
            )
    return v_len
