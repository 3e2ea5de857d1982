"""Training batches from task=synth rows: right-padding, and the frozen verifier's part of a batch — its
taps and its next-token targets over a draft vocabulary (packed as the feature cache stores them, or
scattered to (B, T, ·) as the EAGLE-3 loss reads them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from specbench.models.draft_vocab import DraftVocab
from specbench.models.taps import check_taps, record_states


@torch.no_grad()
def verifier_taps(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, taps: Sequence[int]
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """({tap: (B, T, H)}, final-normed last hidden state (B, T, H)) of one forward of the verifier's base
    model (no LM head over every position), recorded as the engine records them
    (:func:`specbench.models.taps.record_states`)."""
    taps = check_taps(model, taps, "taps")
    with record_states(model, taps) as recorded:
        out = model.base_model(input_ids=input_ids, attention_mask=attention_mask)
    return dict(recorded.taps), out.last_hidden_state


def predict_positions(attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) positions whose next token exists and is a response token (position t predicts t + 1)."""
    mask = torch.zeros_like(attention_mask, dtype=torch.bool)
    mask[:, :-1] = loss_mask[:, 1:].bool() & attention_mask[:, 1:].bool()
    return mask


@dataclass(frozen=True)
class TargetSpec:
    """What the targets are: the verifier's logits over ``vocab`` (top ``top_k`` of them, or all)."""

    vocab: DraftVocab
    top_k: int | None = None

    @property
    def width(self) -> int:
        return self.top_k if self.top_k else self.vocab.size

    def identity(self) -> dict:
        return {
            "vocab": self.vocab.fingerprint(),
            "vocab_size": self.vocab.vocab_size,
            "draft_vocab_size": self.vocab.size,
            "top_k": self.top_k,
        }


@torch.no_grad()
def verifier_targets(
    model: nn.Module, batch: dict[str, torch.Tensor], taps: Sequence[int], targets: TargetSpec | None
) -> dict[str, torch.Tensor]:
    """The verifier pass over a right-padded batch (``input_ids``, ``attention_mask``, ``loss_mask``), its
    targets packed as the cache stores them: ``features`` (B, T, len(taps)·H) in ``taps`` order (absent
    without taps); with ``targets``: ``predict`` (B, T) bool and, for the N predict positions in row-major
    order (the order of ``tensor[predict]``), ``target_values`` (N, K) restricted logits (fp32),
    ``target_index`` (N, K) draft ids (top-k only) and ``in_vocab`` (N,) bool."""
    ids, attention = batch["input_ids"], batch["attention_mask"]
    states, last = verifier_taps(model, ids, attention, taps)
    out = {"features": torch.cat([states[t] for t in taps], dim=-1)} if taps else {}
    if targets is None:
        return out
    predict = predict_positions(attention, batch["loss_mask"])
    vocab = targets.vocab
    logits = model.get_output_embeddings()(last[predict])[:, : vocab.vocab_size].float()
    values = vocab.restrict(logits)
    out.update(predict=predict, in_vocab=vocab.contains(logits.argmax(dim=-1)))
    if targets.top_k:
        values, out["target_index"] = torch.topk(values, min(targets.top_k, vocab.size), dim=-1)
    out["target_values"] = values
    return out


PACKED_TARGETS = ("target_values", "target_index", "in_vocab")


def dense_targets(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with its packed targets (N, ·) scattered to (B, T, ·) at the ``predict`` positions (0, or
    False, elsewhere)."""
    if "target_values" not in batch:
        return batch
    predict, out = batch["predict"], dict(batch)
    for key in PACKED_TARGETS:
        if key in batch:
            packed = batch[key]
            dense = packed.new_zeros((*predict.shape, *packed.shape[1:]))
            dense[predict] = packed
            out[key] = dense
    return out


def verifier_batch(
    model: nn.Module, batch: dict[str, torch.Tensor], taps: Sequence[int], targets: TargetSpec | None
) -> dict[str, torch.Tensor]:
    """Dense verifier features and targets for a right-padded batch (``input_ids``, ``attention_mask``,
    ``loss_mask``): ``features`` (B, T, len(taps)·H) in ``taps`` order; with ``targets``: ``predict``
    (B, T) bool, ``target_values`` (B, T, K) restricted logits (0 off the predict positions),
    ``target_index`` (B, T, K) draft ids (top-k only) and ``in_vocab`` (B, T) bool."""
    return dense_targets(verifier_targets(model, batch, taps, targets))


def pad_batch(rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad synthetic rows into input_ids / attention_mask / loss_mask / prompt_len tensors."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    loss = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = torch.tensor(row["input_ids"])
        attention[i, :n] = 1
        loss[i, :n] = torch.tensor(row["loss_mask"])
    prompt_len = torch.tensor([int(r["prompt_len"]) for r in rows], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss, "prompt_len": prompt_len}
