"""One verification round over a batch: accepted prefix length and the next token (methods.md §2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.decoding.rules import VerificationRule
from specbench.decoding.warping import sample


@dataclass
class Verdict:
    accepted: torch.Tensor  # (B,) number of accepted drafts n ≤ draft_lens
    next_token: torch.Tensor  # (B,) correction token (n < len) or bonus token (n == len)


def one_hot_proposal(
    drafts: torch.Tensor, vocab_size: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """q of a deterministic proposal: (B, G, V) one-hot on each drafted token."""
    q = torch.zeros(*drafts.shape, vocab_size, dtype=dtype, device=drafts.device)
    return q.scatter_(-1, drafts.unsqueeze(-1), 1.0)


def verify_round(
    rule: VerificationRule,
    p: torch.Tensor,
    q: torch.Tensor | None,
    drafts: torch.Tensor,
    draft_lens: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None = None,
    weights: torch.Tensor | None = None,
) -> Verdict:
    """Verify drafts of one round.

    p: (B, G+1, V) verifier distributions (position i predicts draft i; index G is the bonus slot),
    q: (B, G, V) the exact distributions the drafter drew from, or None for a deterministic proposal
    (q is then one-hot on each draft: for ``sd`` the acceptance is p(x) and the residual p with x removed),
    drafts: (B, G), draft_lens: (B,) with entries ≤ G (positions past a row's length are ignored),
    weights: optional (B, G). A rule that verifies whole blocks provides ``verify_block`` with this signature.
    """
    if q is None:
        q = one_hot_proposal(drafts, p.shape[-1], p.dtype)
    block = getattr(rule, "verify_block", None)
    if block is not None:
        return block(p, q, drafts, draft_lens, greedy, generator, weights)
    return verify_tokenwise(rule, p, q, drafts, draft_lens, greedy, generator, weights)


def verify_tokenwise(
    rule: VerificationRule,
    p: torch.Tensor,
    q: torch.Tensor,
    drafts: torch.Tensor,
    draft_lens: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None = None,
    weights: torch.Tensor | None = None,
) -> Verdict:
    """Token-wise verification (methods.md §2): accept the longest prefix with u_i < a_i(x_i), then a
    correction from the residual or the bonus token from p."""
    batch, gamma = drafts.shape
    rows = torch.arange(batch, device=p.device)
    positions = torch.arange(gamma, device=p.device)
    in_draft = positions.unsqueeze(0) < draft_lens.unsqueeze(1)
    p_drafted = p[:, :gamma]

    if gamma == 0:
        ok = torch.zeros(batch, 0, dtype=torch.bool, device=p.device)
    elif greedy:
        ok = rule.greedy_accept(p_drafted, q, drafts, weights)
    else:
        a = rule.acceptance(p_drafted, q, weights).gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        u = torch.rand(a.shape, generator=generator, device=a.device, dtype=a.dtype)
        ok = u < a
    ok = ok & in_draft
    accepted = ok.long().cumprod(dim=1).sum(dim=1) if gamma else torch.zeros(batch, dtype=torch.long)
    accepted = accepted.to(p.device)

    rejected = accepted < draft_lens
    stop = torch.clamp(accepted, max=max(gamma - 1, 0))
    bonus_p = p[rows, draft_lens]
    if greedy:
        next_token = bonus_p.argmax(dim=-1)
    else:
        next_token = sample(bonus_p, generator)
    if bool(rejected.any()):
        p_stop, q_stop = p[rows, stop][rejected], q[rows, stop][rejected]
        w_stop = weights[rows, stop][rejected] if weights is not None else None
        if greedy:
            correction = rule.greedy_correction(p_stop, q_stop, w_stop)
        else:
            correction = sample(rule.residual(p_stop, q_stop, w_stop), generator)
        next_token = next_token.clone()
        next_token[rejected] = correction
    return Verdict(accepted=accepted, next_token=next_token)
