"""``schedule=cost_aware``: each row's draft length per round from a measured cost profile.

For a row, drafting ``k`` tokens is expected to emit ``E(k) = 1 + Σ_{i≤k} Π_{j≤i} α_j`` tokens at a cost of
``k·c + v(k + 1)`` verifier steps (:class:`~specbench.decoding.cost.CostProfile`); the schedule picks the
``k`` (0 included: drafting that cannot pay is not done) with the most expected tokens per unit of time.

``α_j`` is the probability that draft ``j`` is accepted given that drafts ``1..j−1`` were, estimated online
from the run's own rounds: per position for model drafters, per position and per match-length bucket for
lookup drafters (whose proposals say how long a context match they continue). Each cell has a prior worth
two trials, centred on 1/2 for position 1 and on the estimate of position ``j − 1`` for position ``j``. A
flat 1/2 everywhere kept positions the schedule had never verified at 1/2, so once it had trimmed a
bucket's chains to ``k`` it never tried ``k + 1``, however often the first ``k`` were all accepted.
Model drafters get their length as a cap before drafting; lookup drafters (``Drafter.trimmed_by_schedule``)
propose what they find and the schedule trims. A trim weighs ``v(k + 1)`` only: the drafts it cuts were
already made, so their cost is spent whatever it keeps. The fallback drafter (a lookup with a model
drafter behind it) is trimmed too: its lookup rows by match length, its model rows in bucket 0. The
schedule only chooses lengths: lossless rules stay lossless.

The cost of a batched verification is that of its longest row; each row's choice uses the profile's
``v(n)`` measured at the run's batch size, which treats rows as independent (an approximation at batch > 1).

With ``learn_costs`` (the default) the profile is only the prior of :class:`LearnedCosts`: the round
costs are re-estimated from the run's own round times, so a profile timed in a busy minute stops
steering the whole run. ``learn_costs=False`` prices every round by the profile alone.
"""

from __future__ import annotations

import torch

from specbench.decoding.cost import CostProfile
from specbench.decoding.learned_cost import LearnedCosts
from specbench.decoding.protocol import Proposal

# Match-length buckets: 0 (no match / model drafter), 1, 2, 3, 4-5, 6-8, 9-15, 16+.
MATCH_BUCKET_EDGES = (1, 2, 3, 4, 6, 9, 16)
PRIOR_MEAN, PRIOR_TRIALS = 0.5, 2.0  # the prior of position 1; position j's is centred on j - 1's estimate


def match_bucket(length: int) -> int:
    return sum(length >= edge for edge in MATCH_BUCKET_EDGES)


class CostAwareSchedule:
    """Stateful (the acceptance estimates learn over the run); one per engine."""

    name = "cost_aware"

    def __init__(self, profile: CostProfile, max_gamma: int = 16, learn_costs: bool = True):
        if max_gamma < 1:
            raise ValueError(f"schedule.max_gamma must be >= 1, got {max_gamma}")
        self.profile = profile
        self.max_gamma = int(max_gamma)
        buckets = len(MATCH_BUCKET_EDGES) + 1
        self.accepts = torch.zeros(buckets, self.max_gamma, dtype=torch.float64)
        self.trials = torch.zeros(buckets, self.max_gamma, dtype=torch.float64)
        self.costs = LearnedCosts(profile, self.max_gamma + 1) if learn_costs else None
        self._set_costs([profile.v(k + 1) for k in range(self.max_gamma + 1)], profile.c)
        self._caps_before_drafting = True

    def _set_costs(self, verify: list[float], c: float) -> None:
        """``verify[k]``: the cost of verifying ``k`` drafts (``v(k + 1)``); ``c``: a drafter forward's."""
        self._verify_costs = torch.tensor(verify, dtype=torch.float64)
        self._costs = self._verify_costs + c * torch.arange(self.max_gamma + 1, dtype=torch.float64)

    @property
    def learns_costs(self) -> bool:
        return self.costs is not None

    # -- the DraftSchedule interface the engine calls ------------------------------------------------------

    def initial_gamma(self) -> int:
        return self.max_gamma

    def next_gamma(self, current: int, drafted: int, accepted: int) -> int:
        return self.max_gamma

    def continues(self, drafted_token_prob: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(drafted_token_prob, dtype=torch.bool)

    def caps(self, gammas: torch.Tensor) -> torch.Tensor:
        """Model drafters draft the best length for bucket 0; lookup drafters get the maximum and are
        trimmed."""
        best = self.best_length(0, self.max_gamma)
        return torch.full_like(gammas, best if self._caps_before_drafting else self.max_gamma)

    def bind(self, drafter) -> None:
        """Lookup drafters (``trimmed_by_schedule``) propose freely and are trimmed; model drafters are
        capped."""
        self._caps_before_drafting = not getattr(drafter, "trimmed_by_schedule", False)

    def trim(self, proposal: Proposal) -> Proposal:
        if proposal.match_lengths is None or proposal.tokens.shape[1] == 0:
            return proposal
        lengths = proposal.lengths.tolist()
        matches = proposal.match_lengths.tolist()
        chosen = [self.best_length(match_bucket(m), n, drafted=True) for m, n in zip(matches, lengths)]
        return proposal.truncated(torch.tensor(chosen, dtype=torch.long, device=proposal.lengths.device))

    def observe(self, proposal: Proposal, accepted: torch.Tensor) -> None:
        matches = proposal.match_lengths.tolist() if proposal.match_lengths is not None else None
        for row, (drafted, kept) in enumerate(zip(proposal.lengths.tolist(), accepted.tolist())):
            bucket = match_bucket(matches[row]) if matches is not None else 0
            # Positions 1..kept were accepted; position kept+1 (if drafted) was tried and rejected.
            tried = min(kept + 1, drafted)
            self.trials[bucket, :tried] += 1
            self.accepts[bucket, :kept] += 1

    def observe_round(self, columns: int, round_seconds: float, forwards: int, draft_seconds: float) -> None:
        self.costs.observe(columns, 1000.0 * round_seconds, forwards, 1000.0 * draft_seconds)
        self._set_costs(*self.costs.relative())

    # -- the choice ----------------------------------------------------------------------------------------

    def acceptance(self, bucket: int) -> torch.Tensor:
        """(max_gamma,) estimated α_j for j = 1..max_gamma."""
        alpha = torch.empty(self.max_gamma, dtype=torch.float64)
        previous = PRIOR_MEAN
        for j, (accepts, trials) in enumerate(
            zip(self.accepts[bucket].tolist(), self.trials[bucket].tolist())
        ):
            previous = alpha[j] = (accepts + PRIOR_TRIALS * previous) / (trials + PRIOR_TRIALS)
        return alpha

    def expected_rate(self, bucket: int, limit: int, drafted: bool = False) -> torch.Tensor:
        """(limit + 1,) expected tokens per unit time for k = 0..limit drafts (``drafted``: the drafts exist
        already, so only their verification costs)."""
        alive = torch.cumprod(self.acceptance(bucket)[:limit], dim=0)
        emitted = torch.cat([torch.ones(1, dtype=torch.float64), 1.0 + torch.cumsum(alive, dim=0)])
        return emitted / (self._verify_costs if drafted else self._costs)[: limit + 1]

    def best_length(self, bucket: int, limit: int, drafted: bool = False) -> int:
        limit = max(0, min(int(limit), self.max_gamma))
        return int(self.expected_rate(bucket, limit, drafted).argmax())

    def describe(self) -> dict:
        return {"schedule": self.name, "max_gamma": self.max_gamma, "profile_c": self.profile.c,
                "learn_costs": self.learns_costs}  # fmt: skip
