"""Report plots: each returns the PNG path, or a note saying why it was skipped.

Figures are built with ``matplotlib.figure.Figure`` and rendered by Agg on save, without pyplot, so
importing this module changes no global backend (safe in notebooks and in headless jobs).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from specbench.reporting.runs import RunRecord
from specbench.reporting.table import (
    GROUP_COLUMNS,
    QUALITY_COUNTS,
    QUALITY_PREFIX,
    format_weight,
    position_metrics,
)

MAX_LEGEND = 12


def _series_label(method: object, weight: object, group: str = "") -> str:
    label = str(method)
    if pd.notna(weight):
        label += f" w={format_weight(weight)}"
    return f"{group}: {label}" if group else label


def _has(table: pd.DataFrame, column: str) -> bool:
    return column in table.columns and table[column].notna().any()


def _groups(table: pd.DataFrame) -> list[str]:
    """The (model pair, dataset) group of each row, as a legend prefix: empty when all rows share one."""
    if not all(c in table.columns for c in GROUP_COLUMNS):
        return [""] * len(table)
    labels = [f"{pair} | {dataset}" for pair, dataset in zip(table["pair"], table["dataset"])]
    return labels if len(set(labels)) > 1 else [""] * len(table)


def _one_value(values: pd.Series) -> object | None:
    """The single value of an x-axis column (a plot of it would be a column of dots), else None."""
    distinct = values.dropna().unique()
    return distinct[0] if len(distinct) == 1 else None


def plot_vs_gamma(table: pd.DataFrame, path: Path) -> Path | str:
    """Acceptance and speedup against gamma, one line per (method, weight)."""
    table = table.assign(group=_groups(table))
    data = table[(table["method"] != "auto") & table["gamma"].notna()] if _has(table, "gamma") else table[:0]
    if data.empty:
        return "acceptance/speedup vs gamma: skipped, no run with a drafter and a known gamma"
    only = _one_value(data["gamma"])
    if only is not None:
        return (
            f"acceptance/speedup vs gamma: skipped, every run with a drafter has gamma={only:g} (one x value)"
        )
    panels = [
        (c, label)
        for c, label in (("acceptance", "acceptance rate"), ("speedup", "speedup (x)"))
        if _has(data, c)
    ]
    if not panels:
        return "acceptance/speedup vs gamma: skipped, no run has acceptance or speedup"
    fig = Figure(figsize=(5.5 * len(panels), 4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (column, ylabel) in zip(axes[0], panels):
        groups = list(data.groupby(["group", "method", "weight"], dropna=False, sort=True))
        for (label_group, method, weight), group in groups:
            group = group[group[column].notna()]
            means = group.groupby("gamma")[column].mean().sort_index()
            ax.plot(means.index, means.values, marker="o", label=_series_label(method, weight, label_group))
        if column == "speedup":
            ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("gamma (drafts per round)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} vs gamma")
        ax.grid(alpha=0.3)
        if len(groups) <= MAX_LEGEND:
            ax.legend(fontsize=8)
    missing = {"acceptance", "speedup"} - {c for c, _ in panels}
    if missing:
        fig.text(0.01, 0.01, f"no {', '.join(sorted(missing))} in these runs", fontsize=8)
    return _save(fig, path)


def plot_quality_vs_acceptance(table: pd.DataFrame, path: Path) -> Path | str:
    """Quality against acceptance, points labelled by ensemble weight, one line per (method, gamma).

    Without a ``quality*`` metric, falls back to ``baseline_match_rate`` (share of outputs identical to
    greedy autoregressive decoding) if the table has it, and says so on the axis.
    """
    quality = [
        c
        for c in table.columns
        if c.startswith(QUALITY_PREFIX) and c not in QUALITY_COUNTS and table[c].notna().any()
    ]
    if not quality and _has(table, "baseline_match_rate"):
        quality = ["baseline_match_rate"]
    if not quality:
        return "quality vs acceptance: skipped, no quality_* metric in these runs (datasets with references)"
    if not _has(table, "acceptance"):
        return "quality vs acceptance: skipped, no run has an acceptance rate"
    only = _one_value(table["acceptance"])
    if only is not None:
        return f"quality vs acceptance: skipped, every run has acceptance {only:.3g} (one x value)"
    table = table.assign(group=_groups(table))
    fig = Figure(figsize=(5.5 * len(quality), 4), layout="constrained")
    axes = fig.subplots(1, len(quality), squeeze=False)
    for ax, column in zip(axes[0], quality):
        data = table[table[column].notna() & table["acceptance"].notna()]
        series = data.groupby(["group", "method", "gamma"], dropna=False, sort=True)
        for (label_group, method, gamma), group in series:
            group = group.sort_values("weight", na_position="first")
            label = f"{method}" + (f" gamma={gamma:g}" if pd.notna(gamma) else "")
            label = f"{label_group}: {label}" if label_group else label
            ax.plot(group["acceptance"], group[column], marker="o", label=label)
            for _, row in group.iterrows():
                if pd.notna(row["weight"]):
                    ax.annotate(
                        f"w={format_weight(row['weight'])}",
                        (row["acceptance"], row[column]),
                        fontsize=7,
                        xytext=(3, 3),
                        textcoords="offset points",
                    )
        ax.set_xlabel("acceptance rate")
        ylabel = (
            column if column != "baseline_match_rate" else "match with greedy verifier (no quality metric)"
        )
        ax.set_ylabel(ylabel)
        ax.set_title(f"{column} vs acceptance")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_position_acceptance(runs: list[RunRecord], labels: list[str], path: Path) -> Path | str:
    """Per-position acceptance α_k against k, one line per run."""
    series = [(label, position_metrics(run)) for run, label in zip(runs, labels)]
    series = [(label, pairs) for label, pairs in series if pairs]
    if not series:
        return "per-position acceptance: skipped, no acceptance_pos_* metric in these runs"
    positions = {k for _, pairs in series for k, _ in pairs}
    if len(positions) < 2:
        only = min(positions)
        return f"per-position acceptance: skipped, every run has only draft position {only} (one x value)"
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for label, pairs in series:
        ax.plot([k for k, _ in pairs], [v for _, v in pairs], marker="o", label=label)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(draft k accepted | drafts 1..k-1 accepted)")
    ax.set_title("per-position acceptance")
    ax.set_ylim(-0.02, 1.02)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if len(series) <= MAX_LEGEND:
        ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110, format="png")
    return path
