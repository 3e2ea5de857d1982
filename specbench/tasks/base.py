"""What every task has: the whole composed config, ``run()``, a place for its outputs, an MLflow run."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specbench.config.validate import ConfigError
from specbench.tracking import NULL_TRACKER, NullTracker, task_kind, task_run


class Task(ABC):
    """A unit of work ``launch.py`` builds from ``cfg.task`` (``_target_``) with ``cfg=<whole config>``.

    ``launch.py`` runs it through :func:`run_task`, which opens the task's MLflow run around ``run()``
    and sets ``self.tracker``; called directly (notebook, tests) ``run()`` logs nowhere.
    """

    tracker: NullTracker = NULL_TRACKER

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.tracker = NULL_TRACKER

    @property
    def kind(self) -> str:
        """``eval`` for ``EvalTask``: names the MLflow experiment (``specbench-<kind>``)."""
        return task_kind(type(self).__name__)

    def check(self) -> None:
        """Validate the config without side effects (before an MLflow run is opened); default: nothing."""

    def run_dir(self) -> Path | None:
        """Where the task writes (not created here): records its MLflow run there for reruns/requeues."""
        return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None

    @abstractmethod
    def run(self) -> Any:
        """Do the work; return a small result (e.g. the metrics dict) for Hydra sweeps."""


def run_task(task: Task) -> Any:
    """``task.check()``, then ``task.run()`` inside its MLflow run (:func:`specbench.tracking.task_run`).

    The run ends FAILED if ``run()`` raises; the numbers of a returned flat dict become its metrics.
    A config error found by ``check()`` opens no run.
    """
    task.check()
    with task_run(task.cfg, task.kind, task.run_dir()) as tracker:
        task.tracker = tracker
        try:
            result = task.run()
        finally:
            task.tracker = NULL_TRACKER
        if isinstance(result, Mapping):
            tracker.log_metrics(result)
        if HydraConfig.initialized():  # Hydra's composed config, overrides and hydra.yaml
            tracker.log_artifacts(Path(HydraConfig.get().runtime.output_dir) / ".hydra", "hydra")
        return result


def load_task_prompts(dataset: Any) -> list:
    """The prompts of the ``dataset`` config; a missing source or a corrupt row becomes a one-line ConfigError."""
    from specbench.data.datasets import DatasetUnavailableError, load_dataset_prompts

    try:
        return load_dataset_prompts(dataset)
    except DatasetUnavailableError as err:
        raise ConfigError(str(err)) from err
    except ValueError as err:  # a corrupt row: the message names file and line
        raise ConfigError(f"dataset.path: {err}") from err


def output_dir(configured: str | None, key: str) -> Path:
    """``configured`` if set, else the Hydra run dir; created if missing.

    Outside a Hydra run (library or test use) ``configured`` must be set; ``key`` names it in the error.
    """
    if configured:
        path = Path(configured).expanduser()
    elif HydraConfig.initialized():
        path = Path(HydraConfig.get().runtime.output_dir)
    else:
        raise ConfigError(f"{key} must be set when running outside launch.py (no Hydra run dir)")
    path.mkdir(parents=True, exist_ok=True)
    return path
