"""Multiruns (basic and submitit_local launchers) nest their jobs under one parent MLflow run;
data-parallel shards; a rerun into the same output dir (requeue) resumes without redoing samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import compose_config, launch

import specbench.config  # noqa: F401  (registers the schemas)
import specbench.tasks.eval as eval_module
from specbench.config import ConfigError, validate
from specbench.decoding import DraftSchedule, GenerationSettings, VerificationRule
from specbench.evaluation import build_engines, compare, shard_indices, summarize_samples
from specbench.models import ModelSpec, load_verifier
from specbench.pairs import load_drafter
from specbench.tasks.eval import EvalTask
from specbench.tasks.eval_files import SampleWriter, read_samples
from specbench.tracking import PARENT_FILE, PARENT_TAG

TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random"]
# The smallest jobs that still decode: 1 prompt, 3 tokens, no baseline or warm-up, one thread.
SMALL = [
    *TINY,
    "gen.max_new_tokens=3",
    "dataset.limit=1",
    "eval.baseline=false",
    "eval.warmup=false",
    "runtime.num_threads=1",
]


def sweep_runs(sweep_dir: Path):
    """(parent run, child runs) of a multirun, found through the sweep dir's parent record."""
    from mlflow.tracking import MlflowClient

    record = json.loads((sweep_dir / PARENT_FILE).read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    parent = client.get_run(record["run_id"])
    children = client.search_runs(
        [record["experiment_id"]], filter_string=f"tags.`{PARENT_TAG}` = '{record['run_id']}'"
    )
    return parent, sorted(children, key=lambda r: int(r.data.tags["specbench.job_num"]))


def check_nested(sweep_dir: Path, mlflow_uri: str, jobs: int):
    parent, children = sweep_runs(sweep_dir)
    assert json.loads((sweep_dir / PARENT_FILE).read_text())["tracking_uri"] == mlflow_uri
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["specbench.role"] == "sweep" and parent.data.tags["specbench.jobs"] == str(jobs)
    assert parent.data.tags["specbench.sweep_dir"] == str(sweep_dir)
    assert len(children) == jobs
    for number, child in enumerate(children):
        assert child.info.status == "FINISHED"
        assert child.data.tags["specbench.sweep_dir"] == str(sweep_dir)
        assert child.data.tags["specbench.output_dir"] == str(sweep_dir / str(number))
        metrics = json.loads((sweep_dir / str(number) / "metrics.json").read_text())
        assert child.data.metrics["tokens_per_s"] == pytest.approx(metrics["tokens_per_s"])
        assert child.data.metrics["new_tokens"] == metrics["new_tokens"] == 3
    return parent, children


def test_basic_multirun_nests_every_job_under_one_parent(mlflow_uri, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = launch(
        [
            "-m",
            *SMALL,
            "schedule.gamma=1,2",
            "method=static_ensemble",
            "method.draft_weight=0.1,0.3",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cache_dir=tmp_path / "cache",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent, children = check_nested(sweep_dir, mlflow_uri, jobs=4)
    assert parent.data.tags["specbench.launcher"] == "BasicLauncher"
    assert parent.info.run_name == "sweep static_ensemble schedule.gamma=1,2 method.draft_weight=0.1,0.3"
    grid = [(c.data.params["schedule.gamma"], c.data.params["method.draft_weight"]) for c in children]
    assert grid == [("1", "0.1"), ("1", "0.3"), ("2", "0.1"), ("2", "0.3")]
    assert children[3].info.run_name == "static_ensemble schedule.gamma=2 method.draft_weight=0.3"
    assert "schedule.gamma=2" in json.loads(children[3].data.tags["specbench.overrides"])
    assert all(c.data.params["method.name"] == "static_ensemble" for c in children)
    check_parent_carries_the_sweep(parent, children, sweep_dir)


def check_parent_carries_the_sweep(parent, children, sweep_dir: Path):
    """The parent holds the grid, the shared settings, the best child per headline metric, a table of every
    job and the task=report files; each child is tagged with its own value of each swept key."""
    from mlflow.tracking import MlflowClient

    from specbench.tracking.headline import HEADLINE_METRICS

    params = parent.data.params
    assert params["schedule.gamma"] == "1,2" and params["method.draft_weight"] == "0.1,0.3"
    assert params["sweep.axes"] == "schedule.gamma, method.draft_weight"
    assert params["verifier"] == children[0].data.tags["specbench.verifier"] == "tiny-random-llama"
    assert params["dataset"] == "demo" and params["dtype"] == children[0].data.tags["specbench.dtype"]
    for child in children:
        assert child.data.tags["sweep.schedule.gamma"] == child.data.params["schedule.gamma"]
        assert child.data.tags["sweep.method.draft_weight"] == child.data.params["method.draft_weight"]
    measured = [name for name in HEADLINE_METRICS if name in children[0].data.metrics]
    assert measured == ["tau", "tokens_per_s"]  # no baseline ran: no speedup, no match with greedy
    assert not {"speedup", "baseline_match_rate"} & parent.data.metrics.keys()
    for name in measured:
        best = max(children, key=lambda c: c.data.metrics[name])
        assert parent.data.metrics[name] == best.data.metrics[name]
        job = int(parent.data.metrics[f"best_job/{name}"])
        assert children[job].data.metrics[name] == best.data.metrics[name]
        assert parent.data.tags[f"specbench.best.{name}"] == f"job {job}: {children[job].info.run_name}"
    assert parent.data.tags["specbench.unfinished_jobs"] == "none"
    description = parent.data.tags["mlflow.note.content"]
    assert "4 of 4 jobs finished" in description
    for child in children:
        link = f"#/experiments/{child.info.experiment_id}/runs/{child.info.run_id}"
        assert f"[{child.info.run_name}]({link}" in description
    record = json.loads((sweep_dir / PARENT_FILE).read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    logged = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report.md", "report.csv", "acceptance_speedup_vs_gamma.png"} <= logged
    assert (sweep_dir / "report" / "report.md").read_text().count("| static_ensemble |") == 4
    experiment = client.get_experiment(record["experiment_id"])
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(experiment.tags[f"mlflow.sharedViewState.specbench-sweep-{parent.info.run_id}"])
    assert view["selectedColumns"][:2] == ["metrics.`tau`", "metrics.`tokens_per_s`"]
    assert "params.`schedule.gamma`" in view["selectedColumns"]


def test_submitit_local_multirun_nests_jobs_from_other_processes(mlflow_uri, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = launch(
        [
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=5",
            *SMALL,
            "schedule.gamma=1,2",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cache_dir=tmp_path / "cache",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent, children = check_nested(sweep_dir, mlflow_uri, jobs=2)
    assert parent.data.tags["specbench.launcher"] == "LocalLauncher"
    assert [c.data.params["schedule.gamma"] for c in children] == ["1", "2"]
    assert (sweep_dir / ".submitit").is_dir()
    assert not (sweep_dir / ".submitit" / "%j").exists()  # the pattern dir submitit's local executor left
    # Jobs print into their log files; the submitter prints each job's table, headed by what sets it apart.
    for number, gamma in ((0, 1), (1, 2)):
        head = f"== job {number}: schedule.gamma={gamma}\n"
        assert head in proc.stdout, proc.stdout[-3000:]
        assert proc.stdout.split(head, 1)[1].splitlines()[2].startswith(f"sd (constant, gamma={gamma})")


def test_a_failed_job_fails_the_parent(mlflow_uri, tmp_path):
    sweep_dir = tmp_path / "sweep"
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    proc = launch(
        [
            "-m",
            *SMALL,
            "model.verifier.kind=local,tiny_random",  # job 0 passes validation, then fails to load
            f"model.verifier.path={empty}",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cache_dir=tmp_path / "cache",
        timeout=300,
    )
    assert proc.returncode != 0
    parent, children = sweep_runs(sweep_dir)
    assert parent.info.status == "FAILED"
    assert [c.info.status for c in children] == ["FAILED", "FINISHED"]  # job 1 still ran
    # What finished is still compared, and the parent names the job that did not.
    assert parent.data.tags["specbench.unfinished_jobs"] == "job 0 (model.verifier.kind=local): FAILED"
    assert parent.data.metrics["tau"] == children[1].data.metrics["tau"]
    assert parent.data.metrics["best_job/tau"] == 1
    assert "1 of 2 jobs finished; did not finish: job 0" in parent.data.tags["mlflow.note.content"]
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "1 runs from" in report
    assert "jobs without metrics.json (failed or still running), left out: 0" in report


def test_a_sweep_without_tracking_still_writes_its_report(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = launch(
        ["-m", *SMALL, "tracking=none", "schedule.gamma=1,2", f"hydra.sweep.dir={sweep_dir}"],
        cache_dir=tmp_path / "cache",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (sweep_dir / PARENT_FILE).exists()
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "2 runs from" in report and "nothing of this sweep went to MLflow" in report
    assert "(nothing went to MLflow)" in proc.stderr
    assert "Compare the sweep in the MLflow UI" not in proc.stderr


def test_a_cancelled_sweep_logs_what_finished_and_names_the_rest(mlflow_uri, tmp_path):
    """SIGTERM to the submitter after its first job: the parent ends KILLED, compares the finished job,
    lists the jobs that never ran, and carries the report of what finished."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers import ROOT

    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": mlflow_uri}
    env.pop("HYDRA_FULL_ERROR", None)
    args = [*TINY, "gen.max_new_tokens=64", "eval.baseline=false", "runtime.num_threads=1"]
    args.append("gen.seed=0,1,2,3,4,5")
    submitter = subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), "-m", *args, f"hydra.sweep.dir={sweep_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        def job_finished() -> bool:
            if not (sweep_dir / "0" / "metrics.json").exists():
                return False
            return any(c.info.status == "FINISHED" for c in sweep_runs(sweep_dir)[1])

        while not job_finished() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert job_finished(), "job 0 never finished"
    finally:
        submitter.send_signal(signal.SIGTERM)
        _, err = submitter.communicate(timeout=120)
    parent, children = sweep_runs(sweep_dir)
    assert parent.info.status == "KILLED", err[-2000:]
    finished = [c for c in children if c.info.status == "FINISHED"]
    assert finished and parent.data.metrics["tau"] == max(c.data.metrics["tau"] for c in finished)
    unfinished = parent.data.tags["specbench.unfinished_jobs"]
    assert "job 5 (gen.seed=5): not started" in unfinished
    assert f"{len(finished)} of 6 jobs finished" in parent.data.tags["mlflow.note.content"]
    report = (sweep_dir / "report" / "report.md").read_text()
    assert f"{len(finished)} runs from" in report and "jobs that never started" in report


# --- data-parallel shards -------------------------------------------------------------------------


def test_shard_indices_partition_every_position_once():
    for count in (0, 1, 5, 17):
        for shards in (1, 2, 3, 7):
            parts = [shard_indices(count, shards, s) for s in range(shards)]
            assert sorted(i for part in parts for i in part) == list(range(count))
    assert shard_indices(7, 3, 1) == [1, 4]
    with pytest.raises(ValueError):
        shard_indices(5, 2, 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["eval.num_shards=0"], "eval.num_shards"),
        (["eval.num_shards=2", "eval.shard_id=2"], "eval.shard_id"),
        (["eval.shard_id=-1"], "eval.shard_id"),
    ],
)
def test_bad_shards_fail_validation(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_config([*TINY, *overrides]))


def test_shards_split_the_prompts(tmp_path):
    ids = []
    for shard in (0, 1):
        out = tmp_path / f"shard{shard}"
        cfg = [
            *SMALL,
            "dataset.limit=5",
            "eval.num_shards=2",
            f"eval.shard_id={shard}",
            f"eval.output_dir={out}",
        ]
        metrics = EvalTask(compose_config(cfg)).run()
        assert (metrics["num_shards"], metrics["shard_id"], metrics["num_samples"]) == (2, shard, 3 - shard)
        rows = read_samples(out / "samples.jsonl")
        assert [r["index"] for r in rows] == list(range(shard, 5, 2))
        ids += [r["id"] for r in rows]
    everything = EvalTask(
        compose_config([*SMALL, "dataset.limit=5", f"eval.output_dir={tmp_path / 'all'}"])
    ).run()
    assert everything["num_samples"] == 5 and len(set(ids)) == 5
    with pytest.raises(ConfigError, match="selects no prompt"):
        EvalTask(
            compose_config([*SMALL, "eval.num_shards=3", "eval.shard_id=2", f"eval.output_dir={tmp_path}"])
        ).run()


# --- resume ---------------------------------------------------------------------------------------


@pytest.fixture
def decoded_counts(monkeypatch):
    """How many prompts each call of compare() in the eval task decodes."""
    counts: list[int] = []
    real = eval_module.compare

    def counting(engine, prompt_ids, *args, **kwargs):
        counts.append(len(prompt_ids))
        return real(engine, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(eval_module, "compare", counting)
    return counts


def test_resume_skips_finished_samples_and_drops_a_torn_line(tmp_path, decoded_counts):
    base = [*TINY, "gen.max_new_tokens=6", "dataset.limit=3", "runtime.num_threads=1"]
    fresh = EvalTask(compose_config([*base, f"eval.output_dir={tmp_path / 'fresh'}"])).run()
    fresh_rows = read_samples(tmp_path / "fresh" / "samples.jsonl")

    out = tmp_path / "out"
    cfg = compose_config([*base, f"eval.output_dir={out}"])
    EvalTask(cfg).run()
    path = out / "samples.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[1][:40])  # killed while writing the second sample
    decoded_counts.clear()

    resumed = EvalTask(cfg).run()
    assert decoded_counts == [2]  # only the two missing prompts
    assert path.read_bytes().startswith(lines[0])  # the complete line is kept byte for byte
    rows = read_samples(path)
    assert [r["id"] for r in rows] == [r["id"] for r in fresh_rows]
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in fresh_rows]  # greedy: same outputs
    assert resumed["resumed_samples"] == 1 and resumed["num_samples"] == 3
    assert resumed == pytest.approx({**resumed, **summarize_samples(rows, greedy=True)})
    for key in ("new_tokens", "verifier_forwards", "tau", "acceptance_rate", "baseline_match_rate"):
        assert resumed[key] == pytest.approx(fresh[key])

    decoded_counts.clear()
    again = EvalTask(cfg).run()  # everything done: nothing decoded, the same summary
    assert decoded_counts == [] and again["resumed_samples"] == 3
    assert json.loads((out / "metrics.json").read_text())["tokens_per_s"] == pytest.approx(
        resumed["tokens_per_s"]
    )
    assert again["tokens_per_s"] == pytest.approx(resumed["tokens_per_s"])


def test_resume_refuses_samples_of_another_config(tmp_path, decoded_counts):
    out = tmp_path / "out"
    EvalTask(compose_config([*SMALL, "dataset.limit=2", f"eval.output_dir={out}"])).run()
    with pytest.raises(ConfigError, match=r"eval.output_dir: .* another config \(schedule.gamma: 3 -> 2\)"):
        EvalTask(
            compose_config([*SMALL, "dataset.limit=2", "schedule.gamma=2", f"eval.output_dir={out}"])
        ).run()
    # Settings of where and how (threads, warm-up, tracking) may change between a run and its resumption.
    EvalTask(
        compose_config([*SMALL, "dataset.limit=2", "runtime.num_threads=2", f"eval.output_dir={out}"])
    ).run()
    decoded_counts.clear()
    restarted = EvalTask(
        compose_config(
            [*SMALL, "dataset.limit=2", "schedule.gamma=2", "eval.resume=false", f"eval.output_dir={out}"]
        )
    ).run()
    assert decoded_counts == [2] and restarted["resumed_samples"] == 0 and restarted["gamma"] == 2
    assert len(read_samples(out / "samples.jsonl")) == 2


def test_resume_never_drops_a_complete_line(tmp_path):
    out = tmp_path / "out"
    cfg = compose_config([*SMALL, "dataset.limit=2", f"eval.output_dir={out}"])
    EvalTask(cfg).run()
    path = out / "samples.jsonl"
    broken = path.read_text().replace("\n", "\nnot json\n", 1)
    path.write_text(broken)
    with pytest.raises(ConfigError, match=r"samples.jsonl:2 is not valid JSON"):
        EvalTask(cfg).run()
    assert path.read_text() == broken


@pytest.fixture(scope="module")
def tiny_pair():
    verifier = load_verifier(ModelSpec(kind="tiny_random", seed=0), "cpu", "float32")
    drafter = load_drafter(ModelSpec(kind="tiny_random", seed=1, num_layers=1), verifier, "cpu", "float32")
    return verifier, drafter


@pytest.mark.parametrize("with_baseline", [True, False])
def test_summary_from_saved_samples_equals_the_in_memory_one(tiny_pair, tmp_path, with_baseline):
    verifier, drafter = tiny_pair
    settings = GenerationSettings(max_new_tokens=7)
    engine, baseline = build_engines(
        verifier, drafter, VerificationRule(), DraftSchedule(gamma=2), settings, baseline=with_baseline
    )
    prompts = [verifier.tokenizer(t)["input_ids"] for t in ("abc", "hello there", "xyz", "a longer prompt")]
    fake = [type("P", (), {"id": i, "text": "t", "category": None, "reference": None})() for i in range(4)]
    with open(tmp_path / "samples.jsonl", "w") as handle:
        writer = SampleWriter(handle, fake, verifier.tokenizer)
        comparison = compare(engine, prompts, baseline, batch_size=3, progress=False, on_batch=writer)
    rows = read_samples(tmp_path / "samples.jsonl")
    assert [r["batch_rows"] for r in rows] == [3, 3, 3, 1] and rows == writer.rows
    recomputed = summarize_samples(rows, greedy=True)
    assert recomputed.keys() == comparison.metrics.keys()
    assert recomputed == pytest.approx(comparison.metrics, rel=1e-9)


def test_a_sigkilled_submitter_leaves_no_parent_running_after_the_next_sweep(mlflow_uri, tmp_path):
    """SIGKILL runs no exit hook; the next sweep from this host closes the orphaned parent KILLED."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers import ROOT

    killed_dir = tmp_path / "killed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": mlflow_uri}
    env.pop("HYDRA_FULL_ERROR", None)
    args = [
        *TINY,
        "gen.max_new_tokens=64",
        "eval.baseline=false",
        "runtime.num_threads=1",
        "gen.seed=0,1,2,3,4,5",
    ]
    submitter = subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), "-m", *args, f"hydra.sweep.dir={killed_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (killed_dir / PARENT_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (killed_dir / PARENT_FILE).exists(), "the sweep never started"
        while not sweep_runs(killed_dir)[1] and time.monotonic() < deadline:  # a job is decoding
            time.sleep(0.2)
    finally:
        submitter.send_signal(signal.SIGKILL)
        submitter.wait()
    orphan, jobs = sweep_runs(killed_dir)
    assert orphan.info.status == "RUNNING" and jobs[-1].info.status == "RUNNING"
    proc = launch(["-m", *SMALL, "gen.seed=0", f"hydra.sweep.dir={tmp_path / 'next'}"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    orphan, jobs = sweep_runs(killed_dir)
    assert orphan.info.status == "KILLED" and jobs[-1].info.status == "KILLED"  # basic launcher: same process
    assert f"pid {submitter.pid}" in orphan.data.tags["specbench.error"]
    fresh, _ = sweep_runs(tmp_path / "next")
    assert fresh.info.status == "FINISHED"


# --- run dirs ------------------------------------------------------------------------------------------


def test_two_launches_in_the_same_second_get_their_own_run_dirs(tmp_path):
    """conf/config.yaml's run dir is DATE/TIME-<random>: two launches in one second never share it."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for attempt in range(4):  # until both start within one second (the case that used to collide)
        cwd = tmp_path / str(attempt)
        cwd.mkdir()
        procs = [
            subprocess.Popen([sys.executable, str(ROOT / "launch.py"), *TINY, "schedule.gamma=0"], cwd=cwd,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]  # fmt: skip
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 2 and "schedule.gamma" in err
        run_dirs = sorted(p.parent.relative_to(cwd / "outputs") for p in (cwd / "outputs").glob("*/*/.hydra"))
        assert len(run_dirs) == 2 and run_dirs[0] != run_dirs[1]
        times = {d.name.rsplit("-", 1)[0] for d in run_dirs}
        if len(times) == 1:
            return
    # Never the same second on this machine: what keeps such launches apart is the random suffix, which the
    # two dirs of the last attempt must carry, and which must differ.
    suffixes = [d.name.rsplit("-", 1)[1] for d in run_dirs]
    assert all(len(x) == 6 for x in suffixes) and suffixes[0] != suffixes[1]
