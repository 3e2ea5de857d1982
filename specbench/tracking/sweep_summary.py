"""What a sweep's parent run says about the sweep: its axes, the settings its jobs share, the best child on
each headline metric, the jobs that did not finish, and a description table of every job.

:class:`specbench.tracking.callbacks.MlflowSweepCallback` logs the axes when the sweep starts
(:func:`sweep_axes`) and the rest when it ends, or stops early (:func:`summarize_sweep`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specbench.tracking import store
from specbench.tracking.headline import BEST_JOB_PREFIX, HEADLINE_METRICS, format_headline
from specbench.tracking.naming import PARENT_TAG, override_key, swept_keys
from specbench.tracking.run import Tracker
from specbench.tracking.ui_view import run_page_path

AXES_PARAM = "sweep.axes"  # parent param: the swept keys (each also a param: its values as written)
NOT_STARTED = "not started"
# Settings the jobs of a sweep usually share, as parent params when every finished job agrees on them.
SHARED = {
    "verifier": ("tags", "specbench.verifier"),
    "drafter": ("tags", "specbench.drafter"),
    "dataset": ("params", "dataset.name"),
    "dtype": ("tags", "specbench.dtype"),
}


def sweep_axes(overrides: Iterable[str], in_config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``{key: values as written}`` of the sweep overrides and a preset's ``hydra.sweeper.params``."""
    overrides = list(overrides)
    swept = set(swept_keys(overrides))
    axes = {str(k): str(v) for k, v in (in_config or {}).items()}
    for text in overrides:
        if override_key(text) in swept:
            axes[override_key(text)] = text.split("=", 1)[1]
    return axes


def expected_jobs(
    overrides: Iterable[str], in_config: Mapping[str, Any] | None, sweeper: str
) -> list[list[str]] | None:
    """Every job's overrides, by job number, as Hydra's basic sweeper expands the grid; None for another
    sweeper (its jobs are known only as they run)."""
    if not sweeper.endswith("BasicSweeper"):
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    arguments = [f"{k}={v}" for k, v in (in_config or {}).items()] + list(overrides)
    parsed = OverridesParser.create().parse_overrides(arguments)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


@dataclass
class SweepSummary:
    """The parent's view of its jobs once they stopped."""

    children: list[Any]
    best: dict[str, Any] = field(default_factory=dict)  # headline name → the best finished child run
    unfinished: list[str] = field(default_factory=list)  # "job 2 (schedule.gamma=5): FAILED"
    description: str = ""


def _job_num(run: Any) -> int:
    text = run.data.tags.get("specbench.job_num", "")
    return int(text) if text.isdigit() else -1


def _axis_values(overrides: Iterable[str], axes: Iterable[str]) -> dict[str, str]:
    wanted = set(axes)
    return {override_key(o): o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) in wanted}


def _child_overrides(run: Any) -> list[str]:
    import json

    try:
        return [str(o) for o in json.loads(run.data.tags.get("specbench.overrides", "[]"))]
    except ValueError:
        return []


def _shared_settings(finished: list[Any]) -> dict[str, str]:
    shared = {}
    for name, (kind, key) in SHARED.items():
        values = {getattr(run.data, kind).get(key) for run in finished}
        if len(values) == 1 and None not in values:
            shared[name] = values.pop()
    return shared


def _rows(jobs: list[list[str]] | None, children: list[Any], axes: list[str]) -> list[tuple]:
    """(job number, run or None, swept values) for every expected job, or every child when unknown."""
    by_job = {_job_num(run): run for run in children}
    if jobs is None:
        return [(n, run, _axis_values(_child_overrides(run), axes)) for n, run in sorted(by_job.items())]
    return [(n, by_job.get(n), _axis_values(job, axes)) for n, job in enumerate(jobs)]


def _describe(rows: list[tuple], axes: list[str], best: Mapping[str, Any], experiment_id: str) -> str:
    head = ["job", "run", *axes, "status", *HEADLINE_METRICS.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for number, run, values in rows:
        if run is None:
            name, status, metrics = "-", NOT_STARTED, {}
        else:
            link = run_page_path(experiment_id, run.info.run_id).removeprefix("/")
            name = f"[{run.info.run_name}]({link})"
            status, metrics = run.info.status, run.data.metrics
        cells = [str(number), name, *(values.get(a, "-") for a in axes), status]
        for metric in HEADLINE_METRICS:
            text = format_headline(metric, metrics[metric]) if metric in metrics else "-"
            winner = metric in best and run is not None and best[metric].info.run_id == run.info.run_id
            cells.append(f"**{text}**" if winner else text)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def summarize_sweep(
    client: Any, parent: Mapping[str, Any], jobs: list[list[str]] | None, axes: Mapping[str, str]
) -> SweepSummary:
    """Log onto the parent run what its jobs did (see the module docstring); returns the summary."""
    run_id, experiment_id = parent["run_id"], parent["experiment_id"]
    children = store.retry(
        client.search_runs, [experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{run_id}'",
        max_results=50000,
    )  # fmt: skip
    finished = [run for run in children if run.info.status == "FINISHED"]
    summary = SweepSummary(children)
    for name in HEADLINE_METRICS:
        scored = [run for run in finished if name in run.data.metrics]
        if scored:
            summary.best[name] = max(scored, key=lambda run: run.data.metrics[name])
    rows = _rows(jobs, children, list(axes))
    for number, run, values in rows:
        status = NOT_STARTED if run is None else run.info.status
        if status != "FINISHED":
            swept = " ".join(f"{k}={v}" for k, v in values.items())
            summary.unfinished.append(f"job {number}" + (f" ({swept})" if swept else "") + f": {status}")
    tracker = Tracker(client, parent["tracking_uri"], experiment_id, run_id)
    tracker._existing_params = dict(store.retry(client.get_run, run_id).data.params)
    tracker.log_params(_shared_settings(finished))
    metrics: dict[str, float] = {}
    for name, run in summary.best.items():
        metrics[name] = run.data.metrics[name]
        metrics[BEST_JOB_PREFIX + name] = _job_num(run)
    tracker.log_metrics(metrics)
    table = _describe(rows, list(axes), summary.best, experiment_id)
    done = f"{len(finished)} of {len(rows)} jobs finished"
    missing = f"; did not finish: {'; '.join(summary.unfinished)}" if summary.unfinished else ""
    summary.description = (
        f"{done}{missing}.\n\n{table}\n\nSwept: {', '.join(f'{k}={v}' for k, v in axes.items()) or '-'}. "
        "Bold: the best job on each headline metric (the parent's metrics of the same names; "
        "`best_job/<metric>` is its job number). The `task=report` table and plots: artifacts, `report/`."
    )
    tags = {
        f"specbench.best.{name}": f"job {_job_num(run)}: {run.info.run_name}"
        for name, run in summary.best.items()
    }
    tags["specbench.unfinished_jobs"] = "; ".join(summary.unfinished) or "none"
    tags["mlflow.note.content"] = summary.description
    tracker.set_tags(tags)
    return summary
