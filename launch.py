"""Entry point: compose the Hydra config, build ``cfg.task`` and run it.

python launch.py [task=eval] [method=sd] [model/verifier=...] [model/drafter=...] [key=value ...]
"""

from __future__ import annotations

import os
import sys
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig

import specbench.config  # noqa: F401  (registers the structured configs in Hydra's ConfigStore)
from specbench.config import ConfigError
from specbench.tasks.base import run_task


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> Any:
    try:
        task = instantiate(cfg.task, cfg=cfg, _recursive_=False)
        return run_task(task)  # inside the task's MLflow run (specbench/tracking)
    except ConfigError as err:
        # In a sweep, raise: Hydra marks this job failed and runs the others (sys.exit would stop them all).
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or HydraConfig.get().mode == RunMode.MULTIRUN:
            raise
        print(f"Config error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
