"""What every task has: the composed config, ``check()``, ``run()``, a place for its outputs, an MLflow run.

Importing this module imports neither torch nor mlflow: ``launch.py`` builds and checks a task before
either is loaded, so a config error is reported in about a second.
"""

from __future__ import annotations

import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specbench.errors import ConfigError
from specbench.tracking import NULL_TRACKER, NullTracker, task_kind, task_run
from specbench.tracking.run import check_tracking, tracking_enabled


class Task(ABC):
    """A unit of work ``launch.py`` builds from ``cfg.task`` (``_target_``) with ``cfg=<whole config>``.

    ``launch.py`` runs it through :func:`run_task`: ``check()`` first (no MLflow run is opened for a
    config error it finds), then ``run()`` inside the task's MLflow run, with ``self.tracker`` set.
    Called directly (notebook, tests) ``run()`` logs nowhere.
    """

    tracker: NullTracker = NULL_TRACKER
    # Top-level config groups this task reads: only these become MLflow params (None: all of them).
    config_groups: tuple[str, ...] | None = None

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.tracker = NULL_TRACKER

    @property
    def kind(self) -> str:
        """``eval`` for ``EvalTask``: names the MLflow experiment (``specbench-<kind>``)."""
        return task_kind(type(self).__name__)

    def check(self) -> None:
        """Validate the config and the inputs (before an MLflow run is opened); default: nothing."""

    def run_dir(self) -> Path | None:
        """Where the task writes (not created here): records its MLflow run there for reruns/requeues."""
        return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None

    def run_name(self) -> str | None:
        """The head of the MLflow run name (None: the method); the run's distinguishing values follow."""
        return None

    def tracked_metrics(self, result: Mapping[str, Any]) -> Mapping[str, Any]:
        """The entries of ``run()``'s result that are measurements (MLflow metrics); default: all."""
        return result

    @abstractmethod
    def run(self) -> Any:
        """Do the work; return a small result (e.g. the metrics dict) for Hydra sweeps."""


def run_task(task: Task) -> Any:
    """``task.check()``, then ``task.run()`` inside its MLflow run (:func:`specbench.tracking.task_run`).

    The run ends FAILED if ``run()`` raises (KILLED on SIGINT / SIGTERM); the numbers of a returned flat
    dict (:meth:`Task.tracked_metrics`) become its metrics. A config error found by ``check()`` (or an
    unreachable tracking store) opens no run.
    """
    if tracking_enabled(task.cfg):
        check_tracking(task.cfg)  # seconds, not minutes of MLflow's retries, and before torch loads
    task.check()
    with task_run(
        task.cfg, task.kind, task.run_dir(), groups=task.config_groups, head=task.run_name()
    ) as tracker:
        task.tracker = tracker
        try:
            result = task.run()
        finally:
            task.tracker = NULL_TRACKER
        if isinstance(result, Mapping):
            tracker.log_metrics(task.tracked_metrics(result))
        if HydraConfig.initialized():  # Hydra's composed config, overrides and hydra.yaml
            tracker.log_artifacts(Path(HydraConfig.get().runtime.output_dir) / ".hydra", "hydra")
        return result


def load_task_prompts(dataset: Any) -> list:
    """The prompts of the ``dataset`` config; a missing source or a corrupt row is a one-line ConfigError."""
    from specbench.data.dataset_sources import DatasetUnavailableError
    from specbench.data.datasets import load_dataset_prompts

    try:
        prompts = load_dataset_prompts(dataset)
    except DatasetUnavailableError as err:
        raise ConfigError(str(err)) from err
    except ValueError as err:  # a corrupt row: the message names file and line
        message = " ".join(str(err).split())
        raise ConfigError(message if message.startswith("dataset") else f"dataset.path: {message}") from err
    if not prompts:
        source = f"dataset.path={dataset.path}" if dataset.get("path") else f"dataset={dataset.name}"
        raise ConfigError(f"{source} gives no prompts (empty, or every row filtered out by its settings)")
    return prompts


def configured_dir(configured: str | None) -> Path | None:
    """``configured`` (expanded) if set, else the Hydra run dir, else None (library use)."""
    if configured:
        return Path(configured).expanduser()
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return None


def check_writable(path: Path | None, key: str) -> None:
    """Create ``path`` and write a probe file in it; a ConfigError naming ``key`` if that fails.

    Done in ``check()``, so an output dir that cannot be written fails before any run opens or model loads.
    """
    if path is None:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".specbench-probe-"):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(path) else ""
        raise ConfigError(
            f"{key}: cannot write to {str(path)!r}: {reason}{where}; pass {key}=DIR with a writable directory"
        ) from err


def verifier_placement(cfg: Any, plan: Any) -> Any:
    """Where the verifier's weights go: its spec's device_map / max_memory / offload_folder and
    ``runtime.tp_plan`` (a :class:`specbench.models.sharding.Placement`; validate checked it)."""
    from specbench.models.sharding import Placement

    return Placement.of(plan.verifier, cfg.runtime.get("tp_plan"))


def output_dir(configured: str | None, key: str) -> Path:
    """``configured`` if set, else the Hydra run dir; created if missing.

    Outside a Hydra run (library or test use) ``configured`` must be set; ``key`` names it in the error.
    """
    path = configured_dir(configured)
    if path is None:
        raise ConfigError(f"{key} must be set when running outside launch.py (no Hydra run dir)")
    check_writable(path, key)
    return path

