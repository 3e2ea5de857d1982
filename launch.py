"""Entry point: compose the Hydra config, build ``cfg.task`` and run it.

python launch.py [task=eval] [method=sd] [model/verifier=...] [model/drafter=...] [key=value ...]
"""

from __future__ import annotations

import os
import sys
from typing import Any

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

import specbench.config  # noqa: F401  (registers the structured configs in Hydra's ConfigStore)
from specbench.config import ConfigError


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> Any:
    try:
        task = instantiate(cfg.task, cfg=cfg, _recursive_=False)
        return task.run()
    except ConfigError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"Config error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
