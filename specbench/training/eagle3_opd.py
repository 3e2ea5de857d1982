"""``task=train method=eagle3_opd``: on-policy distillation of an EAGLE-3 head (docs/training.md).

One pass of the head over every chain (the TTT unroll, :meth:`Eagle3Head.unroll`) gives its greedy drafts
from every candidate round start; the target-assisted rollout (:mod:`specbench.training.opd`) walks the
rounds decoding would run on the row and keeps, per visited round start ``t`` (head index: feature ``t``,
last committed token ``t + 1``), the drafts it is judged on: depths ``i < min(a + 1, γ)``. At those the head's
inputs are its own accepted drafts (they equal the row's tokens), so its state is the decoding state, and
the loss is ``KL(p ‖ q)`` against the verifier's distribution at the prefix the draft extends (over the
draft vocabulary, renormalised, the top-k of it with ``train.feature_top_k``), summed over the judged drafts
and divided by their number. Drafts past a rejection, which decoding never shows the verifier, get no loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from specbench.drafters.eagle3.head import Eagle3Head
from specbench.training.eagle3 import Eagle3Training, ttt_chains
from specbench.training.opd import Rollout, leading_accepts, rollout_metrics, walk_rounds


def remaining(predict: torch.Tensor) -> torch.Tensor:
    """(B, T): how many response-predicting positions lie at or after each position."""
    return predict.long().flip(1).cumsum(1).flip(1)


def first_round(predict: torch.Tensor) -> torch.Tensor:
    """(B,) head index of each row's first round: the one whose first draft is the first response token
    (its target position is the first predicting one, minus one for the head's pairing); -1 without one."""
    has = predict.any(dim=1)
    first = predict.long().argmax(dim=1)
    return torch.where(has, (first - 1).clamp(min=0), torch.full_like(first, -1))


def unrolled_drafts(
    head: Eagle3Head, batch: dict[str, torch.Tensor], steps: int
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """The TTT unroll over every chain that reaches a response prediction, and the head's greedy draft
    (a token id) at every chain and depth: (outputs, chain index (B, W), inside (B, W), drafts
    (B, W, steps))."""
    ids, attention = batch["input_ids"], batch["attention_mask"].bool()
    chains = ttt_chains(batch["predict"].bool(), steps)
    features = batch["features"][:, :-1]
    outputs, heads, inside = head.unroll(ids[:, 1:], features, attention[:, 1:], steps, chains)
    outputs[0] = torch.gather(outputs[0], 1, heads.unsqueeze(-1).expand(-1, -1, outputs[0].shape[-1]))
    with torch.no_grad():
        drafts = torch.stack([head.logits(h).argmax(dim=-1) for h in outputs], dim=-1)
        drafts = head.vocab.to_target(drafts)
    return outputs, heads, inside, drafts


def chain_rollout(batch: dict[str, torch.Tensor], heads, inside, drafts: torch.Tensor, gamma: int) -> Rollout:
    """The target-assisted rollout over head indices: draft ``i`` of chain ``t`` is accepted when it is the
    row's token ``t + 2 + i`` (and that is a response token), the count is the leading run."""
    ids, predict = batch["input_ids"], batch["predict"].bool()
    length = ids.shape[1]
    depth = torch.arange(drafts.shape[-1], device=ids.device)
    targets = heads.unsqueeze(-1) + 1 + depth  # the verifier position each draft is judged at
    usable = inside.unsqueeze(-1) & (targets < length - 1)
    targets = targets.clamp(max=length - 2)
    flat = targets.reshape(ids.shape[0], -1)
    truth = ids.gather(1, flat + 1).reshape(targets.shape)
    responding = predict.gather(1, flat).reshape(targets.shape)
    accepts = leading_accepts(usable & responding & (drafts == truth))
    dense = torch.zeros(ids.shape[0], length - 1, dtype=torch.long, device=ids.device)
    dense.scatter_(1, heads, torch.where(inside, accepts, torch.zeros_like(accepts)))
    room = remaining(predict)[:, 1:]  # head index t: predictions at positions >= t + 1
    return walk_rounds(dense, first_round(predict), room, gamma)


def kl_to_targets(
    log_q: torch.Tensor, target_logits: torch.Tensor, index: torch.Tensor | None
) -> torch.Tensor:
    """Per row ``KL(p ‖ q)``, ``p`` the softmax of the verifier's (restricted) logits, over its support
    (the top-k ids ``index`` when given)."""
    log_p = F.log_softmax(target_logits.float(), dim=-1)
    on_support = log_q if index is None else log_q.gather(-1, index)
    return (log_p.exp() * (log_p - on_support)).sum(dim=-1)


def opd_loss(head: Eagle3Head, batch: dict[str, torch.Tensor], gamma: int) -> dict:
    """The on-policy loss of one batch (module docstring), with the rollout and per-depth agreement."""
    ids = batch["input_ids"]
    length = ids.shape[1]
    steps = min(gamma, length - 1)
    outputs, heads, inside, drafts = unrolled_drafts(head, batch, steps)
    rollout = chain_rollout(batch, heads, inside, drafts, steps)
    visited = rollout.visited.gather(1, heads) & inside
    reach = rollout.reach.gather(1, heads)
    in_vocab, values, index = batch["in_vocab"].bool(), batch["target_values"], batch.get("target_index")
    total = outputs[0].new_zeros((), dtype=torch.float32)
    judged = (reach * visited).sum()
    correct, counted_positions = [], []
    for step, hidden in enumerate(outputs):
        positions = (heads + 1 + step).clamp(max=length - 1)
        judging = visited & (step < reach)
        counted = judging & torch.gather(in_vocab, 1, positions)
        rows, columns = counted.nonzero(as_tuple=True)
        targets = positions[rows, columns]
        log_q = F.log_softmax(head.logits(hidden[rows, columns]).float(), dim=-1)
        step_index = None if index is None else index[rows, targets]
        total = total + kl_to_targets(log_q, values[rows, targets], step_index).sum()
        truth = ids.gather(1, (positions + 1).clamp(max=length - 1))
        correct.append((judging & (drafts[..., step] == truth)).sum())
        counted_positions.append(judging.sum())
    return {
        "loss": total / judged.clamp(min=1),
        "rollout": rollout,
        "correct": correct,
        "positions": counted_positions,
        "head_tokens": inside.sum() * (steps - 1) + batch["attention_mask"][:, 1:].sum(),
    }


class Eagle3OpdTraining(Eagle3Training):
    """:class:`Eagle3Training` with the on-policy objective (validation as for SFT, plus the rollout)."""

    objective = "opd"

    def __init__(self, *args: Any, gamma: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.chain_fraction < 1.0:
            raise ValueError(
                "method=eagle3_opd walks the rounds over every chain; train.ttt_chain_fraction must be 1 "
                f"(got {self.chain_fraction})"
            )
        self.steps = gamma  # the head drafts γ per round, as decoding with γ = method.opd_gamma

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        batch = self._with_features(batch)
        out = opd_loss(self.head, batch, self.steps)
        size = batch["input_ids"].shape[0]
        self.log("train/loss", out["loss"], prog_bar=True, batch_size=size)
        for key, value in rollout_metrics(out["rollout"]).items():
            self.log(f"train/{key}", value, batch_size=size)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=size)
        heads = int(out["head_tokens"])
        self.count_compute(size, int(batch["attention_mask"].sum()), heads, heads)
        return out["loss"]

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        out = opd_loss(self.head, self._with_features(batch), self.steps)
        size = batch["input_ids"].shape[0]
        self.log("val/opd_loss", out["loss"], batch_size=size, sync_dist=True)
        self.log("val/rollout_tau", out["rollout"].tau, batch_size=size, sync_dist=True)
