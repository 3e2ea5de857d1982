"""Verification rules as pure tensor functions (methods.md §2).

A rule maps the verifier distribution ``p`` and drafter distribution ``q`` at one drafted position
(shape ``(..., V)``) to
  * ``acceptance(p, q)``: probability of accepting each possible drafted token, ``(..., V)``;
  * ``residual(p, q)``: the distribution to draw the correction token from after a rejection;
  * greedy counterparts ``greedy_accept`` / ``greedy_correction`` for temperature 0.
Most rules are a replacement target ``π = target(p, q)`` with the standard acceptance
``min(1, π/q)`` and residual ``normalise(max(0, π − q))``. The bonus token after a fully accepted
round is always drawn from the verifier, so it is not part of a rule.

``weights`` is an optional per-position draft weight (shape ``(...)``) used by ensemble rules; the
learned DIVERSED rule supplies it from its head.
"""

from __future__ import annotations

import math

import torch

from specbench.method_params import Param

RESIDUAL_EPS = 1e-12


class VerificationRule:
    """Exact speculative sampling (π = p); the base class of every rule."""

    name = "sd"
    # The ``method.*`` parameters the constructor takes: type, check, table label (specbench/method_params.py;
    # read from this source without importing it, so they must be literals).
    params: tuple[Param, ...] = ()
    param_checks: tuple[str, ...] = ()  # checks across parameters (specbench.method_params.CROSS_CHECKS)
    requires_hidden_states = False
    # Whether the rule is defined for a deterministic proposal (q one-hot on the draft): rules whose math
    # mixes in or thresholds the drafter's distribution need a real q and refuse such drafters.
    accepts_deterministic = True

    @property
    def lossless(self) -> bool:
        return True

    def target(self, p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        return p

    def acceptance(
        self, p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _ratio_acceptance(self.target(p, q, weights), q)

    def residual(self, p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        pi = self.target(p, q, weights)
        return _normalised_or(torch.clamp(pi - q, min=0.0), pi)

    def greedy_accept(
        self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        return drafts == self.target(p, q, weights).argmax(dim=-1)

    def greedy_correction(
        self, p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.target(p, q, weights).argmax(dim=-1)

    def position_weights(
        self, drafter_hidden: torch.Tensor, verifier_hidden: torch.Tensor
    ) -> torch.Tensor | None:
        """Per-position draft weights from hidden states; only learned rules implement it."""
        return None

    def describe(self) -> dict:
        return {"rule": self.name}


def _ratio_acceptance(pi: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # Tokens with q = 0 are never drafted; give them acceptance 1 so no 0/0 appears.
    safe_q = torch.where(q > 0, q, torch.ones_like(q))
    return torch.where(q > 0, torch.clamp(pi / safe_q, max=1.0), torch.ones_like(q))


def _normalised_or(mass: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = mass.sum(dim=-1, keepdim=True)
    use_mass = total > RESIDUAL_EPS
    return torch.where(use_mass, mass / torch.where(use_mass, total, torch.ones_like(total)), fallback)


class LenientRule(VerificationRule):
    """Lossy / lenient verification with lenience l ∈ (0, 1] (Leviathan et al. 2023, App. A.5).

    a(x) = min(1, p(x) / (l q(x))), residual ∝ max(0, p − l q); greedy: accept iff p(x) ≥ l·max p.
    """

    name = "lossy"
    params = (Param("lenience", float, gt=0.0, le=1.0, label="lenience"),)

    def __init__(self, lenience: float = 0.5):
        if not 0.0 < lenience <= 1.0:
            raise ValueError(f"method.lenience must be in (0, 1], got {lenience}")
        self.lenience = float(lenience)

    @property
    def lossless(self) -> bool:
        return self.lenience == 1.0

    def acceptance(self, p, q, weights=None):
        return _ratio_acceptance(p / self.lenience, q)

    def residual(self, p, q, weights=None):
        return _normalised_or(torch.clamp(p - self.lenience * q, min=0.0), p)

    def greedy_accept(self, p, q, drafts, weights=None):
        p_draft = p.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
        return p_draft >= self.lenience * p.max(dim=-1).values

    def greedy_correction(self, p, q, weights=None):
        return p.argmax(dim=-1)

    def describe(self):
        return {"rule": self.name, "lenience": self.lenience}


class EnsembleRule(VerificationRule):
    """Static ensemble: π = (1−w)·p + w·q (linear pool) or π ∝ q^w · p^(1−w) (log-linear pool).

    ``draft_weight`` w weights the drafter: 0 is exact SD, 1 is pure drafter (methods.md §2.1).
    """

    name = "static_ensemble"
    POOLS = ("linear", "log_linear")
    params = (
        Param("draft_weight", float, ge=0.0, le=1.0, label="w"),
        Param("pool", str, choices=POOLS, label="pool", quiet="linear"),
    )
    accepts_deterministic = False

    def __init__(self, draft_weight: float = 0.3, pool: str = "linear"):
        if not 0.0 <= draft_weight <= 1.0:
            raise ValueError(f"method.draft_weight must be in [0, 1], got {draft_weight}")
        if pool not in self.POOLS:
            raise ValueError(f"method.pool must be one of {list(self.POOLS)}, got {pool!r}")
        self.draft_weight = float(draft_weight)
        self.pool = pool

    @property
    def lossless(self) -> bool:
        return self.draft_weight == 0.0

    def target(self, p, q, weights=None):
        w = self.draft_weight if weights is None else weights.unsqueeze(-1).to(p.dtype)
        return pool_distributions(p, q, w, self.pool)

    def describe(self):
        return {"rule": self.name, "draft_weight": self.draft_weight, "pool": self.pool}


def pool_distributions(p: torch.Tensor, q: torch.Tensor, w, pool: str = "linear") -> torch.Tensor:
    """Mix verifier ``p`` and drafter ``q`` with draft weight ``w`` (float or tensor broadcastable to p)."""
    w = torch.as_tensor(w, dtype=p.dtype, device=p.device)
    if pool == "linear":
        return (1.0 - w) * p + w * q
    # Log-linear: exp(w log q + (1-w) log p), with 0·log 0 taken as 0 so w = 0 gives p exactly.
    log_p = torch.where(p > 0, p.log(), torch.full_like(p, -math.inf))
    log_q = torch.where(q > 0, q.log(), torch.full_like(q, -math.inf))
    term_q = torch.where(w > 0, w * log_q, torch.zeros_like(log_q))
    term_p = torch.where(w < 1, (1.0 - w) * log_p, torch.zeros_like(log_p))
    logits = term_q + term_p
    # Disjoint supports (common under top-k/top-p) leave no finite logit: defer to the verifier.
    has_support = torch.isfinite(logits).any(dim=-1, keepdim=True)
    pooled = torch.softmax(torch.where(has_support, logits, torch.zeros_like(logits)), dim=-1)
    pooled = torch.where(has_support, pooled, p)
    return torch.where(w == 0, p, pooled)


class CascadeRule(VerificationRule):
    """Speculative cascades (Narasimhan et al., ICLR 2025) with deferral rules chow, diff, opt, token."""

    name = "cascade"
    DEFERRALS = ("chow", "diff", "opt", "token")
    params = (
        Param("deferral", str, choices=DEFERRALS, label="deferral"),
        Param("alpha", float, ge=0.0, label="alpha"),
    )
    param_checks = ("token_deferral_alpha",)  # alpha <= 1 for the token deferral
    accepts_deterministic = False

    def __init__(self, deferral: str = "chow", alpha: float = 0.1):
        if deferral not in self.DEFERRALS:
            raise ValueError(f"method.deferral must be one of {list(self.DEFERRALS)}, got {deferral!r}")
        if alpha < 0:
            raise ValueError(f"method.alpha must be >= 0, got {alpha}")
        if deferral == "token" and alpha > 1:
            raise ValueError(f"method.alpha must be in [0, 1] for the token deferral rule, got {alpha}")
        self.deferral = deferral
        self.alpha = float(alpha)

    @property
    def lossless(self) -> bool:
        return False

    def defer(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Boolean (...) : True where the position defers to the verifier."""
        max_q = q.max(dim=-1).values
        max_p = p.max(dim=-1).values
        if self.deferral == "chow":
            return max_q < 1.0 - self.alpha
        if self.deferral == "diff":
            return max_q < max_p - self.alpha
        tv = 0.5 * (p - q).abs().sum(dim=-1)
        return max_q < max_p - self.alpha * tv

    def target(self, p, q, weights=None):
        if self.deferral == "token":
            allowed = p >= (1.0 - self.alpha) * p.max(dim=-1, keepdim=True).values
            q_allowed = torch.where(allowed, q, torch.zeros_like(q))
            return q_allowed + (1.0 - q_allowed.sum(dim=-1, keepdim=True)) * p
        return torch.where(self.defer(p, q).unsqueeze(-1), p, q)

    def describe(self):
        return {"rule": self.name, "deferral": self.deferral, "alpha": self.alpha}


class TypicalRule(VerificationRule):
    """Typical acceptance (Medusa): accept x iff p(x) > min(ε, δ·exp(−H(p))); residual p."""

    name = "typical"
    params = (
        Param("epsilon", float, gt=0.0, le=1.0, label="epsilon"),
        Param("delta", float, gt=0.0, label="delta"),
    )

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3):
        if not 0.0 < epsilon <= 1.0:
            raise ValueError(f"method.epsilon must be in (0, 1], got {epsilon}")
        if delta <= 0:
            raise ValueError(f"method.delta must be > 0, got {delta}")
        self.epsilon = float(epsilon)
        self.delta = float(delta)

    @property
    def lossless(self) -> bool:
        return False

    def threshold(self, p: torch.Tensor) -> torch.Tensor:
        entropy = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(dim=-1, keepdim=True)
        return torch.clamp(self.delta * torch.exp(-entropy), max=self.epsilon)

    def acceptance(self, p, q, weights=None):
        return (p > self.threshold(p)).to(p.dtype)

    def residual(self, p, q, weights=None):
        return p

    def greedy_accept(self, p, q, drafts, weights=None):
        return self.acceptance(p, q).gather(-1, drafts.unsqueeze(-1)).squeeze(-1) > 0

    def greedy_correction(self, p, q, weights=None):
        return p.argmax(dim=-1)

    def describe(self):
        return {"rule": self.name, "epsilon": self.epsilon, "delta": self.delta}


def one_step_distribution(
    rule: VerificationRule, p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Closed-form output distribution of one drafted position: P = q·a + (1 − Σ q·a)·r."""
    a = rule.acceptance(p, q, weights)
    accepted = q * a
    return accepted + (1.0 - accepted.sum(dim=-1, keepdim=True)) * rule.residual(p, q, weights)
