"""The DIVERSED training objective (methods.md §5): REINFORCE with an EMA baseline, and the regulariser.

    L = −mean_b[(R_b − b) · Σ_t log π(y_t)]  +  regulariser,

where the regulariser *rewards* acceptance, ``tv``: −λ · mean_t (1 − TV(q_t, π_t)) (for the linear pool
1 − TV(q, π) = 1 − (1 − w)·TV(p, q), the per-token acceptance of speculative sampling against π), or
``l2``: λ · (mean_t w_t − target_weight)².
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specbench.values import DIVERSED_REGULARIZERS as REGULARIZERS


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def reinforce_loss(
    log_probs: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor, baseline: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(−mean_b[(R_b − b) · Σ_t log π(y_t)], advantages R − b); the advantages carry no gradient."""
    advantages = (rewards.to(log_probs.dtype) - baseline).detach()
    sequence_log_prob = (log_probs * mask.to(log_probs.dtype)).sum(dim=1)
    return -(advantages * sequence_log_prob).mean(), advantages


def regularizer_loss(
    kind: str, strength: float, agreement: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor,
    target_weight: float = 0.5,
) -> torch.Tensor:
    """``tv``: −λ · mean_t(1 − TV(q_t, π_t)) (minimising it raises acceptance); ``l2``: λ·(mean w −
    target)²."""
    if kind == "tv":
        return -strength * masked_mean(agreement, mask)
    if kind == "l2":
        return strength * (masked_mean(weights, mask) - target_weight) ** 2
    raise ValueError(f"train.regularizer: unknown {kind!r}; allowed: {list(REGULARIZERS)}")


def update_baseline(baseline: float | None, rewards: Sequence[float], ema: float) -> float:
    """EMA of the batch mean reward; the first batch sets it."""
    mean = float(sum(rewards) / len(rewards))
    return mean if baseline is None else ema * baseline + (1.0 - ema) * mean


def gate_loss(rollout, strength: float) -> torch.Tensor:
    """Cross-entropy of the head's w_t against the per-token optimum of the ``expected_verifier_logp`` +
    ``tv`` objective at strength λ: label 1 where drafting costs less likelihood than λ times the acceptance
    it buys, Σ (p − q) log p < λ·TV(p, q). A supervised signal per token, where the objective's own gradient
    is dominated by the shared bias (docs/diversed.md)."""
    tv = 1.0 - rollout.verifier_agreement
    label = (rollout.drafting_cost < strength * tv).to(rollout.weights.dtype)
    w = rollout.weights.clamp(1e-6, 1 - 1e-6)
    bce = -(label * torch.log(w) + (1.0 - label) * torch.log(1.0 - w))
    return masked_mean(bce, rollout.mask)
