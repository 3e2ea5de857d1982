"""Every way a launch.py run ends closes its MLflow run with a status and a reason: SIGTERM and SIGINT
(sent for real to a real launch.py process), an exception before and after the first sample, and an
output dir that cannot be written (caught before any run opens)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT

TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random", "eval.warmup=false", "eval.baseline=false"]


def runs_of(uri: str, experiment: str = "specbench-eval") -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    """``python launch.py ARGS`` in the background (offline, the test's MLflow store from the env)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPECBENCH_CACHE": str(tmp_path / "cache")}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until ``path`` exists and is not empty (or the process ended: then the test fails with its stderr)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and path.stat().st_size > 0:
            return
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"launch.py ended (rc {proc.returncode}) before {path} appeared:\n{err[-3000:]}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"{path} did not appear within {timeout} s")


@pytest.mark.parametrize(
    ("signum", "code", "moment"),
    [
        (signal.SIGTERM, 143, "after the first sample"),
        (signal.SIGINT, 130, "after the first sample"),
        (signal.SIGTERM, 143, "before the first sample"),
    ],
)
def test_a_signal_ends_the_run_killed_with_the_signal_as_reason(signum, code, moment, mlflow_uri, tmp_path):
    out = tmp_path / "out"
    # 8 prompts x 48 tokens take seconds: the signal comes while the run decodes (or loads). Before the first
    # sample the signal follows the run file by milliseconds, but the tiny models can finish the whole run
    # in that time on a loaded machine (the signal then lands after the run ended FINISHED): 192 tokens.
    tokens = 192 if moment == "before the first sample" else 48
    args = [*TINY, f"gen.max_new_tokens={tokens}", f"eval.output_dir={out}", f"hydra.run.dir={tmp_path}/h"]
    proc = start(args, tmp_path)
    # mlflow_run.json is written the moment the run opens, samples.jsonl after the first decoded batch.
    wait_for(out / ("samples.jsonl" if moment == "after the first sample" else "mlflow_run.json"), proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-3000:]
    name = signal.Signals(signum).name
    assert f"Stopped by {name}." in err and "Traceback" not in err
    (run,) = runs_of(mlflow_uri)
    assert run.info.status == "KILLED"
    assert run.data.tags["specbench.error"] == f"killed by {name}"
    assert run.info.run_id == json.loads((out / "mlflow_run.json").read_text())["run_id"]
    assert not (out / "metrics.json").exists()  # it stopped, it did not finish


def test_an_exception_before_the_first_sample_fails_the_run_with_its_reason(mlflow_uri, tmp_path):
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()  # exists (validation passes), but the loader cannot read it
    out = tmp_path / "out"
    proc = start(
        [*TINY, "model.verifier.kind=local", f"model.verifier.path={not_a_model}", f"eval.output_dir={out}",
         f"hydra.run.dir={tmp_path / 'h'}"],
        tmp_path,
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FAILED"
    assert str(not_a_model) in run.data.tags["specbench.error"]
    assert not (out / "samples.jsonl").exists()


def test_an_exception_after_the_first_sample_fails_the_run_with_one_line(mlflow_uri, tmp_path):
    out = tmp_path / "out"
    (out / "metrics.json").mkdir(parents=True)  # the last file the run writes cannot be written
    proc = start([*TINY, "gen.max_new_tokens=4", "dataset.limit=2", f"eval.output_dir={out}",
                  f"hydra.run.dir={tmp_path / 'h'}"], tmp_path)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2  # decoding had finished
    assert f"Error: {out / 'metrics.json'}: Is a directory" in err and "Traceback" not in err
    (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FAILED"
    assert run.data.tags["specbench.error"].startswith("IsADirectoryError")


def test_an_unwritable_output_dir_is_one_line_and_opens_no_run(mlflow_uri, tmp_path):
    started = time.monotonic()
    proc = start([*TINY, "eval.output_dir=/proc/x", f"hydra.run.dir={tmp_path / 'h'}"], tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("Config error: eval.output_dir: cannot write to '/proc/x'")
    assert runs_of(mlflow_uri) == []  # caught before the run would open, and before any model loads
    assert time.monotonic() - started < 60


def test_a_signal_during_a_sweep_ends_the_job_and_its_parent_killed(mlflow_uri, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = start(["-m", *TINY, "gen.max_new_tokens=48", "schedule.gamma=1,2", f"hydra.sweep.dir={sweep_dir}"],
                 tmp_path)
    wait_for(sweep_dir / "0" / "samples.jsonl", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    record = json.loads((sweep_dir / "mlflow_parent.json").read_text())
    runs = {run.info.run_id: run for run in runs_of(mlflow_uri)}
    parent = runs.pop(record["run_id"])
    assert parent.info.status == "KILLED"
    assert parent.data.tags["specbench.error"] == "the sweep was killed by SIGTERM"
    (child,) = runs.values()  # job 1 never started
    assert child.info.status == "KILLED" and child.data.tags["mlflow.parentRunId"] == record["run_id"]


def test_sigterm_during_lightning_training_ends_the_run_killed(mlflow_uri, tmp_path):
    """Lightning chains its own SIGTERM handler after ours and exits with SystemExit(1): still KILLED, 143."""
    data = tmp_path / "say.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": f"Say {w}", "reference": w}) + "\n"
                            for i, w in enumerate(["hello", "cat", "dog", "red", "sun", "sky"])))  # fmt: skip
    out = tmp_path / "train"
    proc = start(
        ["task=train", "model/verifier=tiny-random", "model/drafter=tiny-random", "method=diversed",
         "dataset=jsonl", f"dataset.path={data}", "dataset.metric=bleu", "gen.max_new_tokens=6",
         "train.max_steps=5000", "train.batch_size=2", "train.val_every_steps=1000",
         "train.checkpoint_every_steps=1", f"train.output_dir={out}", f"hydra.run.dir={tmp_path / 'h'}"],
        tmp_path,
    )  # fmt: skip
    wait_for(out / "checkpoints" / "last.ckpt", proc)  # training is under way
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    (run,) = runs_of(mlflow_uri, "specbench-train")
    assert run.info.status == "KILLED" and run.data.tags["specbench.error"] == "killed by SIGTERM"


@pytest.mark.slurm
def test_scancel_of_a_slurm_job_ends_its_run_killed_and_the_submitter_learns_it(mlflow_uri, tmp_path):
    """scancel sends SIGTERM (then SIGKILL): the job's run ends KILLED, and the job's result says it was
    killed, so the submitting process stops waiting (it failed, exit 1) instead of polling forever."""
    from test_slurm import jobs_submitted_under, slurm_unavailable

    reason = slurm_unavailable()
    if reason and os.environ.get("SPECBENCH_REQUIRE_SLURM") == "1":
        pytest.fail(f"SPECBENCH_REQUIRE_SLURM=1 but {reason}")
    if reason:
        pytest.skip(reason)
    sweep_dir = tmp_path / "sweep"
    proc = start(["-m", "hydra/launcher=submitit_slurm", "+cluster=slurm-local", *TINY,
                  "gen.max_new_tokens=64", "schedule.gamma=2",
                  f"hydra.sweep.dir={sweep_dir}"], tmp_path)  # fmt: skip
    wait_for(sweep_dir / "0" / "samples.jsonl", proc, timeout=300)
    (job_id,) = jobs_submitted_under(sweep_dir)
    subprocess.run(["scancel", job_id], check=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "JobKilled: stopped by SIGTERM" in err, err[-3000:]
    record = json.loads((sweep_dir / "mlflow_parent.json").read_text())
    runs = {run.info.run_id: run for run in runs_of(mlflow_uri)}
    assert runs.pop(record["run_id"]).info.status == "FAILED"
    (job,) = runs.values()
    assert job.info.status == "KILLED" and job.data.tags["specbench.error"] == "killed by SIGTERM"
