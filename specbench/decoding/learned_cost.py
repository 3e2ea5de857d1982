"""Round costs learned from the run's own timings (``schedule.learn_costs``, cost-aware drafting).

A :class:`~specbench.decoding.cost.CostProfile` is timed once, when the run starts. On a shared machine
that minute's load can bend its shape: three profiles of the same pair on the same machine read v(2) =
1.27, 1.00 and 1.19 (results/eagle3/20261202T163133-b69535a14d.json), and a schedule that trusted the high
readings drafted too little. :class:`LearnedCosts` uses the profile only as a prior and learns from every
round:

- ``T(n)``, the time of a round after its drafts exist (verification of ``n`` columns, the rule, and the
  bookkeeping and drafter commit that follow), per ``n``;
- the drafter's time per forward (one drafted token per row).

Estimates are geometric means (one descheduled round should not move a cost tenfold), weighted towards
recent rounds (each round multiplies older weights by ``decay``) so they follow a load that changes.
Each ``n``'s estimate is shrunk towards its profile time times the current load scale (how much slower
than the profile the observed rounds run, whichever ``n`` they had), with the weight of ``prior_rounds``
rounds; an ``n`` the schedule stops choosing thus drifts back to the profile's shape at today's load
instead of keeping a stale reading. The result is made non-decreasing in ``n``.
"""

from __future__ import annotations

import math

import torch

from specbench.decoding.cost import CostProfile, monotone

DECAY = 0.98  # per round: the last ~50 rounds carry most of the weight
PRIOR_ROUNDS = 3.0  # the profile is worth this many rounds of each n


class LearnedCosts:
    """Costs in units of one verifier step over one token: ``v(n)`` for ``n = 1..max_n`` and ``c``."""

    def __init__(
        self, profile: CostProfile, max_n: int, decay: float = DECAY, prior_rounds: float = PRIOR_ROUNDS
    ):
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if prior_rounds <= 0:
            raise ValueError(f"prior_rounds must be > 0, got {prior_rounds}")
        self.max_n = int(max_n)
        self.decay, self.prior_rounds = float(decay), float(prior_rounds)
        unit = profile.verify_ms[0]
        self._log_prior = torch.tensor([math.log(profile.v(n) * unit) for n in range(1, self.max_n + 1)],
                                       dtype=torch.float64)  # fmt: skip
        self._log_sums = torch.zeros(self.max_n, dtype=torch.float64)
        self._weights = torch.zeros(self.max_n, dtype=torch.float64)
        self._scale_sum = self._scale_weight = 0.0  # decayed Σ log(observed / profile) and its weight
        self._draft_ms_prior = profile.draft_ms
        self._draft_ms_sum = self._forwards_sum = 0.0
        self.rounds = 0

    def observe(self, columns: int, round_ms: float, forwards: int = 0, draft_ms: float = 0.0) -> None:
        """One round: ``columns`` verified (the last token + the drafts or tree nodes) in ``round_ms`` after
        drafting, and ``forwards`` drafter forwards in ``draft_ms`` (a model-free proposal has none)."""
        if round_ms <= 0 or not 1 <= columns:
            return
        self.rounds += 1
        self._log_sums *= self.decay
        self._weights *= self.decay
        self._scale_sum *= self.decay
        self._scale_weight *= self.decay
        self._draft_ms_sum *= self.decay
        self._forwards_sum *= self.decay
        log_ms = math.log(round_ms)
        n = min(int(columns), self.max_n)
        # past max_n the profile extrapolates; such rounds still tell the load scale
        if columns <= self.max_n:
            self._log_sums[n - 1] += log_ms
            self._weights[n - 1] += 1.0
        self._scale_sum += log_ms - self._log_prior_at(columns)
        self._scale_weight += 1.0
        if forwards > 0:
            self._draft_ms_sum += draft_ms
            self._forwards_sum += forwards

    def _log_prior_at(self, columns: int) -> float:
        if columns <= self.max_n:
            return float(self._log_prior[columns - 1])
        return float(self._log_prior[-1]) + math.log(columns / self.max_n)

    @property
    def load_scale(self) -> float:
        """How many times slower than the profile the observed rounds ran (1 before any)."""
        return math.exp(self._scale_sum / self._scale_weight) if self._scale_weight > 0 else 1.0

    def verify_ms(self) -> list[float]:
        """Estimated ms of a round after drafting, for ``n = 1..max_n`` verified columns (non-decreasing)."""
        log_prior = self._log_prior + math.log(self.load_scale)
        estimate = (self._log_sums + self.prior_rounds * log_prior) / (self._weights + self.prior_rounds)
        return monotone(torch.exp(estimate).tolist())

    def draft_ms(self) -> float:
        """Estimated drafter ms per forward (shrunk to the profile's at the load scale, ``prior_rounds``
        forwards' worth)."""
        prior = self.prior_rounds
        return (self._draft_ms_sum + prior * self._draft_ms_prior * self.load_scale) / (
            self._forwards_sum + prior
        )

    def relative(self) -> tuple[list[float], float]:
        """(``v(n)`` for ``n = 1..max_n``, ``c``): the estimates relative to ``T(1)``."""
        times = self.verify_ms()
        return [t / times[0] for t in times], self.draft_ms() / times[0]
