"""Write a report: comparison table (markdown + CSV) and plots for a selection of runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specbench.reporting.plots import plot_position_acceptance, plot_quality_vs_acceptance, plot_vs_gamma
from specbench.reporting.runs import Selection
from specbench.reporting.table import comparison_table, merge_shards, to_markdown

MARKDOWN_FILE = "report.md"
CSV_FILE = "report.csv"
PLOT_FILES = {
    "vs_gamma": "acceptance_speedup_vs_gamma.png",
    "quality": "quality_vs_acceptance.png",
    "positions": "acceptance_per_position.png",
}


@dataclass
class Report:
    """What :func:`write_report` wrote: the table, file paths, and notes (skipped plots and runs)."""

    table: pd.DataFrame
    markdown: Path
    csv: Path
    plots: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        return [self.markdown, self.csv, *self.plots.values()]


def write_report(selection: Selection, out_dir: str | Path, title: str = "specbench report") -> Report:
    """Merge shards, build the table, draw the plots and write everything into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs, shard_notes = merge_shards(selection.runs)
    notes = [*selection.notes, *shard_notes]
    table = comparison_table(runs)
    by_source = {run.source: run for run in runs}
    ordered = [by_source[source] for source in table["source"]]
    labels = [_run_label(row) for _, row in table.iterrows()]

    plots: dict[str, Path] = {}
    for key, result in (
        ("vs_gamma", plot_vs_gamma(table, out / PLOT_FILES["vs_gamma"])),
        ("quality", plot_quality_vs_acceptance(table, out / PLOT_FILES["quality"])),
        ("positions", plot_position_acceptance(ordered, labels, out / PLOT_FILES["positions"])),
    ):
        if isinstance(result, Path):
            plots[key] = result
        else:
            notes.append(result)

    csv_path = out / CSV_FILE
    table.to_csv(csv_path, index=False)
    md_path = out / MARKDOWN_FILE
    md_path.write_text(_markdown(title, selection.description, table, plots, notes), encoding="utf-8")
    return Report(table, md_path, csv_path, plots, notes)


def _run_label(row: pd.Series) -> str:
    label = f"{row['run']}: {row['method']}"
    if pd.notna(row["gamma"]):
        label += f" gamma={row['gamma']:g}"
    if pd.notna(row["weight"]):
        label += f" w={row['weight']:g}"
    return label


def _markdown(
    title: str, selector: str, table: pd.DataFrame, plots: dict[str, Path], notes: list[str]
) -> str:
    lines = [f"# {title}", "", f"{len(table)} runs from {selector}.", "", to_markdown(table), ""]
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{key}]({path.name})" for key, path in plots.items()]
        lines.append("")
    if notes:
        lines += ["## Notes", ""]
        lines += [f"- {note}" for note in notes]
        lines.append("")
    per_run = [str(o).split() if isinstance(o, str) else [] for o in table["overrides"]]
    common = [o for o in per_run[0] if all(o in run for run in per_run)] if per_run else []
    lines += ["## Runs", ""]
    if common:
        lines += [f"Overrides common to every run: `{' '.join(common)}`", ""]
    lines += ["| run | other overrides | source |", "|---|---|---|"]
    for (_, row), overrides in zip(table.iterrows(), per_run):
        own = " ".join(o for o in overrides if o not in common)
        lines.append(f"| {row['run']} | {f'`{own}`' if own else '-'} | {row['source']} |")
    lines.append("")
    return "\n".join(lines)
