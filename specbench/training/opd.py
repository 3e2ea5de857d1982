"""On-policy distillation of drafters (Draft-OPD, arXiv 2605.29343): the rollout both objectives share.

A task=synth row is the target's own continuation ``y`` of its prompt. A *target-assisted rollout* decodes
it as speculative decoding would: each round starts from ``c`` committed tokens of ``y``, the drafter
proposes ``γ`` tokens from its own state, and verification accepts the leading drafts that equal ``y``'s
next tokens (greedy verification, exactly, when ``y`` is the target's greedy answer); the round commits its
``a`` accepted drafts and the target's own token after them, so the next round starts at ``c + a + 1``:
*drafting replayed from the position verification rejected*. The drafter is trained at the states this
walk visits (each round's start) on the drafts it is judged on there: the ``a`` accepted ones and the first
rejected one (``min(a + 1, γ)`` drafts), against the target's distribution at those prefixes, which are
the drafter's own accepted proposals.

Here the drafter's proposal from every candidate round start is computed in parallel (one drafter pass, as
in SFT) and :func:`walk_rounds` picks the starts the rollout visits; ``leading_accepts`` gives each start's
accepted count. The objectives (``eagle3_opd.py``, ``dflash_opd.py``) turn the walk into loss masks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

OBJECTIVES = ("sft", "opd")


def objective_of(cfg: object) -> str:
    """``cfg.method.objective`` (``sft`` when the config has no method node or leaves it unset)."""
    from specbench.training.trainer import train_option

    objective = str(train_option(getattr(cfg, "method", None), "objective", "sft"))
    if objective not in OBJECTIVES:
        raise ValueError(f"method.objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    return objective


def opd_gamma(cfg: object, default: int) -> int:
    """The rollout's drafts per round: ``method.opd_gamma`` (null: ``default``, the drafter's own γ)."""
    from specbench.training.trainer import train_option

    gamma = int(train_option(getattr(cfg, "method", None), "opd_gamma", default))
    if gamma < 1:
        raise ValueError(f"method.opd_gamma must be an integer >= 1 or null, got {gamma}")
    return gamma


def objective_settings(cfg: object, init_head: str | None, default_gamma: int, method: str) -> dict[str, Any]:
    """``{objective, opd_gamma}`` of a ``method`` (eagle3 | dflash) training, for its checkpoint metadata;
    on-policy distillation starts from an SFT drafter (``train.init_head``), as the paper does."""
    objective = objective_of(cfg)
    if objective == "opd" and not init_head:
        raise ValueError(
            f"method={method}_opd distils on-policy from an SFT-trained {method} drafter: set "
            f"train.init_head=<the trained.pt of a task=train method={method} run>"
        )
    gamma = opd_gamma(cfg, default_gamma) if objective == "opd" else None
    return {"objective": objective, "opd_gamma": gamma}


def objective_module(module_class: type, settings: dict[str, Any], args: tuple) -> Any:
    """``module_class(*args)`` (with the rollout's γ for ``opd``), refusing a class of another objective
    than ``settings`` (:func:`objective_settings`) names."""
    objective = settings["objective"]
    if module_class.objective != objective:
        raise ValueError(
            f"method.objective={objective} trains a {objective} module, not {module_class.__name__}: "
            "build it with specbench.training.objectives.build_training"
        )
    return module_class(*args, gamma=settings["opd_gamma"]) if objective == "opd" else module_class(*args)


def leading_accepts(matches: torch.Tensor) -> torch.Tensor:
    """(..., γ) bool, draft ``k`` equals the target's token → (...) the accepted count: the leading run of
    matches (verification stops at the first mismatch)."""
    return torch.cumprod(matches.long(), dim=-1).sum(dim=-1)


@dataclass
class Rollout:
    """What a target-assisted rollout visited, indexed by round start ``s`` (B, S):

    ``visited``: a round starts at ``s``; ``reach``: the drafts judged there (``min(a + 1, γ, room)``, 0 where
    not visited); ``rejected``: the round's verification rejected a draft (``a < γ`` within the row);
    ``accepted``: its accepted count ``a`` (0 where not visited); ``rounds`` / ``committed``: per row, the
    rounds run and the tokens they committed (τ = committed / rounds)."""

    visited: torch.Tensor
    reach: torch.Tensor
    rejected: torch.Tensor
    accepted: torch.Tensor
    rounds: torch.Tensor
    committed: torch.Tensor

    @property
    def tau(self) -> float:
        """Tokens committed per round over the whole batch (greedy chain τ at this γ)."""
        return float(self.committed.sum()) / max(float(self.rounds.sum()), 1.0)


def walk_rounds(accepts: torch.Tensor, first: torch.Tensor, room: torch.Tensor, gamma: int) -> Rollout:
    """Walk the rounds of each row: ``accepts`` (B, S) the accepted count of a round started at ``s``
    (clamped to ``gamma``); ``first`` (B,) the first round's start (< 0: the row has no round); ``room``
    (B, S) how many tokens are left to predict after start ``s`` (a round commits at most that many). A
    round at ``s`` commits ``a + 1`` tokens (its accepted drafts and the target's next token) and the next
    starts at ``s + a + 1``, until no token is left."""
    size, width = accepts.shape
    accepts_list = accepts.clamp(min=0, max=gamma).tolist()
    room_list = room.tolist()
    visited = torch.zeros(size, width, dtype=torch.bool)
    reach = torch.zeros(size, width, dtype=torch.long)
    rejected = torch.zeros(size, width, dtype=torch.bool)
    accepted = torch.zeros(size, width, dtype=torch.long)
    rounds = torch.zeros(size, dtype=torch.long)
    committed = torch.zeros(size, dtype=torch.long)
    for row, start in enumerate(first.tolist()):
        s = int(start)
        while 0 <= s < width and room_list[row][s] > 0:
            left = int(room_list[row][s])
            a = min(int(accepts_list[row][s]), gamma, left)
            visited[row, s] = True
            accepted[row, s] = a
            reach[row, s] = min(a + 1, gamma, left)
            rejected[row, s] = a < min(gamma, left)
            rounds[row] += 1
            committed[row] += min(a + 1, left)
            s += a + 1
    device = accepts.device
    return Rollout(
        visited.to(device), reach.to(device), rejected.to(device), accepted.to(device), rounds, committed
    )


def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    """What the rollout trained on, for the logs: rounds, accepted and rejected drafts, τ."""
    return {
        "rollout_tau": rollout.tau,
        "rollout_rounds": float(rollout.rounds.sum()),
        "rollout_accepted": float(rollout.accepted.sum()),
        "rollout_rejected": float(rollout.rejected.sum()),
    }
