"""What every task has: the whole composed config, ``run()``, and a place to write its outputs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specbench.config.validate import ConfigError


class Task(ABC):
    """A unit of work ``launch.py`` builds from ``cfg.task`` (``_target_``) with ``cfg=<whole config>``."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def run(self) -> Any:
        """Do the work; return a small result (e.g. the metrics dict) for Hydra sweeps."""


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
