"""MLflow tracking of single runs: URI, params (long values), tags, metrics, artifacts, FAILED on a crash."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, compose_config, launch

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError
from specbench.tasks.base import run_task
from specbench.tasks.eval import EvalTask
from specbench.tracking import NULL_TRACKER, RUN_FILE, run_name, store, task_kind, task_run
from specbench.tracking.run import Tracker, config_params, flatten, numeric_metrics, safe_name

TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random", "gen.max_new_tokens=6", "dataset.limit=3"]


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def runs_of(uri: str, experiment: str = "specbench-eval") -> list:
    found = client(uri).get_experiment_by_name(experiment)
    return [] if found is None else client(uri).search_runs([found.experiment_id])


def test_importing_tracking_does_not_import_mlflow():
    code = (
        "import sys, specbench, specbench.tracking, specbench.tracking.callbacks; "
        "assert 'mlflow' not in sys.modules, 'mlflow imported'; print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_tracking_uri_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert store.default_tracking_uri() == f"sqlite:///{ROOT}/mlruns/mlflow.db"
    assert store.resolve_tracking_uri(None) == store.default_tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////from/env.db")
    assert store.resolve_tracking_uri(None) == "sqlite:////from/env.db"
    assert store.resolve_tracking_uri("http://tracking:5000") == "http://tracking:5000"  # config wins
    assert store.resolve_tracking_uri("sqlite:///rel/m.db", cwd=tmp_path) == f"sqlite:///{tmp_path}/rel/m.db"
    assert store.resolve_tracking_uri("runs/m.db", cwd=tmp_path) == f"sqlite:///{tmp_path}/runs/m.db"
    assert store.artifact_location(f"sqlite:///{tmp_path}/m.db", "specbench-eval") == (
        (tmp_path / "artifacts" / "specbench-eval").as_uri()
    )
    assert store.artifact_location("http://tracking:5000", "x") is None


def test_names_params_and_metrics_helpers():
    assert task_kind("specbench.tasks.eval.EvalTask") == "eval" and task_kind("ReportTask") == "report"
    overrides = [
        "method=static_ensemble",
        "schedule.gamma=5",
        "hydra.run.dir=/x",
        "tracking.uri=y",
        "+cluster=z",
    ]
    assert run_name("static_ensemble", overrides) == "static_ensemble method=static_ensemble schedule.gamma=5"
    assert run_name("sd", []) == "sd (defaults)"
    assert len(run_name("sd", [f"k{i}=v" for i in range(200)])) == 250
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {"a.b": 1, "a.c": [1, 2], "d": None}
    assert safe_name("a[0]=b") == "a_0__b"
    params = config_params(compose_config(TINY))
    assert params["schedule.gamma"] == "3" and params["model.verifier.kind"] == "tiny_random"
    assert params["eval.output_dir"] == "null" and params["tracking.enabled"] == "true"
    assert not any(key.startswith("hydra") for key in params)
    assert numeric_metrics({"a": 1, "b": True, "c": "x", "d": None, "e": [1], "f": 0.5}) == {
        "a": 1.0,
        "b": 1.0,
        "f": 0.5,
    }


def test_retry_waits_out_sqlite_locks(monkeypatch):
    monkeypatch.setattr(store, "LOCK_RETRY_S", 5.0)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "done"

    assert store.retry(flaky) == "done" and len(calls) == 3
    with pytest.raises(ValueError, match="other"):
        store.retry(lambda: (_ for _ in ()).throw(ValueError("other")))


def test_single_eval_run_is_tracked(mlflow_uri, tmp_path):
    import mlflow

    out = tmp_path / "out"
    note = "n" * 7000  # longer than MLflow's 6000-char param limit
    task = EvalTask(compose_config([*TINY, f"eval.output_dir={out}", f"+tracking.tags.note={note}"]))
    metrics = run_task(task)
    assert mlflow.active_run() is None and task.tracker is NULL_TRACKER

    (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FINISHED"
    assert run.info.run_id == json.loads((out / RUN_FILE).read_text())["run_id"]
    assert run.info.artifact_uri.startswith(
        (Path(mlflow_uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    )
    params, tags = run.data.params, run.data.tags
    assert params["schedule.gamma"] == "3" and params["method.name"] == "sd"
    assert params["eval.output_dir"] == str(out) and params["dataset.limit"] == "3"
    assert params["tracking.tags.note"] == "<7000 chars: see artifact params/tracking.tags.note.txt>"
    assert tags["note"] == note  # tags allow 8000 chars
    assert tags["specbench.task"] == "eval" and tags["specbench.method"] == "sd"
    assert (tags["specbench.verifier"], tags["specbench.drafter"]) == (
        "tiny-random-llama",
        "tiny-random-llama-drafter",
    )
    assert tags["specbench.shard"] == "0/1" and tags["specbench.output_dir"] == str(out.resolve())
    assert json.loads(tags["specbench.overrides"]) == []  # no Hydra here; launch.py runs record them
    assert "mlflow.parentRunId" not in tags and "specbench.sweep_dir" not in tags

    logged = run.data.metrics
    for key in ("tau", "acceptance_rate", "tokens_per_s", "new_tokens", "speedup", "num_samples"):
        assert logged[key] == pytest.approx(metrics[key])
    history = client(mlflow_uri).get_metric_history(run.info.run_id, "acceptance_by_position")
    assert [m.step for m in history] == [1, 2, 3]
    assert [m.value for m in history] == pytest.approx([metrics[f"acceptance_pos_{k}"] for k in (1, 2, 3)])

    artifacts = {a.path for a in client(mlflow_uri).list_artifacts(run.info.run_id)}
    assert {"config.yaml", "samples.jsonl", "metrics.json", "params"} <= artifacts
    local = Path(
        client(mlflow_uri).download_artifacts(run.info.run_id, "params/tracking.tags.note.txt", str(tmp_path))
    )
    assert local.read_text() == note
    samples = Path(client(mlflow_uri).download_artifacts(run.info.run_id, "samples.jsonl", str(tmp_path)))
    assert samples.read_text() == (out / "samples.jsonl").read_text()


def test_rerun_into_the_same_dir_reopens_its_run(mlflow_uri, tmp_path):
    out = tmp_path / "out"
    cfg = compose_config([*TINY, "dataset.limit=2", f"eval.output_dir={out}", "eval.baseline=false"])
    first = run_task(EvalTask(cfg))
    second = run_task(EvalTask(cfg))
    (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FINISHED" and run.data.tags["specbench.reopened"] == "true"
    assert (first["resumed_samples"], second["resumed_samples"]) == (0, 2)
    assert second["new_tokens"] == first["new_tokens"] and second["tau"] == first["tau"]
    # Starting over with another config in the same dir is a new run (MLflow params are immutable).
    changed = compose_config(
        [*TINY, "dataset.limit=2", f"eval.output_dir={out}", "eval.baseline=false"]
        + ["schedule.gamma=2", "eval.resume=false"]
    )
    run_task(EvalTask(changed))
    runs = {r.data.params["schedule.gamma"]: r for r in runs_of(mlflow_uri)}
    assert sorted(runs) == ["2", "3"] and runs["2"].info.status == "FINISHED"
    assert json.loads((out / RUN_FILE).read_text())["run_id"] == runs["2"].info.run_id


def test_crash_inside_the_run_marks_it_failed_and_reraises(mlflow_uri):
    import mlflow

    cfg = compose_config(TINY)
    with pytest.raises(RuntimeError, match="boom"), task_run(cfg, "eval") as tracker:
        assert isinstance(tracker, Tracker) and mlflow.active_run().info.run_id == tracker.run_id
        tracker.log_metrics({"partial": 1.0})
        raise RuntimeError("boom")
    assert mlflow.active_run() is None
    with pytest.raises(KeyboardInterrupt), task_run(cfg, "eval"):
        raise KeyboardInterrupt
    failed, killed = sorted(runs_of(mlflow_uri), key=lambda r: r.info.start_time)
    assert (failed.info.status, killed.info.status) == ("FAILED", "KILLED")
    assert failed.data.tags["specbench.error"] == "RuntimeError: boom"
    assert failed.data.metrics["partial"] == 1.0
    error = client(mlflow_uri).download_artifacts(failed.info.run_id, "error.txt")
    assert "RuntimeError: boom" in Path(error).read_text()


def test_config_error_opens_no_run(mlflow_uri, tmp_path):
    with pytest.raises(ConfigError, match="schedule.gamma"):
        run_task(EvalTask(compose_config([*TINY, f"eval.output_dir={tmp_path}", "schedule.gamma=0"])))
    assert runs_of(mlflow_uri) == []


@pytest.mark.parametrize("switch", ["tracking.enabled=false", "tracking=none"])
def test_tracking_can_be_switched_off(switch, tmp_path, monkeypatch):
    db = tmp_path / "never.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    with task_run(compose_config([*TINY, switch]), "eval") as tracker:
        assert tracker is NULL_TRACKER
    assert not db.exists()


def _log_from_a_process(uri: str, index: int) -> None:
    cfg = compose_config([*TINY, f"schedule.gamma={index + 1}"])
    with task_run(cfg, "eval", overrides=[f"schedule.gamma={index + 1}"]) as tracker:
        for step in range(20):
            tracker.log_metrics({"loss": 1.0 / (step + 1)}, step=step)


def test_concurrent_processes_share_one_sqlite_file(mlflow_uri):
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_log_from_a_process, args=(mlflow_uri, i)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    runs = runs_of(mlflow_uri)
    assert sorted(r.data.params["schedule.gamma"] for r in runs) == ["1", "2", "3", "4"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert all(len(client(mlflow_uri).get_metric_history(r.info.run_id, "loss")) == 20 for r in runs)


def test_launch_crash_is_a_failed_run(mlflow_uri, tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    run_dir = tmp_path / "run"
    override = f"model.verifier.path={empty}"
    proc = launch(
        [*TINY, "model.verifier.kind=local", override, "eval.baseline=false", f"hydra.run.dir={run_dir}"],
        cache_dir=tmp_path / "cache",
        timeout=300,
    )
    assert proc.returncode != 0
    (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FAILED"
    assert override in json.loads(run.data.tags["specbench.overrides"])
    assert run.info.run_name.startswith("sd model/verifier=tiny-random")
    assert run.data.params["model.verifier.kind"] == "local"
    assert "specbench.error" in run.data.tags
    assert json.loads((run_dir / RUN_FILE).read_text())["run_id"] == run.info.run_id
