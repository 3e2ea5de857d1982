"""Draft-length schedules, one state per sequence (methods.md §3.1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.values import SCHEDULE_DEFAULTS, check_schedule


@dataclass(frozen=True)
class DraftSchedule:
    """``constant``: γ per round. ``heuristic``: γ += 2 after a fully accepted round, else γ = max(1, γ − 1).
    ``dynamic``: up to ``max_gamma`` drafts, stop after a draft whose drafter probability is below
    ``confidence_threshold``."""

    name: str = SCHEDULE_DEFAULTS["name"]
    gamma: int = SCHEDULE_DEFAULTS["gamma"]
    max_gamma: int = SCHEDULE_DEFAULTS["max_gamma"]
    confidence_threshold: float = SCHEDULE_DEFAULTS["confidence_threshold"]
    learn_costs: bool = SCHEDULE_DEFAULTS["learn_costs"]  # cost_aware only (CostAwareSchedule)

    def __post_init__(self):
        check_schedule(
            self.name, self.gamma, self.max_gamma, self.confidence_threshold, learn_costs=self.learn_costs
        )

    def initial_gamma(self) -> int:
        return self.max_gamma if self.name in ("dynamic", "cost_aware") else self.gamma

    def next_gamma(self, current: int, drafted: int, accepted: int) -> int:
        """Draft budget of the next round for one sequence."""
        if self.name != "heuristic":
            return current
        if drafted > 0 and accepted == drafted:
            return min(current + 2, self.max_gamma)
        return max(1, current - 1)

    def bind(self, drafter) -> None:
        """Called once by the engine with its drafter (stateless schedules ignore it)."""

    def caps(self, gammas: torch.Tensor) -> torch.Tensor:
        """(B,) the most tokens each row may draft this round (before the token budget)."""
        return gammas

    def trim(self, proposal):
        """The proposal to verify (a schedule may shorten drafts it expects not to pay off)."""
        return proposal

    def observe(self, proposal, accepted: torch.Tensor) -> None:
        """What a round's verification accepted (``accepted[b]`` of ``proposal.lengths[b]``)."""

    learns_costs = False  # cost_aware with schedule.learn_costs: the engine reports each round's times

    def observe_round(self, columns: int, round_seconds: float, forwards: int, draft_seconds: float) -> None:
        """A round's times (only called when ``learns_costs``): ``columns`` verified in ``round_seconds``
        after drafting; ``forwards`` drafter forwards in ``draft_seconds``."""

    def continues(self, drafted_token_prob: torch.Tensor) -> torch.Tensor:
        """(B,) whether each row may draft another token after one the drafter gave this probability
        (``dynamic`` stops below ``confidence_threshold``; other schedules only cap the length)."""
        if self.name == "dynamic":
            return drafted_token_prob >= self.confidence_threshold
        return torch.ones_like(drafted_token_prob, dtype=torch.bool)
