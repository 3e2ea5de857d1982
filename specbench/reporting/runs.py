"""Collect finished runs, from a Hydra sweep dir (files only) or from MLflow, as :class:`RunRecord`s."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specbench.tracking import config_params

METRICS_FILE = "metrics.json"


class NoRunsError(ValueError):
    """The selector matched no run; the message names the selector."""


@dataclass
class RunRecord:
    """One finished eval run, whichever store it came from.

    ``params``: the flattened resolved config with dotted keys (``method.draft_weight``) and string
    values, as :mod:`specbench.tracking` logs it to MLflow (also for runs read from a sweep dir).
    ``metrics``: numeric entries of ``metrics.json`` / MLflow metrics. ``info``: its text entries
    (``method``, ``verifier``, ...) and, for MLflow runs, the tags.
    """

    run_id: str
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    source: str = ""
    label: str = ""  # short id for tables and legends: the job dir of a sweep, 8 chars of an MLflow id

    def __post_init__(self) -> None:
        self.label = self.label or self.run_id


@dataclass
class Selection:
    """The selected runs, and notes about what was skipped."""

    runs: list[RunRecord]
    description: str
    notes: list[str] = field(default_factory=list)


def split_metrics(data: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """``metrics.json`` → (numeric entries, other entries); booleans count as text."""
    numbers: dict[str, float] = {}
    others: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers[key] = float(value)
        else:
            others[key] = value
    return numbers, others


def _job_sort_key(path: Path) -> tuple:
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in path.parts)


def _read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None


def load_sweep_dir(sweep_dir: str | Path) -> Selection:
    """Runs of a Hydra multirun dir: every job dir with a ``metrics.json`` (any depth).

    Reads ``metrics.json`` and ``.hydra/config.yaml`` / ``.hydra/overrides.yaml`` (falling back to the
    ``config.yaml`` the eval task writes); needs no MLflow. A single run dir works too.
    """
    root = Path(sweep_dir).expanduser()
    if not root.is_dir():
        raise NoRunsError(f"task.sweep_dir: {str(root)!r} is not a directory")
    job_dirs = sorted(
        (p.parent for p in root.rglob(METRICS_FILE)), key=lambda p: _job_sort_key(p.relative_to(root))
    )
    runs = []
    for job in job_dirs:
        try:
            data = json.loads((job / METRICS_FILE).read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise NoRunsError(f"{job / METRICS_FILE}: not valid JSON ({err.msg})") from err
        metrics, info = split_metrics(data)
        config = _read_yaml(job / ".hydra" / "config.yaml") or _read_yaml(job / "config.yaml") or {}
        overrides = [str(o) for o in (_read_yaml(job / ".hydra" / "overrides.yaml") or [])]
        rel = job.relative_to(root).as_posix()
        runs.append(
            RunRecord(
                run_id=rel if rel != "." else job.name,
                name=rel if rel != "." else job.name,
                params=config_params(config),
                metrics=metrics,
                info=info,
                overrides=overrides,
                source=str(job),
            )
        )
    notes = []
    with_config = {job for job in (p.parent.parent for p in root.rglob(".hydra/config.yaml"))}
    unfinished = sorted(with_config - set(job_dirs), key=lambda p: _job_sort_key(p.relative_to(root)))
    if unfinished:
        names = ", ".join(p.relative_to(root).as_posix() for p in unfinished)
        notes.append(f"jobs without {METRICS_FILE} (failed or still running), left out: {names}")
    description = f"sweep dir {str(root)!r}"
    if not runs:
        raise NoRunsError(f"no runs found in {description}: no {METRICS_FILE} under it")
    return Selection(runs, description, notes)


def parse_tags(tags: Mapping[str, Any] | Iterable[str] | None) -> dict[str, str]:
    """``{key: value}`` or ``["key=value", ...]`` → ``{key: "value"}``; else an error naming ``task.tags``."""
    if tags is None:
        return {}
    if isinstance(tags, Mapping):
        return {str(k): str(v) for k, v in tags.items()}
    if isinstance(tags, str) or not isinstance(tags, Iterable):
        raise TypeError(
            f"task.tags: expected a mapping {{key: value}} or a list of 'key=value', got {tags!r}"
        )
    parsed = {}
    for item in tags:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"task.tags: expected 'key=value' entries, got {item!r}")
        parsed[key.strip()] = value.strip()
    return parsed


def _quote(value: str) -> str:
    return "'" + str(value).replace("'", "\\'") + "'"


def mlflow_filter(
    parent_run_id: str | None = None, tags: Mapping[str, str] | None = None, extra: str | None = None
) -> str:
    """An MLflow filter string for a parent run, tag equalities and an extra clause (ANDed)."""
    clauses = []
    if parent_run_id:
        clauses.append(f"tags.`mlflow.parentRunId` = {_quote(parent_run_id)}")
    for key, value in (tags or {}).items():
        if "`" in key:
            raise ValueError(f"task.tags: a tag key may not contain a backtick: {key!r}")
        clauses.append(f"tags.`{key}` = {_quote(value)}")
    if extra:
        clauses.append(f"({extra})" if re.search(r"\bor\b", extra, re.IGNORECASE) else extra)
    return " and ".join(clauses)


def describe_selector(
    experiment: str, parent_run_id: str | None, tags: Mapping[str, str], extra: str | None
) -> str:
    parts = [f"experiment {experiment!r}"]
    if parent_run_id:
        parts.append(f"parent run {parent_run_id!r}")
    if tags:
        parts.append("tags " + ", ".join(f"{k}={v}" for k, v in tags.items()))
    if extra:
        parts.append(f"filter {extra!r}")
    return ", ".join(parts)


LAST_SWEEP = "last"  # task.parent_run_id=last: the newest sweep (-m) of the experiment


def last_sweep_run_id(client: Any, experiment_id: str, experiment: str) -> str:
    """The run id of the newest sweep parent run (tag ``specbench.role=sweep``) in the experiment."""
    newest = client.search_runs(
        [experiment_id], filter_string="tags.`specbench.role` = 'sweep'", max_results=1,
        order_by=["attributes.start_time DESC"],
    )  # fmt: skip
    if not newest:
        raise NoRunsError(
            f"task.parent_run_id=last: experiment {experiment!r} holds no sweep (a `-m` run) yet"
        )
    return newest[0].info.run_id


def search_mlflow_runs(
    experiment: str = "specbench-eval",
    parent_run_id: str | None = None,
    tags: Mapping[str, Any] | Iterable[str] | None = None,
    filter_string: str | None = None,
    tracking_uri: str | None = None,
    max_runs: int = 1000,
) -> Selection:
    """Runs of an MLflow experiment, narrowed by parent run, tags and a filter string (ANDed).

    ``tracking_uri`` None: ``$MLFLOW_TRACKING_URI``, else the project's default store
    (:func:`specbench.tracking.resolve_tracking_uri`). Runs without metrics (e.g. the parent run of a
    sweep) and failed runs are left out with a note. Uses its own client: no global MLflow state changes.
    """
    from specbench.tracking import resolve_tracking_uri, store

    tag_map = parse_tags(tags)
    uri = resolve_tracking_uri(tracking_uri)
    key = store.uri_source(tracking_uri)
    store.check_uri(uri, key)
    database = store.sqlite_path(uri)
    if database is not None and not database.is_file():
        raise NoRunsError(
            f"{key}: no MLflow database at {str(database)!r} (tracking URI {uri!r}); run something with "
            "tracking on first, or pass tracking.uri=sqlite:///PATH.db of an existing store"
        )
    client = store.client(uri, key)
    found_experiment = client.get_experiment_by_name(experiment)
    if found_experiment is None:
        description = describe_selector(experiment, parent_run_id, tag_map, filter_string)
        raise NoRunsError(
            f"no runs match {description}: experiment {experiment!r} does not exist at tracking URI {uri!r}"
        )
    if parent_run_id == LAST_SWEEP:
        parent_run_id = last_sweep_run_id(client, found_experiment.experiment_id, experiment)
    description = describe_selector(experiment, parent_run_id, tag_map, filter_string)
    query = mlflow_filter(parent_run_id, tag_map, filter_string)
    found = client.search_runs(
        [found_experiment.experiment_id],
        filter_string=query,
        max_results=max_runs,
        order_by=["attributes.start_time ASC"],
    )
    runs, without_metrics, failed = [], [], []
    for run in found:
        name = run.info.run_name or run.info.run_id
        if run.info.status == "FAILED":
            failed.append(name)
            continue
        if not run.data.metrics or run.data.tags.get("specbench.role") == "sweep":
            without_metrics.append(name)  # a sweep parent's metrics are its best child's: no row of its own
            continue
        runs.append(
            RunRecord(
                run_id=run.info.run_id,
                name=name,
                params=dict(run.data.params),
                metrics={k: float(v) for k, v in run.data.metrics.items()},
                info=dict(run.data.tags),
                overrides=_split_overrides(run.data.tags.get("specbench.overrides", "")),
                source=f"mlflow:{run.info.run_id}",
                label=run.info.run_id[:8],
            )
        )
    notes = []
    if failed:
        notes.append(f"failed runs left out: {', '.join(failed)}")
    if without_metrics:
        notes.append(f"sweep parents and runs without metrics left out: {', '.join(without_metrics)}")
    if len(found) >= max_runs:
        notes.append(f"stopped at task.max_runs={max_runs} runs; raise it to see more")
    if not runs:
        raise NoRunsError(
            f"no runs match {description} at tracking URI {uri!r}"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
    return Selection(runs, f"{description} at {uri}", notes)


def _split_overrides(text: str) -> list[str]:
    """An override tag as logged (a JSON/Python list or space separated) → list of strings."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = None
        if isinstance(value, list):
            return [str(v) for v in value]
    return text.split()
