"""FLy, training-free loosely speculative decoding (Li et al., arXiv 2511.22972, ICLR 2026): a lossy rule
that overrides a rejection when the verifier is uncertain there and the next drafts are accepted anyway.
The maths and the sources of every choice are in docs/rules-block-and-fly.md.

A draft x_i that exact SD rejects (greedy: x_i ≠ argmax p_i; sampling: u_i ≥ min(1, p_i(x_i)/q_i(x_i)))
is *deferred*, i.e. counted as accepted, iff all of

  * the verifier's top-k entropy H_k(p_i) = −Σ_{top k of p_i} p log p (natural log, not renormalised)
    is at least ``entropy_threshold`` (entropy-level gate);
  * p_i(x_i) > 0 (and q_i(x_i) > 0 when sampling);
  * a full window fits in the row's block: i + W < L (0-based i, L drafts);
  * the W following drafts x_{i+1..i+W} are each accepted by exact SD on their own (token-level
    deferred window; a deferred draft does not count inside another's window).

The round then accepts the longest prefix of accepted-or-deferred drafts and emits exact SD's correction
(residual of p and q, greedy argmax p) or the bonus token from p. Defaults follow vLLM
(docs/features/speculative_decoding/fly.md, vllm/v1/spec_decode/fly.py): W = min(6, L − 1), θ = 0.3, k = 3.
"""

from __future__ import annotations

import math

import torch

from specbench.decoding.rules import VerificationRule
from specbench.decoding.verification import Verdict
from specbench.decoding.warping import sample
from specbench.method_params import Param

DEFAULT_MAX_WINDOW = 6


def top_k_entropy(p: torch.Tensor, k: int) -> torch.Tensor:
    """−Σ p log p over the k largest entries of p (..., V) -> (...); k is capped at V."""
    top = torch.topk(p, min(k, p.shape[-1]), dim=-1).values
    terms = torch.where(top > 0, top * torch.log(torch.where(top > 0, top, 1.0)), torch.zeros_like(top))
    return -terms.sum(-1)


def max_top_k_entropy(k: int) -> float:
    """The largest value :func:`top_k_entropy` can take: max over s ∈ (0, 1] of s·ln(k/s)."""
    return math.log(k) if k >= math.e else k / math.e


class FlyRule(VerificationRule):
    """FLy deferred verification; accepts model drafters and deterministic ones (q one-hot)."""

    name = "fly"
    params = (
        Param("window_size", int, ge=1, label="window", nullable=True),
        Param("entropy_threshold", float, ge=0.0, label="entropy"),
        Param("entropy_top_k", int, ge=1, label="top_k"),
    )
    accepts_deterministic = True  # native acceptance is then p(x), vLLM's NO_DRAFT_PROBS path

    def __init__(
        self, window_size: int | None = None, entropy_threshold: float = 0.3, entropy_top_k: int = 3
    ):
        if window_size is not None and (isinstance(window_size, bool) or int(window_size) != window_size
                                        or window_size < 1):
            raise ValueError(f"method.window_size must be an integer >= 1 or null (= min(6, drafts - 1)), "
                             f"got {window_size!r}")
        if not entropy_threshold >= 0:
            raise ValueError(f"method.entropy_threshold must be >= 0 (nats), got {entropy_threshold}")
        if isinstance(entropy_top_k, bool) or int(entropy_top_k) != entropy_top_k or entropy_top_k < 1:
            raise ValueError(f"method.entropy_top_k must be an integer >= 1, got {entropy_top_k!r}")
        self.window_size = None if window_size is None else int(window_size)
        self.entropy_threshold = float(entropy_threshold)
        self.entropy_top_k = int(entropy_top_k)

    @property
    def lossless(self) -> bool:
        # Above the largest possible top-k entropy the gate never opens and FLy is exact SD.
        return self.entropy_threshold > max_top_k_entropy(self.entropy_top_k)

    def windows(self, draft_lens: torch.Tensor) -> torch.Tensor:
        """W of every row (B,): the configured size, or vLLM's default min(6, L − 1) (at least 1)."""
        if self.window_size is not None:
            return torch.full_like(draft_lens, self.window_size)
        return torch.clamp(torch.clamp(draft_lens - 1, max=DEFAULT_MAX_WINDOW), min=1)

    def deferrable(
        self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, greedy: bool
    ) -> torch.Tensor:
        """(B, G) bool: the gate and the support conditions of each drafted position (window aside)."""
        gamma = drafts.shape[1]
        p_drafted = p[:, :gamma]
        p_x = p_drafted.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        ok = (top_k_entropy(p_drafted, self.entropy_top_k) >= self.entropy_threshold) & (p_x > 0)
        if not greedy:
            ok &= q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1) > 0
        return ok

    def accept_mask(
        self, native: torch.Tensor, deferrable: torch.Tensor, draft_lens: torch.Tensor
    ) -> torch.Tensor:
        """(B, G) bool: drafts accepted natively or deferred (before the prefix rule)."""
        batch, gamma = native.shape
        positions = torch.arange(gamma, device=native.device).unsqueeze(0)
        lens = draft_lens.to(native.device).unsqueeze(1)
        in_draft = positions < lens
        native = native & in_draft
        window = self.windows(draft_lens).to(native.device).unsqueeze(1)
        # before[:, j] = number of natively accepted drafts among the first j; padded so i + 1 + W is in
        # range.
        padded = torch.cat([native, torch.zeros(batch, gamma + 1, dtype=torch.bool, device=native.device)], 1)
        before = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=native.device),
                            padded.long().cumsum(1)], 1)
        start = (positions + 1).expand(batch, -1)
        end = torch.clamp(start + window, max=before.shape[1] - 1)
        window_accepted = before.gather(1, end) - before.gather(1, start) == window
        fits = positions + window < lens
        deferred = ~native & deferrable & fits & window_accepted & in_draft
        return native | deferred

    def verify_block(
        self,
        p: torch.Tensor,
        q: torch.Tensor,
        drafts: torch.Tensor,
        draft_lens: torch.Tensor,
        greedy: bool,
        generator: torch.Generator | None = None,
        weights: torch.Tensor | None = None,
    ) -> Verdict:
        batch, gamma = drafts.shape
        rows = torch.arange(batch, device=p.device)
        lens = draft_lens.to(p.device)
        p_drafted = p[:, :gamma]
        # Same order of random draws as token-wise verification, so one seed gives both rules the same u_i.
        if greedy:
            native = self.greedy_accept(p_drafted, q, drafts)
        else:
            a = self.acceptance(p_drafted, q).gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
            u = torch.rand(a.shape, generator=generator, device=a.device, dtype=a.dtype)
            native = u < a
        ok = self.accept_mask(native, self.deferrable(p, q, drafts, greedy), lens)
        accepted = (
            ok.long().cumprod(1).sum(1) if gamma else torch.zeros(batch, dtype=torch.long, device=p.device)
        )

        bonus_p = p[rows, lens]
        next_token = bonus_p.argmax(-1) if greedy else sample(bonus_p, generator)
        rejected = accepted < lens
        if bool(rejected.any()):
            stop = torch.clamp(accepted, max=max(gamma - 1, 0))
            p_stop, q_stop = p[rows, stop][rejected], q[rows, stop][rejected]
            correction = (
                self.greedy_correction(p_stop, q_stop)
                if greedy
                else sample(self.residual(p_stop, q_stop), generator)
            )
            next_token = next_token.clone()
            next_token[rejected] = correction
        return Verdict(accepted=accepted, next_token=next_token)

    def describe(self) -> dict:
        return {
            "rule": self.name,
            "window_size": self.window_size,
            "entropy_threshold": self.entropy_threshold,
            "entropy_top_k": self.entropy_top_k,
        }
