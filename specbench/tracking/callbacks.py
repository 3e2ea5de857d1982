"""Hydra callback: one parent MLflow run per multirun; every job's run nests under it.

Registered in ``conf/config.yaml`` (``hydra.callbacks.mlflow_sweep``). ``on_multirun_start`` runs in the
process that launches the sweep (before any job, with any launcher): it creates the parent run and
writes ``<sweep dir>/mlflow_parent.json`` (tracking URI, experiment id, run id). Each job, in this
process (basic launcher) or in another one (``submitit_local``, ``submitit_slurm`` on any node that
sees the sweep dir), reads that file in :func:`specbench.tracking.run.task_run` and tags its run
``mlflow.parentRunId``. The parent carries the sweep (:mod:`specbench.tracking.sweep_summary`): the swept
axes as params from the start; when the sweep stops, the settings its jobs share, the best child on each
headline metric, the jobs that did not finish and a table of every job. ``on_multirun_end`` ends the parent
FINISHED, or FAILED when a child failed. Hydra skips ``on_multirun_end`` when a job raised (the sweeper
re-raises the job's error), so an ``atexit`` hook summarizes and ends a parent left open FAILED (KILLED on a
signal).

The instance is pickled into submitit jobs with Hydra's context: it only holds plain values.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from specbench.errors import ConfigError
from specbench.tracking import signals, store, ui_view
from specbench.tracking.naming import (
    PARENT_FILE,
    PARENT_TAG,
    name_head,
    override_key,
    read_run_file,
    run_name,
    swept_keys,
    task_kind,
    write_run_file,
)
from specbench.tracking.run import Tracker
from specbench.tracking.sweep_summary import AXES_PARAM, expected_jobs, summarize_sweep, sweep_axes

UNFINISHED = ("FAILED", "KILLED", "RUNNING", "SCHEDULED")
SUBMITTER_HOST = "specbench.submitter_host"
SUBMITTER_PID = "specbench.submitter_pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def close_orphaned_sweeps(client: Any, experiment_ids: list[str]) -> list[str]:
    """Mark KILLED the RUNNING sweep parents of this host whose submitting process is gone.

    A submitter killed with SIGKILL (or a lost node) runs no exit hook, so its parent run would stay
    RUNNING forever; the next sweep (or report) from the same host closes it. Returns the run ids closed.
    """
    host = socket.gethostname()
    runs = store.retry(
        client.search_runs,
        experiment_ids,
        filter_string="attributes.status = 'RUNNING' and tags.`specbench.role` = 'sweep' "
        f"and tags.`{SUBMITTER_HOST}` = '{host}'",
        max_results=1000,
    )
    closed = []
    for run in runs:
        pid = run.data.tags.get(SUBMITTER_PID, "")
        if not pid.isdigit() or _alive(int(pid)):
            continue
        message = (
            f"the submitting process (pid {pid} on {host}) died without ending this sweep; closed by a later "
            "launch"
        )
        doomed = [run]
        if run.data.tags.get("specbench.launcher") == "BasicLauncher":  # its jobs ran in that process too
            doomed += store.retry(
                client.search_runs,
                [run.info.experiment_id],
                filter_string=f"attributes.status = 'RUNNING' and tags.`{PARENT_TAG}` = '{run.info.run_id}'",
            )
        for each in doomed:
            with contextlib.suppress(Exception):
                store.retry(client.set_tag, each.info.run_id, "specbench.error", message)
                store.retry(client.set_terminated, each.info.run_id, "KILLED")
                closed.append(each.info.run_id)
    return closed


class MlflowSweepCallback(Callback):
    """Creates, records and ends the parent MLflow run of a multirun (no-op when tracking is off)."""

    def __init__(self) -> None:
        self.parent: dict | None = None  # {"tracking_uri", "experiment_id", "run_id"} while open
        self._registered = False

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        tracking = config.get("tracking")
        if tracking is not None and not tracking.get("enabled", True):
            return
        try:
            self._start(config, tracking or {})
        except ConfigError as err:  # an unusable tracking store: one line, before any job starts
            print(f"Config error: {err}", file=sys.stderr)
            sys.exit(2)

    def _start(self, config: DictConfig, tracking: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        target = OmegaConf.select(config, "task._target_", default="") or ""
        kind = task_kind(target)
        uri = store.resolve_tracking_uri(tracking.get("uri"))
        key = store.uri_source(tracking.get("uri"))
        store.check_uri(uri, key)
        client = store.client(uri, key)
        experiment_id = store.get_or_create_experiment(
            client, store.experiment_name(tracking.get("experiment"), kind), uri
        )
        record_path = sweep_dir / PARENT_FILE
        close_orphaned_sweeps(client, [experiment_id])
        run_id = self._reopen(client, read_run_file(record_path), uri)
        overrides = list(config.hydra.overrides.task)
        varying = swept_keys(overrides)
        in_config = OmegaConf.select(config, "hydra.sweeper.params", default=None)  # a grid set by a preset
        varying += [str(key) for key in (in_config or {}) if str(key) not in varying]
        if run_id is None:
            named = [o for o in overrides if override_key(o) in varying] or overrides
            name = tracking.get("run_name") or "sweep " + run_name(name_head(config, kind), named, kind)
            run_id = store.retry(client.create_run, experiment_id, run_name=name[:250]).info.run_id
        launcher = OmegaConf.select(config, "hydra.launcher._target_", default="") or ""
        tags = {
            "specbench.task": kind,
            "specbench.role": "sweep",
            "specbench.sweep_dir": str(sweep_dir),
            "specbench.overrides": json.dumps(overrides),
            "specbench.launcher": launcher.rsplit(".", 1)[-1],
            "specbench.command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            SUBMITTER_HOST: socket.gethostname(),
            SUBMITTER_PID: str(os.getpid()),
        }
        tags.update({str(k): str(v) for k, v in (tracking.get("tags") or {}).items()})
        for key, value in tags.items():
            store.retry(client.set_tag, run_id, key, value[:8000])
        write_run_file(record_path, uri, experiment_id, run_id, swept_keys=varying)
        axes = sweep_axes(overrides, in_config)
        self._log_axes(client, uri, experiment_id, run_id, axes)
        sweeper = OmegaConf.select(config, "hydra.sweeper._target_", default="") or ""
        self.parent = {"tracking_uri": uri, "experiment_id": experiment_id, "run_id": run_id, "axes": axes}
        self.parent["jobs"] = expected_jobs(overrides, in_config, sweeper)
        if not self._registered:
            atexit.register(self._end_if_open)
            self._registered = True
        print(f"MLflow parent run {run_id} ({uri}); jobs nest under it", file=sys.stderr)

    @staticmethod
    def _log_axes(client: Any, uri: str, experiment_id: str, run_id: str, axes: dict[str, str]) -> None:
        """The swept axes as the parent's params, a runs-table view of them, the experiment as one of runs."""
        tracker = Tracker(client, uri, experiment_id, run_id)
        tracker._existing_params = dict(store.retry(client.get_run, run_id).data.params)
        # under the children's own param names, so the runs table shows the grid in the children's columns
        tracker.log_params({**axes, AXES_PARAM: ", ".join(axes)})
        ui_view.mark_runs_experiment(client, experiment_id)
        ui_view.share_sweep_view(client, experiment_id, run_id, axes)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.parent is None:
            return
        parent, self.parent = self.parent, None
        client = store.client(parent["tracking_uri"])
        children = summarize_sweep(client, parent, parent.get("jobs"), parent.get("axes") or {}).children
        bad = [run for run in children if run.info.status in UNFINISHED]
        store.retry(client.set_tag, parent["run_id"], "specbench.jobs", str(len(children)))
        store.retry(client.set_tag, parent["run_id"], "specbench.failed_jobs", str(len(bad)))
        multirun_yaml = Path(str(config.hydra.sweep.dir)) / "multirun.yaml"
        if multirun_yaml.is_file():
            store.retry(client.log_artifact, parent["run_id"], str(multirun_yaml))
        store.retry(client.set_terminated, parent["run_id"], "FAILED" if bad else "FINISHED")
        print(where_to_compare(parent), file=sys.stderr)

    def _end_if_open(self) -> None:
        """At exit: a parent still open means the sweep stopped on an error, or on SIGINT / SIGTERM."""
        if self.parent is None:
            return
        parent, self.parent = self.parent, None
        signum = signals.received()
        status, reason = ("FAILED", "the sweep ended with an error")
        if signum is not None:
            status, reason = ("KILLED", f"the sweep was killed by {signals.signal_name(signum)}")
        with contextlib.suppress(Exception):
            client = store.client(parent["tracking_uri"])
            summarize_sweep(client, parent, parent.get("jobs"), parent.get("axes") or {})
        with contextlib.suppress(Exception):
            client = store.client(parent["tracking_uri"])
            store.retry(client.set_tag, parent["run_id"], "specbench.error", reason)
            store.retry(client.set_terminated, parent["run_id"], status)

    @staticmethod
    def _reopen(client: Any, record: dict | None, uri: str) -> str | None:
        """A rerun into the same sweep dir reuses its parent run."""
        if not record or record.get("tracking_uri") != uri:
            return None
        from mlflow.exceptions import MlflowException

        try:
            run = store.retry(client.get_run, record["run_id"])
        except MlflowException:
            return None
        if run.info.lifecycle_stage == "deleted":
            return None
        store.retry(client.update_run, run.info.run_id, status="RUNNING")
        return run.info.run_id


def where_to_compare(parent: dict) -> str:
    """The console line that says how to open the sweep's comparison in the MLflow UI."""
    uri = parent["tracking_uri"]
    if uri.startswith(("http://", "https://")):
        base, serve = uri.rstrip("/"), ""
    else:
        base, serve = ui_view.DEFAULT_UI, f"mlflow ui --backend-store-uri {uri}, then open "
    experiment_id, run_id = parent["experiment_id"], parent["run_id"]
    return (
        f"Compare the sweep in the MLflow UI: {serve}{base}{ui_view.run_page_path(experiment_id, run_id)} "
        f"(the parent run) or {base}{ui_view.runs_table_path(experiment_id, ui_view.share_key(run_id))} "
        "(its experiment's runs table)"
    )
