"""Hydra callback: after a multirun whose jobs ran in other processes, print each job's results table.

With the basic launcher every job runs in this process and prints its own table. With
``hydra/launcher=submitit_local`` (or SLURM) a job's stdout goes to its log file under
``<sweep dir>/.submitit/``, so the console showed nothing; this callback reads each job's
``metrics.json`` and prints the same table, headed by the overrides that set the job apart.
It also removes the empty ``.submitit/%j`` dir submitit's local executor leaves (it creates its folder
pattern unformatted). Registered in ``conf/config.yaml`` (``hydra.callbacks.job_tables``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

IN_PROCESS_LAUNCHERS = ("BasicLauncher",)
METRICS_FILE = "metrics.json"


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job dirs of a sweep (``<sweep dir>/<job num>``), by job number."""
    if not sweep_dir.is_dir():
        return []
    jobs = [p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(jobs, key=lambda p: int(p.name))


def job_overrides(job: Path) -> list[str]:
    path = job / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    return [str(o) for o in (OmegaConf.to_container(OmegaConf.load(path)) or [])]


def job_tables(sweep_dir: Path) -> str:
    """Every job's table (eval jobs), or a line saying it left no metrics; overrides every job shares are
    printed once, above them."""
    from specbench.tasks.results import format_table

    jobs = job_dirs(sweep_dir)
    overrides = {job: job_overrides(job) for job in jobs}
    first = overrides[jobs[0]] if jobs else []
    common = [o for o in first if all(o in each for each in overrides.values())]
    blocks = [f"sweep {sweep_dir}: {len(jobs)} jobs" + (f", all with {' '.join(common)}" if common else "")]
    for job in jobs:
        own = [o for o in overrides[job] if o not in common]
        head = f"== job {job.name}: {' '.join(own) or '(no other overrides)'}"
        path = job / METRICS_FILE
        if not path.is_file():
            why = "the job failed or wrote elsewhere; see its log under .submitit/"
            blocks.append(f"{head}\nno {METRICS_FILE} ({why})")
            continue
        metrics = json.loads(path.read_text(encoding="utf-8"))
        try:
            blocks.append(f"{head}\n{format_table(metrics)}")
        except KeyError:  # not an eval job: its numbers as they are
            blocks.append(f"{head}\n" + ", ".join(f"{k} {v}" for k, v in metrics.items()))
    return "\n\n".join(blocks)


class JobTablesCallback(Callback):
    """Prints every job's table at the end of a multirun run by an out-of-process launcher."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        if launcher.rsplit(".", 1)[-1] in IN_PROCESS_LAUNCHERS:
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        remove_empty_pattern_dir(OmegaConf.select(config, "hydra.launcher.submitit_folder", default=None))
        if job_dirs(sweep_dir):
            print(job_tables(sweep_dir))


def remove_empty_pattern_dir(folder: str | None) -> None:
    """Remove ``folder`` if it is the still-unformatted submitit pattern (``.../%j``) and empty."""
    if not folder or "%" not in Path(folder).name:
        return
    path = Path(folder)
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()
