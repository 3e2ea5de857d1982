"""The headline metrics: the few numbers a sweep is compared on, under the same names in every task.

An eval run logs all four; a synth run logs ``tokens_per_s``; a train run with held-out decoding logs
``tau`` (its ``val/tau``). A sweep's parent run logs, under these same names, the best child's value, and
``best_job/<name>`` the job number of that child (:mod:`specbench.tracking.sweep_summary`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# name → short label; for all four, higher is better.
HEADLINE_METRICS = {
    "tau": "τ",
    "tokens_per_s": "tokens/s",
    "speedup": "speedup",
    "baseline_match_rate": "match greedy",
}
BEST_JOB_PREFIX = "best_job/"


def headline_values(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The headline metrics present in ``metrics`` (numbers only), in :data:`HEADLINE_METRICS` order."""
    return {
        name: float(metrics[name])
        for name in HEADLINE_METRICS
        if isinstance(metrics.get(name), (int, float)) and not isinstance(metrics.get(name), bool)
    }


def format_headline(name: str, value: float) -> str:
    """A headline value as the sweep's description table shows it."""
    if name == "speedup":
        return f"{value:.2f}x"
    if name == "tokens_per_s":
        return f"{value:.1f}"
    if name == "baseline_match_rate":
        return f"{value:.0%}"
    return f"{value:.3f}"
