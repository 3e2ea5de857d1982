"""Logits warping shared by verifier and drafter: temperature, top-k, top-p (methods.md §1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Warping:
    """Sampling settings applied identically to p and q. ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped next-token distribution over the last dim, in float32.

        Greedy decoding uses the plain softmax (T = 1, no truncation): greedy rules take argmaxes,
        and the ensemble rules mix these distributions exactly as HF transformers does.
        """
        logits = logits.float()
        if self.greedy:
            return torch.softmax(logits, dim=-1)
        logits = logits / self.temperature
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            logits = _top_p_filter(logits, self.top_p)
        return torch.softmax(logits, dim=-1)


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of top tokens whose mass reaches ``top_p`` (always at least one)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Remove a token when the mass strictly before it already reaches top_p.
    remove_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of ``probs`` (..., V) -> (...)."""
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return ids.reshape(probs.shape[:-1])
