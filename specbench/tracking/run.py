"""One MLflow run per task: params from the resolved config, tags, metrics, artifacts; FAILED on a crash.

:func:`task_run` is the context manager ``launch.py`` (through :func:`specbench.tasks.base.run_task`)
wraps around ``task.run()``. Inside a multirun it nests the run under the sweep's parent run, which
:class:`specbench.tracking.callbacks.MlflowSweepCallback` created and recorded in the sweep dir.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from specbench.tracking import signals, store
from specbench.tracking.naming import (
    METRICS_PER_BATCH,
    PARAMS_PER_BATCH,
    PARENT_FILE,
    PARENT_TAG,
    RUN_FILE,
    TAG_VALUE_MAX,
    _clip,
    config_params,
    describe_tags,
    logged_value,
    may_change_on_rerun,
    name_head,
    numeric_metrics,
    override_key,
    param_string,
    read_run_file,
    run_name,
    safe_name,
    write_run_file,
)


class NullTracker:
    """What a task logs to when tracking is off or the task runs outside ``launch.py``: nothing."""

    enabled = False
    run_id: str | None = None
    tracking_uri: str | None = None
    experiment_id: str | None = None

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        pass

    def log_metric_steps(self, key: str, values: Iterable[float], first_step: int = 1) -> None:
        pass

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        pass

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass


NULL_TRACKER = NullTracker()


class Tracker(NullTracker):
    """An open MLflow run: every call goes through the client with SQLite lock retries."""

    enabled = True

    def __init__(self, mlflow_client: Any, uri: str, experiment_id: str, run_id: str) -> None:
        self.client = mlflow_client
        self.tracking_uri = uri
        self.experiment_id = experiment_id
        self.run_id = run_id
        self._existing_params: dict[str, str] = {}

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        entries = [
            RunTag(safe_name(k), _clip(str(v), TAG_VALUE_MAX)) for k, v in tags.items() if v is not None
        ]
        for start in range(0, len(entries), PARAMS_PER_BATCH):
            store.retry(self.client.log_batch, self.run_id, tags=entries[start : start + PARAMS_PER_BATCH])

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params; a value over MLflow's limit (6000 chars) goes to ``params/<key>.txt`` instead.

        The param then reads ``<N chars: see artifact params/<key>.txt>``. Params are immutable in
        MLflow, so a reopened run keeps the values it already has.
        """
        from mlflow.entities import Param

        entries = []
        for key, value in params.items():
            key, text = safe_name(key), param_string(value)
            if key in self._existing_params:
                continue
            stored = logged_value(key, text)
            if stored != text:
                self.log_text(text, f"params/{key}.txt")
            entries.append(Param(key, stored))
            self._existing_params[key] = stored
        for start in range(0, len(entries), PARAMS_PER_BATCH):
            store.retry(self.client.log_batch, self.run_id, params=entries[start : start + PARAMS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log the numeric entries of a flat dict (others are skipped) at ``step`` (default 0)."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(k, v, now, step or 0) for k, v in numeric_metrics(metrics).items()]
        for start in range(0, len(entries), METRICS_PER_BATCH):
            store.retry(
                self.client.log_batch, self.run_id, metrics=entries[start : start + METRICS_PER_BATCH]
            )

    def log_metric_steps(self, key: str, values: Iterable[float], first_step: int = 1) -> None:
        """A step-wise metric: ``values[i]`` at step ``first_step + i`` (e.g. acceptance per position)."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        name = safe_name(key)
        entries = [Metric(name, float(v), now, first_step + i) for i, v in enumerate(values)]
        for start in range(0, len(entries), METRICS_PER_BATCH):
            store.retry(
                self.client.log_batch, self.run_id, metrics=entries[start : start + METRICS_PER_BATCH]
            )

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            store.retry(self.client.log_artifact, self.run_id, str(path), artifact_path)

    def log_artifacts(self, directory: str | Path, artifact_path: str | None = None) -> None:
        if Path(directory).is_dir():
            store.retry(self.client.log_artifacts, self.run_id, str(directory), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        store.retry(self.client.log_text, self.run_id, text, artifact_file)

    def end(self, status: str) -> None:
        store.retry(self.client.set_terminated, self.run_id, status)


def tracking_enabled(cfg: DictConfig) -> bool:
    """Whether ``cfg`` asks for an MLflow run (``tracking.enabled``, default true)."""
    return _enabled(cfg)


def _enabled(cfg: DictConfig) -> bool:
    tracking = cfg.get("tracking") if isinstance(cfg, DictConfig) else None
    return bool(tracking is None or tracking.get("enabled", True))


def _hydra() -> Any:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


def _sweep_dir(hydra: Any) -> Path | None:
    from hydra.types import RunMode

    if hydra is None or hydra.mode != RunMode.MULTIRUN:
        return None
    return (Path(hydra.runtime.cwd) / str(hydra.sweep.dir)).resolve()


def _reopen(mlflow_client: Any, record: dict | None, uri: str, params: Mapping[str, str]) -> str | None:
    """The recorded run id if it lives in this store, still exists and ran the same config (then it is
    reopened as RUNNING); None means a new run (params are immutable in MLflow)."""
    if not record or record.get("tracking_uri") != uri:
        return None
    from mlflow.exceptions import MlflowException

    try:
        run = store.retry(mlflow_client.get_run, record["run_id"])
    except MlflowException:
        return None
    if run.info.lifecycle_stage == "deleted":
        return None
    logged = run.data.params
    if any(
        logged.get(k, logged_value(k, v)) != logged_value(k, v)
        for k, v in params.items()
        if not may_change_on_rerun(k)
    ):
        return None
    store.retry(mlflow_client.update_run, run.info.run_id, status="RUNNING")
    return run.info.run_id


_checked_uris: set[str] = set()


def check_tracking(cfg: DictConfig) -> tuple[str, str]:
    """(tracking URI, the setting it came from) of ``cfg``'s run, checked (:func:`store.check_uri`) once
    per process; a ConfigError naming the setting if MLflow could not use it. No mlflow import."""
    hydra = _hydra()
    sweep_dir = _sweep_dir(hydra)
    parent = read_run_file(sweep_dir / PARENT_FILE) if sweep_dir else None
    tracking = cfg.get("tracking") or {}
    if parent:
        uri, key = parent["tracking_uri"], f"the tracking URI of the sweep ({sweep_dir / PARENT_FILE})"
    else:
        cwd = hydra.runtime.cwd if hydra is not None else None
        uri = store.resolve_tracking_uri(tracking.get("uri"), cwd)
        key = store.uri_source(tracking.get("uri"))
    if uri not in _checked_uris:
        store.check_uri(uri, key)
        _checked_uris.add(uri)
    return uri, key


@contextlib.contextmanager
def task_run(
    cfg: DictConfig,
    kind: str,
    run_dir: str | Path | None = None,
    overrides: list[str] | None = None,
    groups: Iterable[str] | None = None,
    head: str | None = None,
) -> Iterator[NullTracker]:
    """Open the MLflow run of one task and yield its :class:`Tracker` (a :class:`NullTracker` if off).

    - URI: ``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<project>/mlruns/mlflow.db``;
      inside a multirun, the parent's URI (read from ``<sweep dir>/mlflow_parent.json``). A URI MLflow
      cannot use, or a server that does not answer within seconds, is a ConfigError before any run opens.
    - Experiment ``tracking.experiment`` or ``specbench-<kind>``; run name ``head`` (default:
      :func:`name_head`) and the overrides (in a sweep: the swept ones).
    - Params: the flattened resolved config (only ``groups``, if given); tags ``specbench.*`` and, in a
      sweep, ``mlflow.parentRunId``.
    - ``run_dir/mlflow_run.json`` records the run; a rerun into the same dir (resume, requeue) reopens it.
    - Ends FINISHED, or FAILED (KILLED on SIGINT / SIGTERM) with the reason as the tag
      ``specbench.error`` if the body raises; the exception is re-raised.
    """
    if not _enabled(cfg):
        yield NULL_TRACKER
        return
    tracking = cfg.get("tracking") or {}
    hydra = _hydra()
    if overrides is None:
        overrides = list(hydra.overrides.task) if hydra is not None else []
    sweep_dir = _sweep_dir(hydra)
    parent = read_run_file(sweep_dir / PARENT_FILE) if sweep_dir else None
    uri, key = check_tracking(cfg)
    mlflow_client = store.client(uri, key)
    if parent:
        experiment_id = parent["experiment_id"]
    else:
        name = store.experiment_name(tracking.get("experiment"), kind)
        experiment_id = store.get_or_create_experiment(mlflow_client, name, uri)

    params = config_params(cfg, groups)
    record_path = Path(run_dir) / RUN_FILE if run_dir else None
    run_id = _reopen(mlflow_client, read_run_file(record_path), uri, params) if record_path else None
    tags = describe_tags(cfg, kind, overrides, groups)
    if sweep_dir is not None:
        tags["specbench.sweep_dir"] = str(sweep_dir)
        tags["specbench.job_num"] = str(hydra.job.num)
    if run_dir is not None:
        tags["specbench.output_dir"] = str(Path(run_dir).resolve())
    varying = set(parent.get("swept_keys") or []) if parent else set()
    if parent:
        tags[PARENT_TAG] = parent["run_id"]
        # sweep.<key>: this job's value of each swept key, a column to pick in the MLflow runs table
        swept = [o for o in overrides if override_key(o) in varying]
        tags.update({f"sweep.{override_key(o)}": o.split("=", 1)[1] for o in swept})
    tags.update({str(k): v for k, v in (tracking.get("tags") or {}).items()})
    if run_id is None:
        named = [o for o in overrides if override_key(o) in varying] if varying else overrides
        name = tracking.get("run_name") or run_name(head or name_head(cfg, kind), named, kind)
        run = store.retry(mlflow_client.create_run, experiment_id, run_name=name)
        run_id = run.info.run_id
    else:
        tags["specbench.reopened"] = "true"
    tracker = Tracker(mlflow_client, uri, experiment_id, run_id)
    with ending(tracker):  # from here on, every way out ends the run
        if record_path is not None:
            write_run_file(record_path, uri, experiment_id, run_id)
        tracker._existing_params = dict(store.retry(mlflow_client.get_run, run_id).data.params)
        tracker.set_tags(tags)
        tracker.log_params(params)
        if len(tags["specbench.overrides"]) > TAG_VALUE_MAX:
            tracker.log_text(tags["specbench.overrides"], "overrides.json")
        with _active(uri, run_id):
            yield tracker


@contextlib.contextmanager
def _active(uri: str, run_id: str) -> Iterator[None]:
    """Make the run MLflow's active (fluent) run, so ``mlflow.log_*`` inside the task lands in it.

    On exit it leaves the fluent stack; :func:`ending` (outside this) then sets the final status.
    """
    import mlflow

    mlflow.set_tracking_uri(uri)
    try:
        # inside the try: a signal held during start_run is raised when it returns, and the run it pushed
        # must still leave the fluent stack, or MLflow's atexit end_run marks the KILLED run FINISHED
        store.retry(mlflow.start_run, run_id=run_id, nested=mlflow.active_run() is not None)
        yield
    finally:
        active = mlflow.active_run()
        if active is not None and active.info.run_id == run_id:
            with contextlib.suppress(Exception):
                store.retry(mlflow.end_run)


def end_status(err: BaseException) -> tuple[str, str | None]:
    """(MLflow status, reason) for a task that stopped with ``err``."""
    signum = signals.received()
    if signals.preempted():
        return "KILLED", f"preempted ({signals.signal_name(signum)}): requeued; the rerun reopens this run"
    if signum is not None:
        return "KILLED", f"killed by {signals.signal_name(signum)}"
    if isinstance(err, KeyboardInterrupt):
        return "KILLED", "interrupted (KeyboardInterrupt)"
    if isinstance(err, SystemExit) and err.code in (0, None):
        return "FINISHED", None
    return "FAILED", f"{type(err).__name__}: {err}"


@contextlib.contextmanager
def ending(tracker: Tracker) -> Iterator[None]:
    """End ``tracker``'s run FINISHED, or FAILED/KILLED with the reason (tag ``specbench.error``) and the
    traceback (``error.txt``), and re-raise."""
    try:
        yield
    except BaseException as err:
        status, reason = end_status(err)
        with contextlib.suppress(Exception):  # never hide the task's own error
            if reason is not None:
                tracker.set_tags({"specbench.error": reason[:1000]})
                tracker.log_text("".join(traceback.format_exception(err)), "error.txt")
        try:
            tracker.end(status)
        except Exception as end_err:  # noqa: BLE001 - store unreachable; keep the task's error
            print(f"warning: could not mark MLflow run {tracker.run_id} {status}: {end_err}", file=sys.stderr)
        else:
            if status != "FINISHED":
                print(f"MLflow run {tracker.run_id} ended {status}: {reason}", file=sys.stderr)
        raise
    tracker.end("FINISHED")
