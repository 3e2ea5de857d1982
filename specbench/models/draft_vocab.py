"""A reduced draft vocabulary: which verifier tokens a drafter can propose, and the maps between id spaces.

EAGLE-3 heads (and model drafters that opt in) predict over ``size`` draft ids instead of the verifier's
``vocab_size`` ids. The draft vocabulary is the ``size`` most frequent *loss-masked* (response) tokens of
the training data, padded with the lowest unused ids when the data has fewer distinct tokens (SpecForge
``process_token_dict_to_mappings``; ties broken by the lower id here, so the result does not depend on
the order rows are read). Maps, in the SpecForge / vLLM convention:

- ``d2t`` (size,) offsets: draft id ``i`` is target id ``i + d2t[i]`` (target ids ascending);
- ``t2d`` (vocab_size,) bool: whether a target id is in the draft vocabulary.

Sources (:func:`load_draft_vocab`): a ``task=synth`` output (counted with :func:`draft_vocab_for`, as
``task=train method=eagle3`` does) or the vocabulary a trained EAGLE-3 head saved in its checkpoint.

Exactness: :meth:`DraftVocab.expand_logits` puts ``-inf`` on every target id outside the draft
vocabulary, so any warping of the result gives q = 0 there (and :meth:`expand_probs` writes exact
zeros); a token the drafter cannot propose then has q = 0 and the ``sd`` rule stays exact.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch


class DraftVocab:
    """The sorted target ids of a draft vocabulary, with ``d2t`` / ``t2d`` and id/distribution maps."""

    def __init__(self, draft_ids: Sequence[int] | torch.Tensor, vocab_size: int):
        ids = torch.as_tensor(draft_ids, dtype=torch.long).flatten().cpu()
        if ids.numel() == 0:
            raise ValueError("a draft vocabulary needs at least one token")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("draft vocabulary ids must be strictly increasing target ids (no duplicates)")
        if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
            raise ValueError(
                f"draft vocabulary ids must lie in [0, {vocab_size}) (the verifier vocabulary); got "
                f"[{int(ids[0])}, {int(ids[-1])}]"
            )
        self.draft_ids = ids
        self.vocab_size = int(vocab_size)
        self._inverse = torch.full((self.vocab_size,), -1, dtype=torch.long)
        self._inverse[ids] = torch.arange(ids.numel())
        self._device_cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    # --- construction -------------------------------------------------------------------------------

    @classmethod
    def full(cls, vocab_size: int) -> DraftVocab:
        """The identity map: every target id is a draft id."""
        return cls(torch.arange(vocab_size), vocab_size)

    @classmethod
    def from_counts(cls, counts: Mapping[int, int], draft_vocab_size: int, vocab_size: int) -> DraftVocab:
        """The ``draft_vocab_size`` most frequent ids of ``counts`` (ties: lower id first), padded with the
        lowest ids that never occur when fewer distinct ids were counted."""
        if not 1 <= draft_vocab_size <= vocab_size:
            raise ValueError(
                f"draft_vocab_size must be in [1, {vocab_size}] (the verifier vocabulary), "
                f"got {draft_vocab_size}"
            )
        outside = [t for t in counts if not 0 <= int(t) < vocab_size]
        if outside:
            raise ValueError(
                f"token ids {sorted(outside)[:4]} lie outside the verifier vocabulary of {vocab_size}"
            )
        ranked = sorted(
            ((int(t), int(c)) for t, c in counts.items() if c > 0), key=lambda tc: (-tc[1], tc[0])
        )
        chosen = {t for t, _ in ranked[:draft_vocab_size]}
        candidate = 0
        while len(chosen) < draft_vocab_size:  # SpecForge: the lowest unused ids
            if candidate not in chosen:
                chosen.add(candidate)
            candidate += 1
        return cls(sorted(chosen), vocab_size)

    @classmethod
    def from_rows(
        cls, rows: Iterable[tuple[Sequence[int], Sequence[int]]], draft_vocab_size: int, vocab_size: int
    ) -> DraftVocab:
        """From ``(input_ids, loss_mask)`` rows: counts the tokens where the loss mask is 1."""
        return cls.from_counts(count_response_tokens(rows), draft_vocab_size, vocab_size)

    @classmethod
    def from_mappings(cls, d2t: torch.Tensor, vocab_size: int, t2d: torch.Tensor | None = None) -> DraftVocab:
        """From a checkpoint's ``d2t`` offsets (and ``t2d`` mask, checked against them when given)."""
        d2t = torch.as_tensor(d2t).long().flatten().cpu()
        vocab = cls(torch.arange(d2t.numel()) + d2t, vocab_size)
        if t2d is not None:
            t2d = torch.as_tensor(t2d).bool().flatten().cpu()
            if t2d.numel() != vocab_size or not torch.equal(t2d, vocab.t2d):
                raise ValueError(
                    "the checkpoint's t2d mask does not match its d2t offsets (or the verifier vocabulary of "
                    f"{vocab_size}); the draft vocabulary maps are corrupt"
                )
        return vocab

    # --- maps ---------------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.draft_ids.numel()

    @property
    def is_full(self) -> bool:
        return self.size == self.vocab_size

    @property
    def d2t(self) -> torch.Tensor:
        """(size,) offsets: target id = draft id + d2t[draft id]."""
        return self.draft_ids - torch.arange(self.size)

    @property
    def t2d(self) -> torch.Tensor:
        """(vocab_size,) bool: target id is in the draft vocabulary."""
        return self._inverse >= 0

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._device_cache:
            self._device_cache[device] = (self.draft_ids.to(device), self._inverse.to(device))
        return self._device_cache[device]

    def to_target(self, draft: torch.Tensor) -> torch.Tensor:
        """Draft ids → target ids (any shape)."""
        ids, _ = self._on(draft.device)
        return ids[draft]

    def to_draft(self, target: torch.Tensor) -> torch.Tensor:
        """Target ids → draft ids, -1 for ids outside the draft vocabulary."""
        _, inverse = self._on(target.device)
        return inverse[target]

    def contains(self, target: torch.Tensor) -> torch.Tensor:
        return self.to_draft(target) >= 0

    def restrict(self, target_values: torch.Tensor) -> torch.Tensor:
        """(..., vocab_size) → (..., size): the entries of the draft vocabulary (e.g. verifier logits)."""
        if self.is_full:
            return target_values[..., : self.vocab_size]
        ids, _ = self._on(target_values.device)
        return target_values.index_select(-1, ids)

    def expand_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """(..., size) → (..., vocab_size) logits, ``-inf`` outside the draft vocabulary."""
        if self.is_full:
            return draft_logits
        ids, _ = self._on(draft_logits.device)
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, ids, draft_logits)

    def expand_probs(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """(..., size) → (..., vocab_size) probabilities, exactly 0 outside the draft vocabulary."""
        if self.is_full:
            return draft_probs
        ids, _ = self._on(draft_probs.device)
        out = draft_probs.new_zeros((*draft_probs.shape[:-1], self.vocab_size))
        return out.index_copy_(-1, ids, draft_probs)

    def fingerprint(self) -> str:
        """A short hash of the vocabulary (its ids and the verifier vocabulary size)."""
        digest = hashlib.sha256(str(self.vocab_size).encode() + self.draft_ids.numpy().tobytes())
        return digest.hexdigest()[:16]

    def coverage(self, counts: Mapping[int, int]) -> float:
        """Share of the counted tokens that lie in this vocabulary (1.0 when nothing was counted)."""
        total = sum(counts.values())
        inside = sum(
            c for t, c in counts.items() if 0 <= int(t) < self.vocab_size and self._inverse[int(t)] >= 0
        )
        return inside / total if total else 1.0

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DraftVocab)
            and self.vocab_size == other.vocab_size
            and torch.equal(self.draft_ids, other.draft_ids)
        )

    def __repr__(self) -> str:
        return f"DraftVocab(size={self.size}, vocab_size={self.vocab_size}, fingerprint={self.fingerprint()})"


def count_response_tokens(rows: Iterable[tuple[Sequence[int], Sequence[int]]]) -> Counter:
    """Token frequencies over the loss-masked positions of ``(input_ids, loss_mask)`` rows."""
    counts: Counter = Counter()
    for ids, mask in rows:
        if len(ids) != len(mask):
            raise ValueError(f"a row has {len(ids)} input_ids but {len(mask)} loss_mask entries")
        counts.update(t for t, m in zip(ids, mask) if m)
    return counts


def draft_vocab_for(
    data: Any, draft_vocab_size: int | None, vocab_size: int, key: str = "train.draft_vocab_size"
) -> tuple[DraftVocab, float]:
    """The draft vocabulary of a synthetic dataset's training split (``data``: the DatasetDict of
    ``load_synthetic``; None: the full vocabulary) and the share of its response tokens it covers."""
    counts = count_response_tokens(zip(data["train"]["input_ids"], data["train"]["loss_mask"]))
    if draft_vocab_size is None or int(draft_vocab_size) == vocab_size:
        vocab = DraftVocab.full(vocab_size)
    else:
        if not 1 <= int(draft_vocab_size) <= vocab_size:
            raise ValueError(
                f"{key} must be in [1, {vocab_size}] (the verifier vocabulary) or null (the full "
                "vocabulary), "
                f"got {draft_vocab_size}"
            )
        vocab = DraftVocab.from_counts(counts, int(draft_vocab_size), vocab_size)
    return vocab, vocab.coverage(counts)


def vocab_metadata(vocab: DraftVocab) -> dict[str, Any]:
    """What a trained checkpoint records of the draft vocabulary it learned over (read back by
    :func:`saved_draft_vocab`)."""
    return {
        "draft_vocab_size": vocab.size,
        "draft_vocab_ids": vocab.draft_ids.tolist(),
        "draft_vocab_fingerprint": vocab.fingerprint(),
    }


def saved_draft_vocab(
    metadata: Mapping[str, Any], vocab_size: int, tokenizer_hash: str, where: str
) -> DraftVocab:
    """The draft vocabulary a checkpoint's metadata holds (``draft_vocab_ids``: an EAGLE-3 head of
    ``task=train method=eagle3``, a drafter trained over a draft vocabulary by ``method=distill|sd2``),
    refused when it was built for another tokenizer or vocabulary size."""
    if "draft_vocab_ids" not in metadata:
        raise ValueError(
            f"{where} holds no draft vocabulary (no draft_vocab_ids; method={metadata.get('method')!r}): "
            "pass "
            "the trained.pt of `task=train method=eagle3` or a task=synth output dir"
        )
    saved = {"tokenizer_hash": metadata.get("tokenizer_hash"), "vocab_size": metadata.get("vocab_size")}
    now = {"tokenizer_hash": tokenizer_hash, "vocab_size": vocab_size}
    if any(saved[k] is not None and saved[k] != now[k] for k in saved):
        raise ValueError(
            f"{where} holds a draft vocabulary built for another tokenizer (tokenizer hash "
            f"{saved['tokenizer_hash']}, vocabulary {saved['vocab_size']}) than the verifier's (hash "
            f"{tokenizer_hash}, vocabulary {vocab_size}); build one from this verifier's task=synth data"
        )
    vocab = DraftVocab(metadata["draft_vocab_ids"], vocab_size)
    fingerprint = metadata.get("draft_vocab_fingerprint")
    if fingerprint is not None and fingerprint != vocab.fingerprint():
        raise ValueError(
            f"{where}: draft_vocab_ids do not match its draft_vocab_fingerprint (a corrupt file)"
        )
    return vocab


def load_draft_vocab(
    source: str,
    draft_vocab_size: int | None,
    vocab_size: int,
    tokenizer_hash: str,
    key: str = "model.drafter",
) -> tuple[DraftVocab, dict[str, Any]]:
    """A model drafter's draft vocabulary (``{key}.draft_vocab`` / ``{key}.draft_vocab_size``) and what
    describes it (size, source, coverage of the source's response tokens when known).

    ``source``: a checkpoint file holding a saved vocabulary (:func:`saved_draft_vocab`; its size, which
    ``draft_vocab_size`` must equal when set), or ``task=synth`` output dir(s), comma separated, whose
    ``draft_vocab_size`` most frequent response tokens are kept (:func:`draft_vocab_for`). Relative paths
    that do not exist from the working directory are read from the project root. ``vocab_size`` and
    ``tokenizer_hash``: the verifier's shared vocabulary and tokenizer, which the source must have."""
    from specbench.models.checkpoints import read_checkpoint_metadata, resolve_project_path

    where = f"{key}.draft_vocab={source!r}"
    path = Path(resolve_project_path(source))
    if path.is_file():
        metadata = read_checkpoint_metadata(path)
        vocab = saved_draft_vocab(metadata, vocab_size, tokenizer_hash, where)
        if draft_vocab_size is not None and int(draft_vocab_size) != vocab.size:
            raise ValueError(
                f"{key}.draft_vocab_size={draft_vocab_size} but {where} holds a vocabulary of {vocab.size} "
                f"tokens; set {key}.draft_vocab_size={vocab.size} or null"
            )
        coverage = metadata.get("draft_vocab_coverage")
    else:
        from specbench.data.synth_dataset import load_synthetic

        if draft_vocab_size is None:
            raise ValueError(f"{key}.draft_vocab_size is null: set how many tokens to keep from {where}")
        data, meta = load_synthetic(source)
        if meta.get("tokenizer_hash") not in (None, tokenizer_hash):
            raise ValueError(
                f"{where} was tokenized with another tokenizer (hash {meta['tokenizer_hash']}) than the "
                f"verifier's ({tokenizer_hash}); count from task=synth data of this verifier"
            )
        vocab, coverage = draft_vocab_for(data, draft_vocab_size, vocab_size, f"{key}.draft_vocab_size")
    info = {"draft_vocab_size": vocab.size, "draft_vocab": str(source), "draft_vocab_coverage": coverage}
    return vocab, info
