"""Hydra callback: before a ``-m`` sweep starts any job, compose every job's config and check its method.

Registered in ``conf/config.yaml`` (``hydra.callbacks.sweep_check``, before the MLflow parent run opens).
A sweep over a parameter the method does not read (``-m method.draft_weight=0.1,0.3`` with ``method=sd``)
would run identical jobs; on a cluster that is an afternoon lost. So each job of the grid (the command
line's sweeps and a preset's ``hydra.sweeper.params``, expanded as Hydra's basic sweeper does) is composed
and its ``method`` node normalized (specbench/config/methods.py): an unknown method or an unread parameter
stops the sweep with exit status 2, naming the job, before any job runs, under any launcher. Other
sweepers (Optuna, Ax, ...) choose their jobs as they go: only the first composition is checked then.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from specbench.errors import ConfigError

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """Every job's overrides, in the order Hydra's basic sweeper runs them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    grid = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}
    arguments = [f"{key}={value}" for key, value in grid.items()] + list(config.hydra.overrides.task)
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    batches = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)
    return [list(job) for batch in batches for job in batch]


def job_problem(config: DictConfig, overrides: list[str]) -> str | None:
    """Why the job with ``overrides`` would not run its method as asked, or None."""
    from hydra.core.global_hydra import GlobalHydra

    from specbench.config.checks import method_of

    job = GlobalHydra.instance().config_loader().load_sweep_config(config, overrides)
    try:
        method_of(job)
    except ConfigError as err:
        return str(err)
    return None


class SweepCheckCallback(Callback):
    """Checks every job of a basic-sweeper grid before the first one starts (see the module doc)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweeper = OmegaConf.select(config, "hydra.sweeper._target_", default="") or ""
        if sweeper != BASIC_SWEEPER:
            return
        jobs = sweep_jobs(config)
        for number, overrides in enumerate(jobs):
            problem = job_problem(config, overrides)
            if problem is not None:
                shown = " ".join(overrides) or "(no overrides)"
                print(
                    f"Config error: sweep job {number} of {len(jobs)} ({shown}): {problem}; "
                    "no job was started",
                    file=sys.stderr,
                )
                sys.exit(2)
