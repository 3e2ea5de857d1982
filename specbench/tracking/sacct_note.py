"""Hydra callback: a SLURM cluster without job accounting is said once per sweep, not three times per poll.

submitit follows SLURM jobs with ``sacct``; on a cluster without job accounting (``AccountingStorageType``
unset, as on scripts/slurm/start_single_node.sh and many small clusters) every poll fails, sacct prints
"Slurm accounting storage is disabled" and submitit warns "Bypassing sacct error", although it sees each
job end through the result file the job writes. Registered as ``hydra.callbacks.sacct_note`` in
``conf/config.yaml``; in the submitting process of a ``submitit_slurm`` sweep it asks ``sacct`` once: when
accounting is off it says so in one line and stops submitit's polls (they could only fail); when it is on,
a later failed poll (a flaky database) is said once too, as a filter on submitit's logger.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

SACCT_WARNING = "Bypassing sacct error"
OFF_NOTE = (
    "note: SLURM job accounting is off on this cluster (sacct: {reason}); submitit follows the jobs through "
    "the "
    "result files they write instead"
)
FLAKY_NOTE = "note: a sacct poll failed ({message}); submitit goes on with the jobs' result files (said once)"


def accounting_problem(timeout_s: float = 10.0) -> str | None:
    """Why ``sacct`` cannot answer on this machine (None: it can)."""
    try:
        proc = subprocess.run(
            ["sacct", "-n", "-j", "0"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if proc.returncode == 0:
        return None
    return " ".join((proc.stderr or proc.stdout).split()) or f"exit status {proc.returncode}"


class SacctOnce(logging.Filter):
    """Drops submitit's sacct warnings; the first one is said as :data:`FLAKY_NOTE` on stderr."""

    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if SACCT_WARNING not in message:
            return True
        if not self.said:
            self.said = True
            print(
                FLAKY_NOTE.format(message=message.split(SACCT_WARNING, 1)[-1].strip(" ,.")), file=sys.stderr
            )
        return False


def quiet_sacct(logger: logging.Logger | None = None) -> SacctOnce:
    """Install the filter on submitit's logger (once) and return it."""
    logger = logger or logging.getLogger("submitit")
    for existing in logger.filters:
        if isinstance(existing, SacctOnce):
            return existing
    once = SacctOnce()
    logger.addFilter(once)
    return once


def stop_polling_sacct() -> None:
    """submitit's SLURM watcher asks sacct nothing more (it reads the jobs' result files alone)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    SlurmInfoWatcher._make_command = lambda self: None  # type: ignore[method-assign]


class SacctNoteCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        launcher = OmegaConf.select(config, "hydra.launcher._target_", default="") or ""
        if "submitit" not in launcher or "Slurm" not in launcher:
            return
        quiet_sacct()
        problem = accounting_problem()
        if problem is not None:
            print(OFF_NOTE.format(reason=problem), file=sys.stderr)
            stop_polling_sacct()
