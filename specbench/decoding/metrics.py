"""Summary metrics of a decoding run (methods.md §7)."""

from __future__ import annotations

from collections.abc import Sequence

from specbench.decoding.cost import CostProfile
from specbench.decoding.engine import SampleResult


def predicted_speedup(alpha: float, gamma: float, cost_ratio: float) -> float:
    """S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γ·c + 1))  (Leviathan et al. 2023, Thm 3.8)."""
    if gamma <= 0:
        return 1.0
    return expected_tokens_per_round(alpha, gamma) / (gamma * cost_ratio + 1.0)


def expected_tokens_per_round(alpha: float, gamma: float) -> float:
    """E[tokens per round] = (1 − α^(γ+1)) / (1 − α), the τ predicted for i.i.d. acceptance α."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def per_position_acceptance(results: Sequence[SampleResult]) -> list[float]:
    """α_k = P(draft k accepted | drafts 1..k−1 accepted), k = 1..max drafted."""
    rounds = [r for res in results for r in res.rounds]
    longest = max((r.drafted for r in rounds), default=0)
    rates = []
    for k in range(1, longest + 1):
        reached = sum(1 for r in rounds if r.drafted >= k and r.accepted >= k - 1)
        passed = sum(1 for r in rounds if r.accepted >= k)
        rates.append(passed / reached if reached else 0.0)
    return rates


def per_position_draft_weight(results: Sequence[SampleResult]) -> list[float]:
    """Mean draft weight of drafted position k = 1..max over the rounds that drafted it (learned
    ensembles)."""
    sums: list[float] = []
    counts: list[int] = []
    for res in results:
        for record in res.rounds:
            for k, weight in enumerate(record.draft_weights or ()):
                if k == len(sums):
                    sums.append(0.0)
                    counts.append(0)
                sums[k] += weight
                counts[k] += 1
    return [s / c for s, c in zip(sums, counts)]


def summarize(
    results: Sequence[SampleResult],
    wall_time: float,
    baseline_tokens_per_s: float | None = None,
    profile: CostProfile | None = None,
) -> dict:
    """Flat metrics dict: τ, acceptance, tokens/s, cost ratio c, predicted and measured speedup.

    ``wall_time`` is the decoding time of the whole run (sum over batches), so batched rows are not
    counted twice. ``predicted_speedup`` is Leviathan's S(α, γ, c), which assumes that verifying γ + 1
    tokens costs one decoding step; with a measured ``profile`` (task=profile) also
    ``predicted_speedup_profile``: the run's own rounds priced with the measured v(n) and c.
    """
    rounds = [r for res in results for r in res.rounds]
    new_tokens = sum(len(res.output_ids) for res in results)
    forwards = len(rounds)
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    drafting_rounds = [r for r in rounds if r.draft_forwards > 0 or r.drafted > 0]
    metrics = {
        "num_samples": len(results),
        "new_tokens": new_tokens,
        "verifier_forwards": forwards,
        "tau": sum(r.emitted for r in rounds) / forwards if forwards else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_drafted_per_round": drafted / forwards if forwards else 0.0,
        "wall_time_s": wall_time,
        "tokens_per_s": new_tokens / wall_time if wall_time > 0 else 0.0,
    }
    for k, rate in enumerate(per_position_acceptance(results), start=1):
        metrics[f"acceptance_pos_{k}"] = rate
    if drafting_rounds:
        # Per drafter forward for model drafters; per drafted token for model-free ones (no forwards).
        steps = sum(r.draft_forwards for r in drafting_rounds) or sum(r.drafted for r in drafting_rounds)
        draft_step = sum(r.draft_time for r in drafting_rounds) / steps
        verify_step = sum(r.verify_time for r in drafting_rounds) / len(drafting_rounds)
        cost_ratio = draft_step / verify_step if verify_step > 0 else 0.0
        gamma = sum(r.drafted for r in drafting_rounds) / len(drafting_rounds)
        metrics["cost_ratio"] = cost_ratio
        metrics["predicted_speedup"] = predicted_speedup(metrics["acceptance_rate"], gamma, cost_ratio)
    if profile is not None and rounds:
        metrics["predicted_speedup_profile"] = profile.predicted_speedup(
            [(r.drafted, r.emitted) for r in rounds]
        )
    if rounds and all(r.verifier_logp is not None for r in rounds) and new_tokens:
        # Quality with resolution for lossy rules: lossless ones keep E[verifier_logp] of autoregressive
        # sampling.
        metrics["verifier_logp"] = sum(r.verifier_logp for r in rounds) / new_tokens
    weights = [r.mean_draft_weight for r in rounds if r.mean_draft_weight is not None]
    if weights:
        metrics["mean_draft_weight"] = sum(weights) / len(weights)
    for k, value in enumerate(per_position_draft_weight(results), start=1):
        metrics[f"draft_weight_pos_{k}"] = value
    if baseline_tokens_per_s:
        metrics["baseline_tokens_per_s"] = baseline_tokens_per_s
        metrics["speedup"] = metrics["tokens_per_s"] / baseline_tokens_per_s
        if "predicted_speedup" in metrics:
            metrics["efficiency"] = metrics["speedup"] / metrics["predicted_speedup"]
    return metrics
