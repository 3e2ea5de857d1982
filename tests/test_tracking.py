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
from specbench.tracking.naming import config_params, flatten, numeric_metrics, safe_name
from specbench.tracking.run import Tracker

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


# ---- what is recorded is what ran; config errors open no run; the store is checked in seconds ------------


def test_an_alias_is_recorded_under_its_canonical_name(mlflow_uri, tmp_path):
    run_task(EvalTask(compose_config([*TINY, "dataset.limit=1", "eval.baseline=false", "method=static_en",
                                      f"eval.output_dir={tmp_path}"])))  # fmt: skip
    (run,) = runs_of(mlflow_uri)
    params, tags = run.data.params, run.data.tags
    assert (params["method.name"], params["method.draft_weight"]) == ("static_ensemble", "0.3")
    assert (tags["specbench.method"], tags["specbench.method_alias"]) == ("static_ensemble", "static_en")
    found = client(mlflow_uri).search_runs(
        [run.info.experiment_id], "params.`method.name` = 'static_ensemble'"
    )
    assert [r.info.run_id for r in found] == [run.info.run_id]  # filtering by method finds aliased runs
    assert run.info.run_name.startswith("static_ensemble")


def test_an_eval_run_logs_its_groups_as_params_and_measurements_as_metrics(mlflow_uri, tmp_path):
    metrics = run_task(EvalTask(compose_config([*TINY, "dataset.limit=1", f"eval.output_dir={tmp_path}"])))
    (run,) = runs_of(mlflow_uri)
    params, logged = run.data.params, run.data.metrics
    assert not [k for k in params if k.startswith(("train.", "synth."))]  # groups eval does not read
    assert params["schedule.gamma"] == "3" and params["gen.max_new_tokens"] == "6"
    for key in ("gamma", "max_gamma", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "batch_size",
                "num_shards", "shard_id", "num_threads"):  # fmt: skip
        assert key in metrics and key not in logged  # config values: params, not metrics
    assert logged["tau"] == pytest.approx(metrics["tau"]) and "model_load_s" in logged


def test_untrained_diversed_says_so_on_the_console_and_in_a_tag(mlflow_uri, tmp_path, capsys):
    metrics = run_task(EvalTask(compose_config([*TINY, "dataset.limit=1", "eval.baseline=false",
                                                "method=sd_en", f"eval.output_dir={tmp_path}"])))  # fmt: skip
    note = "method.head_checkpoint is null, so the DIVERSED weight head is untrained (draft weight w = 0.5"
    assert note in capsys.readouterr().out and note in metrics["untrained"]
    (run,) = runs_of(mlflow_uri)
    assert note in run.data.tags["specbench.untrained"]
    assert json.loads((tmp_path / "metrics.json").read_text())["untrained"] == metrics["untrained"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "is a directory, not a prompt file"),
        (b"", "is empty (0 bytes)"),
        (b'{"prompt": "ok"}\n{"prompt": broken\n', ":2: not valid JSON"),
        (b'{"prompt": "ok"}\n\x00\x01\x02binary', ":2: not a text file (a NUL byte at column 1)"),
    ],
)
def test_a_dataset_file_error_opens_no_run(content, message, mlflow_uri, tmp_path):
    path = tmp_path / "prompts.jsonl"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    cfg = compose_config(
        [*TINY, "dataset=jsonl", f"dataset.path={path}", f"eval.output_dir={tmp_path / 'out'}"]
    )
    with pytest.raises(ConfigError) as info:
        run_task(EvalTask(cfg))
    assert str(info.value).startswith("dataset.path") and message in str(info.value)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert runs_of(mlflow_uri) == [] and not (tmp_path / "out").exists()


def test_a_report_error_opens_no_run(mlflow_uri, tmp_path):
    from specbench.tasks.report import ReportTask

    empty = tmp_path / "no-runs-here"
    empty.mkdir()
    for overrides in ([f"task.sweep_dir={empty}"], ["task.experiment=specbench-nothing"]):
        cfg = compose_config(["task=report", *overrides, f"task.output_dir={tmp_path / 'out'}"])
        with pytest.raises(ConfigError, match="task=report: no runs"):
            run_task(ReportTask(cfg))
    assert runs_of(mlflow_uri, "specbench-report") == [] and not (tmp_path / "out").exists()


def test_a_report_run_is_named_after_the_report_and_logs_its_own_groups(mlflow_uri, tmp_path):
    from specbench.tasks.report import ReportTask

    job = tmp_path / "sweep" / "0"
    job.mkdir(parents=True)
    (job / "metrics.json").write_text(json.dumps({"method": "sd", "tau": 1.5, "acceptance_rate": 0.2}))
    cfg = compose_config(
        ["task=report", f"task.sweep_dir={tmp_path / 'sweep'}", f"task.output_dir={tmp_path / 'o'}"]
    )
    run_task(ReportTask(cfg))
    (run,) = runs_of(mlflow_uri, "specbench-report")
    assert run.info.status == "FINISHED" and run.info.run_name.startswith(f"report {tmp_path / 'sweep'}")
    assert "specbench.method" not in run.data.tags and "specbench.drafter" not in run.data.tags
    assert {k.split(".", 1)[0] for k in run.data.params} == {"task", "tracking"}


def test_run_name_heads_name_the_task_not_an_unrelated_method():
    from specbench.tasks.synth import SynthTask
    from specbench.tracking.naming import name_head

    assert name_head(compose_config(["method.name=static_en"]), "eval") == "static_ensemble"
    assert name_head(compose_config(["task=report"]), "report") == "report"
    assert name_head(compose_config(["task=synth"]), "synth") == "synth"
    assert name_head(compose_config(["task=train", "method=diversed"]), "train") == "train diversed"
    synth = SynthTask(compose_config([*TINY, "task=synth"]))
    synth.check()
    assert synth.run_name() == "synth tiny-random-llama demo"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("http://127.0.0.1:1", "tracking.uri: cannot reach the MLflow server at http://127.0.0.1:1"),
        ("foo://somewhere", "tracking.uri: unsupported tracking URI 'foo://somewhere'"),
        ("NOT_A_DB", "is not an SQLite database"),
        ("A_DIR", "is a directory, not an SQLite database file"),
        ("file:///tmp/specbench-file-store", "MLflow's retired file store"),
    ],
)
def test_a_tracking_store_mlflow_cannot_use_fails_in_seconds_naming_the_key(uri, message, tmp_path):
    import time

    if uri == "NOT_A_DB":
        uri = str(tmp_path / "notes.txt")
        Path(uri).write_text("these are notes, not a database\n")
    if uri == "A_DIR":
        uri = f"sqlite:///{tmp_path}"
    started = time.monotonic()
    proc = launch(
        [*TINY, f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'run'}"], cache_dir=tmp_path / "c"
    )
    assert time.monotonic() - started < 10, proc.stderr[-2000:]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith("Config error: tracking.uri") and message in line


def test_a_tracking_uri_from_the_environment_is_named_as_such(tmp_path):
    proc = launch([*TINY, f"hydra.run.dir={tmp_path / 'run'}"], env_extra={"MLFLOW_TRACKING_URI": "http://127.0.0.1:1"})
    assert proc.returncode == 2
    assert "tracking.uri (null, so $MLFLOW_TRACKING_URI): cannot reach the MLflow server" in proc.stderr
