"""Per-sample rewards of DIVERSED rollouts: the dataset's scorer (ROUGE-2 F1, sentence BLEU / 100, exact
match, sandboxed pass/fail), grouped by metric so each scorer runs once per batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specbench.data.dataset_config import dataset_settings
from specbench.scoring import SPEC_BENCH_SCORED, ScoringOptions, sample_rewards

REWARD_METRICS = ("rouge", "bleu", "exact_match", "pass@1", "spec_bench")


@dataclass
class RewardSpec:
    """How rollouts of a dataset are scored: its metric, stop strings per prompt format, sandbox options."""

    metric: str
    stops: tuple[str, ...]
    options: ScoringOptions

    def __call__(self, texts: Sequence[str], items: Sequence[dict]) -> list[float]:
        """Per-sample rewards in [0, 1] of ``texts`` for the prompt ``items`` (see
        :func:`specbench.training.prompt_data.prompt_items`)."""
        rewards = [0.0] * len(texts)
        groups: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            metric = (
                SPEC_BENCH_SCORED.get(item.get("category")) if self.metric == "spec_bench" else self.metric
            )
            if metric is None or (metric != "pass@1" and item.get("reference") is None):
                continue  # nothing to score against: reward 0
            groups.setdefault(metric, []).append(i)
        for metric, chosen in groups.items():
            stops = () if items[chosen[0]]["format"] == "chat" else self.stops
            scores = sample_rewards(
                metric,
                [texts[i] for i in chosen],
                [items[i].get("reference") for i in chosen],
                metas=[items[i].get("meta") or {} for i in chosen],
                stops=stops,
                options=self.options,
            )
            for i, score in zip(chosen, scores):
                rewards[i] = float(score)
        return rewards


def reward_spec(cfg: Any) -> RewardSpec:
    """The reward of ``cfg.dataset`` (its metric must have per-sample rewards) with ``cfg.scoring``
    options."""
    data = dataset_settings(cfg.dataset)
    metric, stops = data.scorer("plain")
    if metric not in REWARD_METRICS:
        raise ValueError(
            f"dataset.metric: DIVERSED training needs a per-sample reward, but dataset {data.name!r} has "
            "metric "
            f"{metric!r}; use a dataset with references (cnndm, xsum, wmt, gsm8k, humaneval, mbpp, "
            "spec_bench "
            "translation/math_reasoning) or set dataset.metric"
        )
    return RewardSpec(metric, tuple(stops), ScoringOptions.from_config(cfg.scoring))
