"""Runs → one comparison table (pandas), shard merging, markdown and CSV."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pandas as pd

from specbench.method_names import METHOD_ALIASES, quiet_value, table_labels
from specbench.reporting.runs import RunRecord

QUALITY_PREFIX = "quality"
# quality_* entries that count things rather than score outputs: tabulated and summed, never plotted.
QUALITY_COUNTS = ("quality_num_scored", "quality_code_timeouts")
POSITION_PREFIX = "acceptance_pos_"
# Table columns before the quality columns, and their markdown headers.
MAIN_COLUMNS = {
    "run": "run",
    "method": "method",
    "schedule": "schedule",
    "gamma": "gamma",
    "weight": "weight",
    "tau": "τ",
    "acceptance": "acceptance",
    "tokens_per_s": "tokens/s",
    "speedup": "speedup",
}
MARKDOWN_EXTRAS = {"baseline_match_rate": "match greedy", "samples": "samples", "shards": "shards"}
# Markdown columns after the numbers: what else sets a row apart, and the group it belongs to.
MARKDOWN_LABELS = {"params": "method params", "pair": "verifier + drafter", "dataset": "dataset"}
EXTRA_COLUMNS = [
    "baseline_match_rate",
    "samples",
    "shards",
    "params",
    "pair",
    "verifier",
    "drafter",
    "dataset",
    "name",
    "overrides",
    "source",
]
# method.* params shown in the params column (the draft weight has its own column), with short names.
PARAM_LABELS = table_labels(skip=("draft_weight",))  # from the method table (specbench/method_names.py)
GROUP_COLUMNS = ["pair", "dataset"]
TRAINED_CHECKPOINTS = {
    "sd2": "steering.checkpoint",
    "distill": "method.drafter_checkpoint",
    "diversed": "method.head_checkpoint",
}
# Params that differ between the shards of one configuration (and say nothing about it).
SHARD_KEYS = ("eval.shard_id", "eval.output_dir")
SUMMED = (
    "new_tokens",
    "verifier_forwards",
    "num_samples",
    "wall_time_s",
    "baseline_new_tokens",
    "baseline_wall_time_s",
    "baseline_verifier_forwards",
    *QUALITY_COUNTS,
)


def number(value: Any) -> float | None:
    """A float from a metric or a param (MLflow params are strings); None if it is not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(result) else result


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value)
    return None if text in ("", "None", "null") else text


def method_of(run: RunRecord) -> str | None:
    """The canonical method name (aliases such as ``sd_static`` resolved)."""
    name = (
        _text(run.info.get("method"))
        or _text(run.info.get("specbench.method"))
        or _text(run.params.get("method.name"))
    )
    return METHOD_ALIASES.get(name, name) if name else None


def gamma_of(run: RunRecord) -> float | None:
    if method_of(run) == "auto":
        return 0.0
    gamma = number(run.metrics.get("gamma"))
    if gamma is not None:
        return gamma
    schedule = _text(run.params.get("schedule.name"))
    key = "schedule.max_gamma" if schedule == "dynamic" else "schedule.gamma"
    return number(run.params.get(key))


def weight_of(run: RunRecord) -> float | None:
    """The ensemble's draft weight: configured (static) or mean per token (learned); None for other rules."""
    for key in ("method_draft_weight", "mean_draft_weight"):
        if number(run.metrics.get(key)) is not None:
            return number(run.metrics[key])
    if method_of(run) == "static_ensemble":
        return number(run.params.get("method.draft_weight"))
    return None


def format_weight(value: Any) -> str:
    """A draft weight as people write it: 0.3 (not 0.30000000000000004), 0.487 for a learned mean."""
    number_ = number(value)
    return "-" if number_ is None else f"{number_:.3g}"


def params_of(run: RunRecord) -> str | None:
    """The method's other parameters (``lenience=0.5``, ``deferral=chow alpha=0.1``, ...), None if none.

    A trained method (sd2, distill, diversed) shows its checkpoint's file name, or ``untrained``.
    """
    parts = []
    for key, label in PARAM_LABELS:
        value = _text(run.params.get(f"method.{key}"))
        if value is None or value == quiet_value(key):
            continue
        shown = value.rsplit("/", 1)[-1] if key.endswith("checkpoint") else value
        parts.append(f"{label}={f'{number(value):.4g}' if number(value) is not None else shown}")
    checkpoint_key = TRAINED_CHECKPOINTS.get(method_of(run) or "")
    if checkpoint_key == "steering.checkpoint" and _text(run.params.get(checkpoint_key)):
        parts.append(f"steering={_text(run.params[checkpoint_key]).rsplit('/', 1)[-1]}")
    elif checkpoint_key and not _text(run.params.get(checkpoint_key)) and run.params:
        parts.append("untrained")
    return " ".join(parts) or None


def pair_of(verifier: str | None, drafter: str | None) -> str:
    return f"{verifier or '?'} + {drafter or 'none'}"


def quality_metrics(runs: list[RunRecord]) -> list[str]:
    """Every metric named ``quality*`` in any run, sorted."""
    return sorted({k for run in runs for k in run.metrics if k.startswith(QUALITY_PREFIX)})


def position_metrics(run: RunRecord) -> list[tuple[int, float]]:
    """(k, α_k) pairs of a run, by k."""
    pairs = []
    for key, value in run.metrics.items():
        suffix = key[len(POSITION_PREFIX) :]
        if key.startswith(POSITION_PREFIX) and suffix.isdigit():
            pairs.append((int(suffix), value))
    return sorted(pairs)


def _config_key(run: RunRecord) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in run.params.items() if k not in SHARD_KEYS))


def merge_shards(runs: list[RunRecord]) -> tuple[list[RunRecord], list[str]]:
    """Merge the shards (``eval.num_shards`` > 1) of one configuration into one run.

    Counts and times are summed; τ, acceptance, tokens/s and speedup are recomputed from the sums;
    per-position acceptance is weighted by verifier forwards, quality scores by scored samples and
    other metrics by samples (exact for per-sample means, approximate for corpus-level BLEU).
    """
    groups: dict[tuple, list[RunRecord]] = defaultdict(list)
    order: list[tuple] = []
    merged: list[RunRecord] = []
    for run in runs:
        shards = number(run.params.get("eval.num_shards"))
        if shards is None or shards <= 1:
            merged.append(run)
            continue
        key = _config_key(run)
        if key not in groups:
            order.append(key)
        groups[key].append(run)
    notes = []
    for key in order:
        parts = groups[key]
        expected = int(number(parts[0].params["eval.num_shards"]))
        ids = sorted(int(number(p.params.get("eval.shard_id")) or 0) for p in parts)
        run = _merge(parts)
        run.info["shards"] = f"{len(parts)}/{expected}"
        if ids != list(range(expected)):
            notes.append(f"{run.name}: has shards {ids} of {expected} (incomplete or duplicated)")
        merged.append(run)
    return merged, notes


def _merge(parts: list[RunRecord]) -> RunRecord:
    first = parts[0]
    metrics: dict[str, float] = {}

    def total(key: str) -> float:
        return sum(p.metrics.get(key, 0.0) for p in parts)

    def weighted(key: str, weight_key: str) -> float | None:
        pairs = [(p.metrics[key], p.metrics.get(weight_key, 1.0)) for p in parts if key in p.metrics]
        weight = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / weight if pairs and weight else None

    for key in SUMMED:
        if any(key in p.metrics for p in parts):
            metrics[key] = total(key)
    forwards = total("verifier_forwards")
    drafted = [
        p.metrics.get("mean_drafted_per_round", 0.0) * p.metrics.get("verifier_forwards", 0.0) for p in parts
    ]
    accepted = sum(d * p.metrics.get("acceptance_rate", 0.0) for d, p in zip(drafted, parts))
    if forwards:
        metrics["tau"] = (
            sum(p.metrics.get("tau", 0.0) * p.metrics.get("verifier_forwards", 0.0) for p in parts) / forwards
        )
        metrics["mean_drafted_per_round"] = sum(drafted) / forwards
    metrics["acceptance_rate"] = accepted / sum(drafted) if sum(drafted) else 0.0
    if metrics.get("wall_time_s"):
        metrics["tokens_per_s"] = metrics.get("new_tokens", 0.0) / metrics["wall_time_s"]
    if metrics.get("baseline_wall_time_s") and all("speedup" in p.metrics for p in parts):
        metrics["baseline_tokens_per_s"] = metrics["baseline_new_tokens"] / metrics["baseline_wall_time_s"]
        metrics["speedup"] = metrics["tokens_per_s"] / metrics["baseline_tokens_per_s"]
    for key in sorted({k for p in parts for k in p.metrics} - set(metrics)):
        if key in ("speedup", "baseline_tokens_per_s", "efficiency"):
            continue  # not recomputable unless every shard had a baseline
        if key.startswith(POSITION_PREFIX):
            weight_key = "verifier_forwards"
        elif key.startswith(QUALITY_PREFIX) and all("quality_num_scored" in p.metrics for p in parts):
            weight_key = "quality_num_scored"
        else:
            weight_key = "num_samples"
        value = weighted(key, weight_key)
        if value is not None:
            metrics[key] = value
    params = {k: v for k, v in first.params.items() if k not in SHARD_KEYS}
    return RunRecord(
        run_id="+".join(p.run_id for p in parts),
        name=f"{first.name} (merged {len(parts)} shards)",
        params=params,
        metrics=metrics,
        info=dict(first.info),
        overrides=[o for o in first.overrides if not o.startswith("eval.shard_id=")],
        source=", ".join(p.source for p in parts),
        label=f"{first.label}+{len(parts) - 1}",
    )


def comparison_table(runs: list[RunRecord]) -> pd.DataFrame:
    """One row per run: method, schedule, gamma, weight, τ, acceptance, tokens/s, speedup, quality*,
    extras."""
    quality = quality_metrics(runs)
    rows = []
    for run in runs:
        row = {
            "run": run.label,
            "method": method_of(run),
            "schedule": _text(run.info.get("schedule")) or _text(run.params.get("schedule.name")),
            "gamma": gamma_of(run),
            "weight": weight_of(run),
            "tau": number(run.metrics.get("tau")),
            "acceptance": number(run.metrics.get("acceptance_rate")),
            "tokens_per_s": number(run.metrics.get("tokens_per_s")),
            "speedup": number(run.metrics.get("speedup")),
        }
        row.update({name: number(run.metrics.get(name)) for name in quality})
        row.update(
            {
                "baseline_match_rate": number(run.metrics.get("baseline_match_rate")),
                "samples": number(run.metrics.get("num_samples")),
                "shards": run.info.get("shards"),
                "verifier": _text(run.info.get("verifier"))
                or _text(run.info.get("specbench.verifier"))  # MLflow runs: the loaded model's name
                or _text(run.params.get("model.verifier.name")),
                "drafter": _text(run.info.get("drafter"))
                or _text(run.info.get("specbench.drafter"))
                or _text(run.params.get("model.drafter.name"))
                or _text(run.params.get("model.drafter.kind")),
                "dataset": _text(run.info.get("dataset")) or _text(run.params.get("dataset.name")),
                "name": run.name,
                "overrides": " ".join(run.overrides),
                "source": run.source,
            }
        )
        if method_of(run) == "auto":
            row["acceptance"] = None  # nothing is drafted
        row["params"] = params_of(run)
        row["pair"] = pair_of(row["verifier"], None if method_of(run) == "auto" else row["drafter"])
        rows.append(row)
    columns = [*MAIN_COLUMNS, *quality, *EXTRA_COLUMNS]
    table = pd.DataFrame(rows, columns=columns)
    table["dataset"] = table["dataset"].fillna("?")
    return table.sort_values(
        [*GROUP_COLUMNS, "method", "gamma", "weight", "run"], na_position="first", kind="stable"
    ).reset_index(drop=True)


def _cell(value: Any, column: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if column == "weight":
        return format_weight(value)
    if column == "gamma" or column == "samples":
        return f"{value:g}"
    if column == "speedup":
        return f"{value:.2f}x"
    if column == "tokens_per_s":
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value).replace("|", "\\|")


def to_markdown(table: pd.DataFrame) -> str:
    """The comparison columns as a GitHub markdown table (``-`` for a missing value), then the method's
    other parameters (when any run has some) and the model pair and dataset each row belongs to."""
    quality = [c for c in table.columns if c.startswith(QUALITY_PREFIX)]
    columns = [c for c in [*MAIN_COLUMNS, *quality] if c in table.columns]
    columns += [c for c in ("baseline_match_rate", "samples", "shards", "params") if table[c].notna().any()]
    columns += GROUP_COLUMNS
    headers = [{**MAIN_COLUMNS, **MARKDOWN_EXTRAS, **MARKDOWN_LABELS}.get(c, c) for c in columns]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for _, row in table.iterrows():
        lines.append("| " + " | ".join(_cell(row[c], c) for c in columns) + " |")
    return "\n".join(lines)
