"""What a task's MLflow run is called and what it records, as plain data (no mlflow import): the run name,
the flattened config params, the tags, the metrics MLflow accepts, and the run-record files a rerun or a
sweep reopens."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

PARENT_FILE = "mlflow_parent.json"  # in the sweep dir: the parent run of a multirun


RUN_FILE = "mlflow_run.json"  # in a task's output dir: its run, reopened when the task is rerun there


PARENT_TAG = "mlflow.parentRunId"


# Config keys (and prefixes) that may differ between a run and its rerun into the same dir (where and
# how it runs, not what it computes): the rerun still continues the same MLflow run / eval samples.
RERUN_MAY_CHANGE = ("eval.output_dir", "eval.resume", "eval.warmup", "runtime.num_threads", "tracking")


RUN_NAME_MAX = 250


TAG_VALUE_MAX = 8000  # MLflow 3.x MAX_TAG_VAL_LENGTH


PARAM_VALUE_MAX_FALLBACK = 6000  # MLflow 3.x MAX_PARAM_VAL_LENGTH


PARAMS_PER_BATCH = 100


METRICS_PER_BATCH = 1000


_BAD_NAME = re.compile(r"[^/\w.\- :]")


# Overrides that say where things go rather than what runs; left out of run names.
_NAME_SKIP = ("hydra.", "hydra/", "tracking.", "tracking=", "eval.output_dir=", "+cluster=", "cluster=")


def task_kind(target: str) -> str:
    """``specbench.tasks.eval.EvalTask`` → ``eval`` (the experiment is ``specbench-<kind>``)."""
    name = target.rsplit(".", 1)[-1]
    name = name[: -len("Task")] if name.endswith("Task") and name != "Task" else name
    return name.lower() or "task"


def param_value_limit() -> int:
    try:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        return int(MAX_PARAM_VAL_LENGTH)
    except ImportError:  # pragma: no cover - older/newer mlflow layouts
        return PARAM_VALUE_MAX_FALLBACK


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts → ``{"a.b.c": leaf}``; lists stay leaves (logged as JSON)."""
    if isinstance(tree, Mapping):
        flat: dict[str, Any] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        if not tree and prefix:
            flat[prefix[:-1]] = {}
        return flat
    return {prefix[:-1]: tree}


def param_string(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def logged_value(key: str, text: str) -> str:
    """What MLflow stores for param ``key``: ``text``, or a note naming its artifact when too long."""
    if len(text) <= param_value_limit():
        return text
    return f"<{len(text)} chars: see artifact params/{key}.txt>"


def safe_name(name: str) -> str:
    """A param/metric/tag key MLflow accepts (alphanumerics, ``_ - . / : space``), at most 250 chars."""
    return _BAD_NAME.sub("_", name).strip("/")[:250] or "_"


def config_params(cfg: DictConfig | Mapping, groups: Iterable[str] | None = None) -> dict[str, str]:
    """The flattened resolved config (without the ``hydra`` node) as MLflow param strings.

    ``groups``: the top-level groups to keep (None: all), e.g. an eval run leaves out ``train`` and ``synth``.
    """
    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    tree.pop("hydra", None)
    if groups is not None:
        kept = set(groups)
        tree = {k: v for k, v in tree.items() if k in kept}
    return {safe_name(key): param_string(value) for key, value in flatten(tree).items()}


def numeric_metrics(values: Mapping[str, Any]) -> dict[str, float]:
    """The real-number entries (bools as 0/1) of a flat dict; strings, None, lists are left out."""
    out = {}
    for key, value in values.items():
        if isinstance(value, (bool, int, float)) and not (isinstance(value, float) and math.isinf(value)):
            out[safe_name(key)] = float(value)
    return out


def run_name(method: str | None, overrides: Iterable[str], kind: str | None = None) -> str:
    """``"<method> key=value ..."`` from the overrides that change what runs (≤ 250 chars).

    ``method`` is the head (a task may pass another, e.g. ``report`` or ``synth <verifier>``); inside a
    sweep the caller passes only the swept overrides, so sibling runs differ by name.
    """
    kept = [o for o in overrides if not o.lstrip("+~").startswith(_NAME_SKIP)]
    head = method or kind or "run"
    name = " ".join([head, *kept]) if kept else f"{head} (defaults)"
    return name if len(name) <= RUN_NAME_MAX else name[: RUN_NAME_MAX - 1] + "…"


def name_head(cfg: Any, kind: str) -> str:
    """The head of a run name from the composed config: the (canonical) method of an eval run, else the
    task (``train diversed``, ``synth``, ``report``), never a method the task does not use."""
    method = OmegaConf.select(cfg, "method.name", default=None) if isinstance(cfg, DictConfig) else None
    if method:
        from specbench.method_names import METHOD_ALIASES

        method = METHOD_ALIASES.get(method, method)
    if kind == "eval":
        return method or kind
    if kind == "train" and method:
        return f"train {method}"
    return kind


def read_run_file(path: Path) -> dict | None:
    """The MLflow run a run file (RUN_FILE / PARENT_FILE, :func:`write_run_file`) points to, or None."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "run_id" in record else None


def override_key(override: str) -> str:
    """``+a.b=1`` → ``a.b``; ``model/verifier=x`` → ``model/verifier``."""
    return override.split("=", 1)[0].lstrip("+~")


def swept_keys(overrides: Iterable[str]) -> list[str]:
    """Keys of the sweep overrides (``a=1,2``, ``range(...)``, ``choice(...)``) of a multirun."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()]


def write_run_file(path: Path, uri: str, experiment_id: str, run_id: str, **extra: Any) -> None:
    """Point ``path`` (a run's RUN_FILE, a sweep's PARENT_FILE) at an MLflow run, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"tracking_uri": uri, "experiment_id": experiment_id, "run_id": run_id, **extra}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 40] + f"… <{len(text)} chars, clipped>"


def _select(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, default=None) if isinstance(cfg, DictConfig) else None


def _model_label(node: Any) -> str | None:
    if node is None:
        return None
    return node.get("name") or node.get("path") or node.get("kind")


def describe_tags(
    cfg: DictConfig, kind: str, overrides: list[str], groups: Iterable[str] | None = None
) -> dict[str, str]:
    """``specbench.*`` tags from the config (tasks may refine them once models are loaded).

    Method and model tags only for tasks that read those groups (a report run is about no method).
    """
    reads = (lambda group: True) if groups is None else set(groups).__contains__
    tags = {
        "specbench.task": kind,
        "specbench.method": _select(cfg, "method.name") if reads("method") else None,
        "specbench.method_alias": _select(cfg, "method.alias") if reads("method") else None,
        "specbench.verifier": _model_label(_select(cfg, "model.verifier")) if reads("model") else None,
        "specbench.drafter": _model_label(_select(cfg, "model.drafter")) if reads("model") else None,
        "specbench.overrides": json.dumps(overrides),
        "specbench.host": socket.gethostname(),
        "specbench.command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else None,
    }
    if os.environ.get("SLURM_JOB_ID"):
        tags["specbench.slurm_job_id"] = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ["SLURM_JOB_ID"])
        if os.environ.get("SLURM_ARRAY_TASK_ID"):
            tags["specbench.slurm_array_task_id"] = os.environ["SLURM_ARRAY_TASK_ID"]
    return {k: v for k, v in tags.items() if v is not None}


def may_change_on_rerun(key: str) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in RERUN_MAY_CHANGE)
