"""Entry point: compose the Hydra config, build ``cfg.task``, check it and run it.

python launch.py [task=eval] [method=sd] [model/verifier=...] [model/drafter=...] [key=value ...]

Nothing heavy is imported here: the config is composed and validated before torch, transformers, mlflow
or lightning load, so a config error is reported in about a second (benchmarks/startup.py measures it).
Exit status: 0 done, 1 the task failed, 2 a config error (no MLflow run was opened), 128 + N stopped by
signal N (130 Ctrl-C, 143 SIGTERM; the MLflow run ends KILLED).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

import specbench.config  # noqa: F401  (registers the structured configs and resolvers in Hydra)
from specbench.errors import ConfigError
from specbench.tracking import signals


def _raise_as_is() -> bool:
    """In a sweep, raise: Hydra marks this job failed and runs the others (sys.exit would stop them all)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return os.environ.get("HYDRA_FULL_ERROR") == "1" or HydraConfig.get().mode == RunMode.MULTIRUN


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> Any:
    signals.install()
    from specbench.targets import build_target
    from specbench.tasks.base import run_task

    try:
        fields = {k: v for k, v in cfg.task.items() if k != "_target_"}  # the task's own keys (task=report)
        task = build_target(cfg.task._target_, fields, "task", recursive=False, convert="none", cfg=cfg)
        return run_task(task)  # check(), then run() inside the task's MLflow run (specbench/tracking)
    except (KeyboardInterrupt, SystemExit) as err:  # the MLflow run is closed by now
        signum = signals.received()
        if os.environ.get("SUBMITIT_EXECUTOR") and signum is not None and not signals.preempted():
            raise signals.JobKilled(f"stopped by {signals.signal_name(signum)}") from err
        raise  # a requeue (submitit's own exit), or in this process: the __main__ block below
    except ConfigError as err:
        if _raise_as_is():
            raise
        print(f"Config error: {err}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:  # a file the task cannot write or read (full disk, a directory in the way, ...)
        if err.filename is None or _raise_as_is():
            raise
        print(f"Error: {err.filename}: {err.strerror or err} (the task stopped)", file=sys.stderr)
        sys.exit(1)


def _stopped() -> None:
    signum = signals.received()
    stopped_by = signals.signal_name(signum) if signum else "KeyboardInterrupt"
    print(f"Stopped by {stopped_by}.", file=sys.stderr)
    sys.exit(signals.exit_code())


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        _stopped()
    except SystemExit as stop:  # Lightning answers an interrupt with sys.exit(1): still the signal's exit
        if signals.received() is None or stop.code in (0, None):
            raise
        _stopped()
