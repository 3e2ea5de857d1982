"""Hydra callback: when a multirun stops, the ``task=report`` comparison of its jobs, into the sweep dir and
onto the sweep's parent MLflow run.

``<sweep dir>/report/`` gets ``report.md``, ``report.csv`` and the plots (from the jobs' files, so it is
written with tracking off too, and then says that nothing went to MLflow); with tracking on they become the
parent run's artifacts under ``report/``. A sweep that stops early (a failed job, Ctrl-C, SIGTERM) is
reported at exit with the jobs that finished, naming those that did not. Registered in ``conf/config.yaml``
(``hydra.callbacks.sweep_report``) after ``mlflow_sweep``, so this runs first and the parent is still open.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from specbench.tracking import PARENT_FILE, store
from specbench.tracking.naming import read_run_file
from specbench.tracking.sweep_summary import expected_jobs

REPORT_DIR = "report"
NO_TRACKING_NOTE = (
    "tracking is off (tracking=none or tracking.enabled=false): nothing of this sweep went to MLflow; "
    "these files and the job dirs are the only record"
)


def write_sweep_report(sweep_dir: Path, tracking_on: bool, job_count: int | None = None) -> Any:
    """Write ``<sweep dir>/report/`` from the finished jobs' files and attach it to the parent run (if
    tracking is on); returns the :class:`specbench.reporting.Report`, or None when no job finished."""
    from specbench.reporting import NoRunsError, load_sweep_dir, write_report

    try:
        selection = load_sweep_dir(sweep_dir)
    except NoRunsError as err:
        print(f"note: no sweep report: {err}", file=sys.stderr)
        return None
    started = {p.name for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()}
    never = [str(n) for n in range(job_count or 0) if str(n) not in started]
    if never:
        selection.notes.append(f"jobs that never started (the sweep stopped first): {', '.join(never)}")
    if not tracking_on:
        selection.notes.append(NO_TRACKING_NOTE)
    report = write_report(selection, sweep_dir / REPORT_DIR, title=f"specbench sweep {sweep_dir.name}")
    parent = read_run_file(sweep_dir / PARENT_FILE) if tracking_on else None
    if parent is not None:
        client = store.client(parent["tracking_uri"])
        for path in report.files:
            store.retry(client.log_artifact, parent["run_id"], str(path), REPORT_DIR)
    where = f", and on MLflow run {parent['run_id']}" if parent else " (nothing went to MLflow)"
    print(f"sweep report: {report.markdown} ({len(report.table)} runs){where}", file=sys.stderr)
    return report


class SweepReportCallback(Callback):
    """Writes the sweep's report when the multirun ends, or at exit if it stopped early."""

    def __init__(self) -> None:
        self.pending: dict | None = None  # {"sweep_dir", "tracking_on", "jobs"} until written
        self._registered = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        target = OmegaConf.select(config, "task._target_", default="") or ""
        if target.endswith("ReportTask"):
            return  # a sweep of reports has nothing to compare
        overrides = list(config.hydra.overrides.task)
        in_config = OmegaConf.select(config, "hydra.sweeper.params", default=None)
        sweeper = OmegaConf.select(config, "hydra.sweeper._target_", default="") or ""
        jobs = expected_jobs(overrides, in_config, sweeper)
        self.pending = {
            "sweep_dir": str(Path(str(config.hydra.sweep.dir)).resolve()),
            "tracking_on": bool(OmegaConf.select(config, "tracking.enabled", default=True)),
            "jobs": None if jobs is None else len(jobs),
        }
        if not self._registered:
            atexit.register(self._write_if_pending)
            self._registered = True

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._write_if_pending()

    def _write_if_pending(self) -> None:
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        try:
            write_sweep_report(Path(pending["sweep_dir"]), pending["tracking_on"], pending["jobs"])
        except Exception as err:  # noqa: BLE001 - a report must never hide the sweep's own outcome
            print(f"warning: the sweep report failed: {type(err).__name__}: {err}", file=sys.stderr)
