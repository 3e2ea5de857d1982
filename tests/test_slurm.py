"""End to end on a real single-node SLURM: a sweep through hydra/launcher=submitit_slurm lands in MLflow
under one parent run. Needs root and scripts/slurm/start_single_node.sh (CI's .ci/run starts it);
skipped, with the reason, where SLURM cannot be started (failed instead with SPECBENCH_REQUIRE_SLURM=1)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT, design_card, launch

from specbench.tracking import PARENT_FILE, PARENT_TAG

pytestmark = pytest.mark.slurm

START = ROOT / "scripts" / "slurm" / "start_single_node.sh"


def slurm_unavailable() -> str | None:
    """Why SLURM cannot be used here, or None once the node answers (starting the daemons if needed)."""
    if shutil.which("sbatch") is None:
        if os.geteuid() != 0:
            return "SLURM is not installed and installing it needs root"
        if shutil.which("apt-get") is None:
            return "SLURM is not installed and apt-get is missing"
        return f"SLURM is not installed: run `bash {START.relative_to(ROOT)}` as root first (.ci/run does)"
    if os.geteuid() != 0:
        up = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, check=False)
        return (
            None
            if "idle" in up.stdout or "mix" in up.stdout
            else "SLURM is not up and starting it needs root"
        )
    try:  # idempotent: returns at once when the node is up, else starts munged/slurmctld/slurmd
        proc = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        return f"{START.name} did not finish in 180 s"
    if proc.returncode != 0:
        return f"{START.name} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    return None


def jobs_submitted_under(folder) -> list[str]:
    """Ids of the queued jobs whose batch script lies under `folder` (a sweep dir: submitit writes its
    scripts in `.submitit/` there). The suite runs in several workers on one cluster, so `squeue` alone
    also lists other tests' jobs."""
    rows = subprocess.run(["squeue", "-h", "-o", "%i|%o"], capture_output=True, text=True, check=True).stdout
    prefix = str(folder).rstrip("/") + "/"
    return [
        job
        for job, _, script in (row.partition("|") for row in rows.splitlines())
        if script.startswith(prefix)
    ]


@pytest.fixture(scope="module")
def slurm():
    reason = slurm_unavailable()
    if reason and os.environ.get("SPECBENCH_REQUIRE_SLURM") == "1":  # CI: a cluster that should be there
        pytest.fail(f"SPECBENCH_REQUIRE_SLURM=1 but {reason}")
    if reason:
        pytest.skip(reason)


def test_sweep_on_slurm_lands_in_mlflow_under_one_parent(slurm, mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    sweep_dir = tmp_path / "sweep"
    proc = launch(
        [
            "-m",
            "hydra/launcher=submitit_slurm",
            "+cluster=slurm-local",
            "model/verifier=tiny-random",
            "model/drafter=tiny-random",
            "gen.max_new_tokens=3",
            "dataset.limit=1",
            "eval.baseline=false",
            "eval.warmup=false",
            "runtime.num_threads=1",
            "method=static_ensemble",
            "schedule.gamma=1,2",
            "method.draft_weight=0.1,0.3",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cache_dir=tmp_path / "cache",
    )
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(sweep_dir.glob(".submitit/*/*.err")))
    assert proc.returncode == 0, proc.stderr[-3000:] + "\n--- job logs ---\n" + logs

    record = json.loads((sweep_dir / PARENT_FILE).read_text())
    assert record["tracking_uri"] == mlflow_uri
    client = MlflowClient(tracking_uri=mlflow_uri)
    parent = client.get_run(record["run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["specbench.launcher"] == "SlurmLauncher"
    assert parent.data.tags["specbench.jobs"] == "4" and parent.data.tags["specbench.failed_jobs"] == "0"
    children = client.search_runs(
        [record["experiment_id"]], filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'"
    )
    children.sort(key=lambda run: int(run.data.tags["specbench.job_num"]))
    assert len(children) == 4
    grid = [(c.data.params["schedule.gamma"], c.data.params["method.draft_weight"]) for c in children]
    assert grid == [("1", "0.1"), ("1", "0.3"), ("2", "0.1"), ("2", "0.3")]
    array_ids = {c.data.tags["specbench.slurm_job_id"] for c in children}
    assert len(array_ids) == 1  # one job array ...
    assert sorted(c.data.tags["specbench.slurm_array_task_id"] for c in children) == [
        "0",
        "1",
        "2",
        "3",
    ]  # ... 4 tasks
    for number, child in enumerate(children):
        assert child.info.status == "FINISHED"
        metrics = json.loads((sweep_dir / str(number) / "metrics.json").read_text())
        assert child.data.metrics["new_tokens"] == metrics["new_tokens"] == 3
        assert child.data.metrics["tokens_per_s"] == pytest.approx(metrics["tokens_per_s"])
        assert {a.path for a in client.list_artifacts(child.info.run_id)} >= {"samples.jsonl", "metrics.json"}
    # The jobs ran this venv's python (submitit uses sys.executable).
    submission = next(sweep_dir.glob(".submitit/*/*_submission.sh")).read_text()
    assert sys.executable in submission


def test_the_design_cards_slurm_sweep_runs_as_typed_and_says_missing_accounting_once(
    slurm, mlflow_uri, tmp_path
):
    """README's `-m ... hydra/launcher=submitit_slurm` (no cluster preset), on tiny models: one job array of
    six jobs, and on this cluster (no job accounting) one note instead of sacct warnings at every poll."""
    from specbench.tracking.sacct_note import SACCT_WARNING, accounting_problem

    slurm_sweep = design_card()[2]
    assert "hydra/launcher=submitit_slurm" in slurm_sweep
    sweep_dir = tmp_path / "sweep"
    proc = launch(
        [*slurm_sweep, "model/verifier=tiny-random", "model/drafter=tiny-random", "gen.max_new_tokens=3",
         "dataset.limit=1", "eval.baseline=false", "eval.warmup=false", "runtime.num_threads=1",
         f"hydra.sweep.dir={sweep_dir}"],
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len([p for p in sweep_dir.iterdir() if p.name.isdigit()]) == 6
    console = proc.stdout + proc.stderr
    assert SACCT_WARNING not in console and "accounting storage is disabled" not in console.replace(
        "(sacct: Slurm accounting storage is disabled)", ""
    )  # fmt: skip
    notes = console.count("note: SLURM job accounting is off on this cluster")
    assert notes == (1 if accounting_problem() else 0), console[-2000:]


def test_a_preempted_training_job_is_requeued_and_resumes_from_last_ckpt(slurm, mlflow_uri, tmp_path):
    """submitit owns USR2: SLURM's preemption signal makes it requeue the job; the rerun finds its own
    last.ckpt (same output dir) and continues to max_steps in the same MLflow run."""
    import time

    synth = tmp_path / "synth"
    tiny = ["model/verifier=tiny-random", "model/drafter=tiny-random", "runtime.num_threads=1"]
    proc = launch(["task=synth", *tiny, "dataset=demo", "synth.target_len=120", "synth.max_prompt_len=100",
                   f"synth.output_dir={synth}", f"hydra.run.dir={tmp_path / 'h'}"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out, sweep_dir = tmp_path / "train", tmp_path / "sweep"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": mlflow_uri}
    env.pop("HYDRA_FULL_ERROR", None)
    submitter = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "launch.py"),
            "-m",
            "hydra/launcher=submitit_slurm",
            "+cluster=slurm-local",
            "task=train",
            *tiny,
            "method=sd2",
            "steering=sd2",
            "steering.v_layers=[0,1,2]",
            "train.max_steps=60",
            "train.batch_size=2",
            "train.val_every_steps=100",
            "train.checkpoint_every_steps=2",
            f"train.data={synth}",
            f"train.output_dir={out}",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    last = out / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 300
    while not last.exists() and time.monotonic() < deadline and submitter.poll() is None:
        time.sleep(0.2)
    assert last.exists(), "the training job wrote no last.ckpt"
    job_ids = jobs_submitted_under(sweep_dir)
    assert len(job_ids) == 1, job_ids
    subprocess.run(["scancel", "--signal=USR2", job_ids[0]], check=True)
    output, _ = submitter.communicate(timeout=600)
    logs = "\n".join(p.read_text() for p in sorted(sweep_dir.glob(".submitit/*/*.out")))
    assert submitter.returncode == 0, output[-3000:] + logs[-3000:]
    assert "resuming from" in logs, logs[-3000:]
    assert json.loads((out / "train_metrics.json").read_text())["global_step"] == 60
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name("specbench-train")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("specbench.role") == "sweep"]
    jobs = [r for r in runs if r not in parents]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(jobs) == 1 and jobs[0].info.status == "FINISHED"  # the requeued job reopened its own run
    assert jobs[0].data.tags["specbench.reopened"] == "true"
    assert jobs[0].data.tags[PARENT_TAG] == parents[0].info.run_id
