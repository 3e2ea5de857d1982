"""Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025,
arXiv 2403.10444, Algorithm 2); the maths is in docs/rules-block-and-fly.md.

Token-wise verification stops at the first rejected draft. Block verification looks at the whole block:
it keeps a clipped running likelihood ratio of the drafted prefix,

    ρ_0 = 1,   ρ_i = min(1, ρ_{i-1} · p_{i-1}(x_i) / q_{i-1}(x_i))          (i = 1..L),

and, with one independent uniform η_i per position, accepts the *longest* prefix i whose test
η_i ≤ h_i passes (not the first failure), where for i < L

    m_i = Σ_x max(0, ρ_i · p_i(x) − q_i(x)),   h_i = m_i / (m_i + 1 − ρ_i)   (h_i = 1 when 0/0),

and h_L = ρ_L. After accepting τ < L drafts it emits one token from normalise(max(0, ρ_τ · p_τ − q_τ)),
after τ = L the bonus token from p_L. Indices are this project's: p_i / q_i (0-based) are the verifier /
drafter distributions at the position predicting draft i+1 (``p[:, i]``, ``q[:, i]``), p_L the bonus slot.
Lossless for every drafter (q one-hot for deterministic ones) and never fewer expected accepted drafts
than token-wise verification. At temperature 0 it is exactly the token-wise greedy rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.decoding.rules import RESIDUAL_EPS, VerificationRule
from specbench.decoding.verification import Verdict, verify_tokenwise


@dataclass
class BlockTerms:
    """Per-row quantities of Algorithm 2 for one round."""

    prefix_ratio: torch.Tensor  # (B, G+1) ρ_0..ρ_G; entries past a row's length are meaningless
    threshold: torch.Tensor  # (B, G) column i-1 holds h_i; 0 past the row's length (never accepted)


def block_terms(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, draft_lens: torch.Tensor
) -> BlockTerms:
    """ρ_i and h_i of every row (shapes as in :func:`specbench.decoding.verification.verify_round`)."""
    batch, gamma = drafts.shape
    p_x = p[:, :gamma].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    q_x = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    # Log space keeps long blocks of small ratios exact down to 0 and avoids 0·inf. A drafted token with
    # q = 0 cannot come from q; give it ratio 1 as rules.py gives it acceptance 1.
    log_ratio = torch.where(q_x > 0, torch.log(p_x) - torch.log(torch.where(q_x > 0, q_x, 1.0)), 0.0)
    log_rho = torch.zeros(batch, gamma + 1, dtype=p.dtype, device=p.device)
    for i in range(gamma):
        log_rho[:, i + 1] = torch.clamp(log_rho[:, i] + log_ratio[:, i], max=0.0)
    rho = torch.exp(log_rho)

    positions = torch.arange(1, gamma + 1, device=p.device).unsqueeze(0)  # i = 1..G
    lens = draft_lens.to(p.device).unsqueeze(1)
    # m_i for i = 1..G-1 uses p_i, q_i (the distributions of the next draft); column G-1 is unused.
    mass = torch.zeros(batch, gamma, dtype=p.dtype, device=p.device)
    if gamma > 1:
        mass[:, :-1] = torch.clamp(rho[:, 1:gamma, None] * p[:, 1:gamma] - q[:, 1:gamma], min=0.0).sum(-1)
    rho_i = rho[:, 1:]
    denominator = mass + 1.0 - rho_i
    safe = denominator > 0
    inner = torch.where(safe, mass / torch.where(safe, denominator, 1.0), torch.ones_like(mass))
    threshold = torch.where(positions < lens, inner, rho_i)
    threshold = torch.where(positions <= lens, threshold, torch.zeros_like(threshold))
    return BlockTerms(prefix_ratio=rho, threshold=threshold)


def block_residual(p_stop: torch.Tensor, q_stop: torch.Tensor, rho_stop: torch.Tensor) -> torch.Tensor:
    """normalise(max(0, ρ_τ·p_τ − q_τ)) per row; (R, V), (R, V), (R,) -> (R, V).

    Zero mass happens only where Algorithm 2 never stops (ρ_τ = 1, p_τ = q_τ) up to rounding; p_τ then.
    """
    mass = torch.clamp(rho_stop.unsqueeze(-1) * p_stop - q_stop, min=0.0)
    total = mass.sum(-1, keepdim=True)
    usable = total > RESIDUAL_EPS
    return torch.where(usable, mass / torch.where(usable, total, 1.0), p_stop)


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token whose CDF interval holds u: (R, V), (R,) in [0, 1) -> (R,). Never a zero-probability
    token."""
    cdf = probs.cumsum(-1)
    target = (uniforms.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    ids = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return torch.clamp(ids, max=probs.shape[-1] - 1)


def block_verdict(
    p: torch.Tensor,
    q: torch.Tensor,
    drafts: torch.Tensor,
    draft_lens: torch.Tensor,
    eta: torch.Tensor,
    token_uniform: torch.Tensor,
) -> Verdict:
    """Algorithm 2 with its randomness given: eta (B, G) the per-position uniforms, token_uniform (B,) the
    uniform of the emitted token (inverse-CDF sampling). Deterministic, so a reference can replay it."""
    batch, gamma = drafts.shape
    terms = block_terms(p, q, drafts, draft_lens)
    lens = draft_lens.to(p.device)
    rows = torch.arange(batch, device=p.device)
    positions = torch.arange(1, gamma + 1, device=p.device).unsqueeze(0)
    passed = eta.to(p.dtype) < terms.threshold  # strict: a uniform of exactly 0 never passes h = 0
    accepted = (passed.long() * positions).amax(dim=1) if gamma else torch.zeros(batch, dtype=torch.long)
    accepted = accepted.to(p.device)

    stop = torch.clamp(accepted, max=max(gamma - 1, 0))
    rejected = accepted < lens
    distribution = p[rows, lens].clone()
    if bool(rejected.any()):
        residual = block_residual(p[rows, stop], q[rows, stop], terms.prefix_ratio[rows, accepted])
        distribution[rejected] = residual[rejected]
    return Verdict(accepted=accepted, next_token=inverse_cdf_sample(distribution, token_uniform))


class BlockRule(VerificationRule):
    """Block verification (lossless). Accepts model drafters (q given) and deterministic ones (q one-hot).

    Its token-wise ``acceptance`` / ``residual`` (inherited: exact SD) describe a one-draft round, where
    block and token-wise verification coincide; multi-draft rounds go through :meth:`verify_block`.
    """

    name = "block"
    accepts_deterministic = True  # exact with q one-hot too (ties token-wise in expected accepted length)

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
        if greedy:
            # A deterministic verifier leaves one valid scheme: the longest prefix equal to its argmaxes.
            return verify_tokenwise(self, p, q, drafts, draft_lens, True, generator)
        batch, gamma = drafts.shape
        eta = torch.rand(batch, gamma, generator=generator, dtype=p.dtype, device=p.device)
        token_uniform = torch.rand(batch, generator=generator, dtype=p.dtype, device=p.device)
        return block_verdict(p, q, drafts, draft_lens, eta, token_uniform)
