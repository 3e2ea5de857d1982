"""task=report: runs from a real multirun (sweep dir files, and the MLflow runs it logged), runs logged
here with mlflow, shard merging, tables, plots, and clear errors for empty selectors."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import matplotlib.image
import pytest
from helpers import compose_config, launch

import specbench.config  # noqa: F401  (registers the schemas)
from specbench import reporting
from specbench.config import ConfigError
from specbench.reporting import (
    RunRecord,
    Selection,
    comparison_table,
    load_sweep_dir,
    merge_shards,
    mlflow_filter,
    parse_tags,
    search_mlflow_runs,
    write_report,
)
from specbench.reporting.report import CSV_FILE, MARKDOWN_FILE, PLOT_FILES
from specbench.tasks.report import ReportTask

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WEIGHTS = (0.0, 0.5)
GAMMAS = (2, 3)
# A real 2 x 2 multirun on the tiny random pair, through the CPU ensemble preset (its grid replaced here).
SWEEP_ARGS = [
    "-m",
    "experiment=cpu-ensemble-sweep",
    "model/verifier=tiny-random",
    "model/drafter=tiny-random",
    "model.drafter.num_layers=1",
    f"method.draft_weight={','.join(map(str, WEIGHTS))}",
    f"schedule.gamma={','.join(map(str, GAMMAS))}",
    "gen.max_new_tokens=6",
    "dataset.limit=2",
    "eval.warmup=false",
    "runtime.num_threads=1",
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    """The multirun's dir and the SQLite store its MLflow runs went to (never the project's store)."""
    base = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{base / 'mlflow.db'}"
    sweep_dir = base / "multirun"
    proc = launch([*SWEEP_ARGS, f"hydra.sweep.dir={sweep_dir}"], env_extra={"MLFLOW_TRACKING_URI": uri})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": sweep_dir, "uri": uri}


def job_metrics(sweep_dir: Path) -> dict[tuple[float, int], dict]:
    """(draft_weight, gamma) → the job's metrics.json."""
    found = {}
    for path in sweep_dir.glob("*/metrics.json"):
        metrics = json.loads(path.read_text())
        found[(metrics["method_draft_weight"], metrics["gamma"])] = metrics
    return found


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def check_pngs(out: Path, names: list[str]) -> None:
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def check_table_matches_jobs(rows: list[dict], jobs: dict) -> None:
    assert len(rows) == len(jobs) == len(WEIGHTS) * len(GAMMAS)
    for row in rows:
        metrics = jobs[(float(row["weight"]), int(float(row["gamma"])))]
        assert row["method"] == "static_ensemble" and row["schedule"] == "constant"
        for column, key in [
            ("tau", "tau"),
            ("acceptance", "acceptance_rate"),
            ("tokens_per_s", "tokens_per_s"),
            ("speedup", "speedup"),
        ]:
            assert float(row[column]) == pytest.approx(metrics[key], rel=1e-9), column
    # Sorted by method, gamma, weight.
    assert [(float(r["gamma"]), float(r["weight"])) for r in rows] == sorted(
        (float(g), w) for g in GAMMAS for w in WEIGHTS
    )


def test_report_from_sweep_dir_without_mlflow(sweep, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # any `import mlflow` now fails
    out = tmp_path / "report"
    result = ReportTask(
        compose_config(["task=report", f"task.sweep_dir={sweep['dir']}", f"task.output_dir={out}"])
    ).run()
    assert result == {"report_runs": 4, "report_plots": 3}
    rows = read_csv(out / CSV_FILE)
    check_table_matches_jobs(rows, job_metrics(sweep["dir"]))
    assert {r["run"] for r in rows} == {"0", "1", "2", "3"}
    assert all(r["verifier"] == "tiny-random-llama" and r["dataset"] == "demo" for r in rows)
    # Greedy w = 0 is exact SD: every output matches the verifier's own greedy output.
    assert {r["baseline_match_rate"] for r in rows if float(r["weight"]) == 0.0} == {"1.0"}

    markdown = (out / MARKDOWN_FILE).read_text()
    lines = markdown.splitlines()
    header = next(line for line in lines if line.startswith("| run | method"))
    assert header.split(" | ")[:9] == ["| run", "method", "schedule", "gamma", "weight", "τ", "acceptance",
                                        "tokens/s", "speedup"]  # fmt: skip
    table_rows = [line for line in lines[lines.index(header) + 2 :] if line.startswith("| ")]
    assert len([r for r in table_rows if "static_ensemble" in r]) == 4
    assert "0.500" in markdown and "x |" in markdown
    assert "Overrides common to every run: `experiment=cpu-ensemble-sweep" in markdown
    assert "`method.draft_weight=0.5 schedule.gamma=3`" in markdown
    for name in PLOT_FILES.values():
        assert f"]({name})" in markdown
    check_pngs(out, list(PLOT_FILES.values()))
    # Without a quality_* metric the quality plot shows agreement with greedy decoding instead.
    assert "skipped" not in markdown


def test_report_from_the_mlflow_runs_of_the_sweep(sweep, tmp_path):
    parent = json.loads((sweep["dir"] / "mlflow_parent.json").read_text())
    selection = search_mlflow_runs(parent_run_id=parent["run_id"], tracking_uri=sweep["uri"])
    assert len(selection.runs) == 4 and f"parent run {parent['run_id']!r}" in selection.description
    report = write_report(selection, tmp_path / "from_mlflow")
    rows = read_csv(report.csv)
    check_table_matches_jobs(rows, job_metrics(sweep["dir"]))
    assert all(r["source"].startswith("mlflow:") and len(r["run"]) == 8 for r in rows)
    # The same runs selected by tags and by a filter on the flattened config params.
    by_tags = search_mlflow_runs(
        tags={"specbench.sweep_dir": str(sweep["dir"].resolve())}, tracking_uri=sweep["uri"]
    )
    assert sorted(r.run_id for r in by_tags.runs) == sorted(r.run_id for r in selection.runs)
    by_filter = search_mlflow_runs(
        parent_run_id=parent["run_id"],
        filter_string="params.`schedule.gamma` = '3'",
        tracking_uri=sweep["uri"],
    )
    assert len(by_filter.runs) == 2
    assert all(run.params["schedule.gamma"] == "3" for run in by_filter.runs)


def test_report_task_through_launch_logs_artifacts(sweep, tmp_path):
    import mlflow

    parent = json.loads((sweep["dir"] / "mlflow_parent.json").read_text())
    run_dir = tmp_path / "report_run"
    proc = launch(
        ["task=report", f"task.parent_run_id={parent['run_id']}", f"hydra.run.dir={run_dir}"],
        env_extra={"MLFLOW_TRACKING_URI": sweep["uri"]},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "report:" in proc.stdout and "static_ensemble" in proc.stdout
    assert (run_dir / MARKDOWN_FILE).is_file() and len(read_csv(run_dir / CSV_FILE)) == 4
    check_pngs(run_dir, list(PLOT_FILES.values()))
    client = mlflow.tracking.MlflowClient(sweep["uri"])
    experiment = client.get_experiment_by_name("specbench-report")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["report_runs"] == 4
    logged = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "report")}
    assert {MARKDOWN_FILE, CSV_FILE, *PLOT_FILES.values()} <= logged


# ---- runs logged here with mlflow --------------------------------------------------------------------


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> dict:
    """A tmp SQLite store: a parent run with three children (two methods), a failed run, another
    experiment."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = mlflow.tracking.MlflowClient(uri)
    eval_id = client.create_experiment("specbench-eval", artifact_location=(tmp_path / "art").as_uri())
    other_id = client.create_experiment("specbench-other", artifact_location=(tmp_path / "art2").as_uri())
    parent = client.create_run(eval_id, run_name="sweep").info.run_id
    children = {}
    for method, weight, gamma, quality in [
        ("static_ensemble", 0.2, 4, 0.30),
        ("static_ensemble", 0.6, 4, 0.20),
        ("sd", None, 4, 0.31),
    ]:
        run = client.create_run(eval_id, run_name=f"{method} w={weight}", tags={"mlflow.parentRunId": parent})
        run_id = run.info.run_id
        params = {"method.name": method, "schedule.name": "constant", "schedule.gamma": str(gamma)}
        if weight is not None:
            params["method.draft_weight"] = str(weight)
        for key, value in params.items():
            client.log_param(run_id, key, value)
        acceptance = 0.3 + (weight or 0.0) / 2
        metrics = {"tau": 1 + 4 * acceptance, "acceptance_rate": acceptance, "tokens_per_s": 10.0 + gamma,
                   "speedup": 1.1, "quality_rouge2": quality, "quality_num_scored": 8.0,
                   "acceptance_pos_1": acceptance + 0.1, "acceptance_pos_2": acceptance,
                   "gamma": float(gamma)}  # fmt: skip
        for key, value in metrics.items():
            client.log_metric(run_id, key, value)
        for key, value in {"specbench.task": "eval", "specbench.method": method, "team": "a"}.items():
            client.set_tag(run_id, key, value)
        client.set_terminated(run_id)
        children[run_id] = (method, weight)
    failed = client.create_run(eval_id, run_name="crashed", tags={"mlflow.parentRunId": parent}).info.run_id
    client.log_metric(failed, "tau", 1.0)
    client.set_terminated(failed, "FAILED")
    client.set_terminated(parent)
    other = client.create_run(other_id, run_name="elsewhere").info.run_id
    client.log_metric(other, "tau", 2.0)
    client.set_terminated(other)
    return {"uri": uri, "parent": parent, "children": children}


def test_mlflow_selection_by_parent_tags_filter_and_experiment(mlflow_store):
    by_parent = search_mlflow_runs(parent_run_id=mlflow_store["parent"])
    assert sorted(r.run_id for r in by_parent.runs) == sorted(mlflow_store["children"])
    assert any("failed runs left out: crashed" in note for note in by_parent.notes)
    by_experiment = search_mlflow_runs()  # default experiment specbench-eval; the parent has no metrics
    assert len(by_experiment.runs) == 3
    assert any("without metrics" in note and "sweep" in note for note in by_experiment.notes)
    assert len(search_mlflow_runs(tags={"specbench.method": "static_ensemble", "team": "a"}).runs) == 2
    assert len(search_mlflow_runs(tags=["specbench.method=sd"]).runs) == 1
    assert len(search_mlflow_runs(filter_string="metrics.acceptance_rate > 0.45").runs) == 1
    assert [r.name for r in search_mlflow_runs(experiment="specbench-other").runs] == ["elsewhere"]


def test_mlflow_report_table_and_quality_plot(mlflow_store, tmp_path):
    out = tmp_path / "out"
    result = ReportTask(
        compose_config(
            ["task=report", f"task.parent_run_id={mlflow_store['parent']}", f"task.output_dir={out}"]
        )
    ).run()
    # Every run has gamma=4: the vs-gamma plot would have one x value, so it is skipped with a note.
    assert result == {"report_runs": 3, "report_plots": 2}
    rows = read_csv(out / CSV_FILE)
    assert [(r["method"], r["weight"]) for r in rows] == [("sd", ""), ("static_ensemble", "0.2"),
                                                          ("static_ensemble", "0.6")]  # fmt: skip
    assert [float(r["quality_rouge2"]) for r in rows] == [0.31, 0.30, 0.20]
    assert all(float(r["gamma"]) == 4 for r in rows)
    markdown = (out / MARKDOWN_FILE).read_text()
    assert "| quality_num_scored | quality_rouge2 |" in markdown.splitlines()[4] and "0.310" in markdown
    assert "acceptance/speedup vs gamma: skipped, every run with a drafter has gamma=4" in markdown
    assert not (out / PLOT_FILES["vs_gamma"]).exists()
    check_pngs(out, [PLOT_FILES["quality"], PLOT_FILES["positions"]])
    # One panel (rouge2): a count such as quality_num_scored is tabulated but not plotted.
    assert matplotlib.image.imread(out / PLOT_FILES["quality"]).shape[1] == round(5.5 * 110)


def test_empty_selectors_name_themselves(mlflow_store, tmp_path):
    def report(*overrides):
        return ReportTask(
            compose_config(["task=report", f"task.output_dir={tmp_path / 'o'}", *overrides])
        ).run()

    with pytest.raises(ConfigError, match=r"no runs match experiment 'specbench-eval', tags team=zzz"):
        report("task.tags={team:zzz}")
    with pytest.raises(ConfigError, match=r"no runs match .*parent run 'nope'"):
        report("task.parent_run_id=nope")
    with pytest.raises(ConfigError, match=r"experiment 'missing' does not exist"):
        report("task.experiment=missing")
    with pytest.raises(ConfigError, match=r"task.sweep_dir: .* is not a directory"):
        report(f"task.sweep_dir={tmp_path / 'absent'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no runs found in sweep dir .*empty.*no metrics.json"):
        report(f"task.sweep_dir={tmp_path / 'empty'}")
    with pytest.raises(ConfigError, match="cannot be combined"):
        report(f"task.sweep_dir={tmp_path}", "task.parent_run_id=x")
    with pytest.raises(ConfigError, match="task.tags"):
        report("task.tags=[novalue]")
    with pytest.raises(ConfigError, match="task.max_runs"):
        report("task.max_runs=0")
    assert not (tmp_path / "o" / MARKDOWN_FILE).exists()


# ---- library pieces ------------------------------------------------------------------------------------


def record(name: str, metrics: dict, params: dict | None = None, info: dict | None = None) -> RunRecord:
    return RunRecord(
        run_id=name, name=name, params=params or {}, metrics=metrics, info=info or {}, source=name
    )


def test_filter_strings_and_tags():
    assert (
        parse_tags({"a.b": 1}) == {"a.b": "1"}
        and parse_tags(["x=y=z"]) == {"x": "y=z"}
        and parse_tags(None) == {}
    )
    with pytest.raises(ValueError, match="task.tags"):
        parse_tags(["novalue"])
    assert mlflow_filter("abc", {"specbench.method": "it's"}, "metrics.tau > 1") == (
        "tags.`mlflow.parentRunId` = 'abc' and tags.`specbench.method` = 'it\\'s' and metrics.tau > 1"
    )
    assert mlflow_filter(extra="a = '1' OR b = '2'") == "(a = '1' OR b = '2')"
    assert mlflow_filter() == ""


def test_shards_of_one_configuration_merge_exactly():
    common = {"method.name": "sd", "schedule.gamma": "3", "eval.num_shards": "2"}
    # Shard totals: forwards 10 / 30, drafted 3 per round, accepted 6 / 45, tokens 16 / 75.
    shard_a = record(
        "job0",
        {"tau": 1.6, "verifier_forwards": 10, "mean_drafted_per_round": 3.0, "acceptance_rate": 0.2,
         "new_tokens": 16, "wall_time_s": 2.0, "tokens_per_s": 8.0, "num_samples": 1,
         "baseline_new_tokens": 16, "baseline_wall_time_s": 1.0, "speedup": 0.5, "quality_exact_match": 1.0,
         "quality_num_scored": 1, "acceptance_pos_1": 0.3},
        {**common, "eval.shard_id": "0", "eval.output_dir": "a"},
    )  # fmt: skip
    shard_b = record(
        "job1",
        {"tau": 2.5, "verifier_forwards": 30, "mean_drafted_per_round": 3.0, "acceptance_rate": 0.5,
         "new_tokens": 75, "wall_time_s": 3.0, "tokens_per_s": 25.0, "num_samples": 3,
         "baseline_new_tokens": 75, "baseline_wall_time_s": 5.0, "speedup": 1.67, "quality_exact_match": 0.0,
         "quality_num_scored": 3, "acceptance_pos_1": 0.7},
        {**common, "eval.shard_id": "1", "eval.output_dir": "b"},
    )  # fmt: skip
    other = record("solo", {"tau": 1.0}, {"method.name": "auto"})
    merged, notes = merge_shards([shard_a, other, shard_b])
    assert notes == [] and len(merged) == 2
    (run,) = [r for r in merged if r.name.startswith("job0")]
    assert run.info["shards"] == "2/2" and "eval.shard_id" not in run.params
    assert run.metrics["tau"] == pytest.approx((16 + 75) / 40)
    assert run.metrics["acceptance_rate"] == pytest.approx((6 + 45) / (30 + 90))
    assert run.metrics["tokens_per_s"] == pytest.approx(91 / 5.0)
    assert run.metrics["speedup"] == pytest.approx((91 / 5.0) / (91 / 6.0))
    assert run.metrics["num_samples"] == 4
    assert (
        run.metrics["quality_exact_match"] == pytest.approx(0.25) and run.metrics["quality_num_scored"] == 4
    )
    assert run.metrics["acceptance_pos_1"] == pytest.approx((0.3 * 10 + 0.7 * 30) / 40)
    _, notes = merge_shards([shard_a])
    assert notes and "shards [0] of 2" in notes[0]


def test_plots_are_skipped_with_a_note_when_columns_are_missing(tmp_path):
    runs = [
        record("a", {"tau": 1.0, "tokens_per_s": 5.0}, {"method.name": "auto"}),
        record(
            "b",
            {"tau": 1.2, "tokens_per_s": 4.0, "acceptance_rate": 0.1},
            {"method.name": "sd", "schedule.gamma": "3"},
        ),
        record(  # a second gamma: a vs-gamma plot needs two x values
            "c",
            {"tau": 1.3, "tokens_per_s": 3.5, "acceptance_rate": 0.15},
            {"method.name": "sd", "schedule.gamma": "4"},
        ),
    ]
    report = write_report(Selection(runs, "two runs"), tmp_path)
    assert set(report.plots) == {"vs_gamma"}  # acceptance only: no speedup panel, no quality, no positions
    notes = " | ".join(report.notes)
    assert "quality vs acceptance: skipped" in notes and "per-position acceptance: skipped" in notes
    check_pngs(tmp_path, [PLOT_FILES["vs_gamma"]])
    assert not (tmp_path / PLOT_FILES["quality"]).exists()
    markdown = (tmp_path / MARKDOWN_FILE).read_text()
    assert "## Notes" in markdown and "per-position acceptance: skipped" in markdown
    table = comparison_table(runs)
    assert table.loc[table["method"] == "auto", "gamma"].item() == 0  # autoregressive: nothing drafted
    assert table["speedup"].isna().all()

    only_auto = write_report(Selection(runs[:1], "one run"), tmp_path / "auto")
    assert only_auto.plots == {} and any("acceptance/speedup vs gamma: skipped" in n for n in only_auto.notes)


def test_sweep_dir_notes_jobs_without_metrics(sweep, tmp_path):
    import shutil

    copy = tmp_path / "sweep"
    shutil.copytree(sweep["dir"], copy)
    (copy / "2" / "metrics.json").unlink()
    selection = load_sweep_dir(copy)
    assert [r.label for r in selection.runs] == ["0", "1", "3"]
    assert selection.notes == ["jobs without metrics.json (failed or still running), left out: 2"]
    run = selection.runs[0]
    assert run.params["method.name"] == "static_ensemble" and run.params["schedule.gamma"] == "2"
    assert "method.draft_weight=0.0" in run.overrides and run.metrics["num_samples"] == 2


def test_the_report_groups_by_model_pair_and_dataset_and_names_what_differs(tmp_path):
    def run(name, verifier, drafter, dataset, method, gamma, tau, **params):
        return record(
            name,
            {"tau": tau, "acceptance_rate": tau / 10, "tokens_per_s": 10.0, "acceptance_pos_1": 0.5,
             "acceptance_pos_2": 0.4},
            {"method.name": method, "schedule.gamma": str(gamma),
             **{f"method.{k}": str(v) for k, v in params.items()}},
            {"verifier": verifier, "drafter": drafter, "dataset": dataset},
        )  # fmt: skip

    runs = [
        run("a", "v2", "d2", "gsm8k", "sd", 2, 1.1),
        run("b", "v1", "d1", "xsum", "lossy", 2, 1.2, lenience=0.5),
        run(
            "c",
            "v1",
            "d1",
            "gsm8k",
            "static_ensemble",
            3,
            1.3,
            draft_weight=0.30000000000000004,
            pool="linear",
        ),
        run("d", "v1", "d1", "gsm8k", "cascade", 2, 1.4, deferral="chow", alpha=0.1),
    ]
    report = write_report(Selection(runs, "four runs"), tmp_path)
    table = report.table
    assert list(zip(table["pair"], table["dataset"], table["run"])) == [
        ("v1 + d1", "gsm8k", "d"), ("v1 + d1", "gsm8k", "c"), ("v1 + d1", "xsum", "b"),
        ("v2 + d2", "gsm8k", "a"),
    ]  # fmt: skip
    markdown = (tmp_path / MARKDOWN_FILE).read_text()
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| run"))
    header, table_lines = lines[start], lines[start + 2 : start + 2 + len(runs)]
    assert header.endswith("| method params | verifier + drafter | dataset |")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table_lines}
    assert "| 0.3 |" in rows["c"] and "0.30000000000000004" not in markdown  # weights written readably
    assert "| lenience=0.5 | v1 + d1 | xsum |" in rows["b"]
    assert "| deferral=chow alpha=0.1 | v1 + d1 | gsm8k |" in rows["d"]
    assert set(report.plots) == {"vs_gamma", "positions"}


def test_plots_whose_x_axis_has_one_value_are_skipped(tmp_path):
    runs = [
        record(name, {"tau": 1.0 + w, "acceptance_rate": 0.2, "speedup": 1.0, "acceptance_pos_1": 0.2,
                      "quality_rouge2": 0.1 + w}, {"method.name": "static_ensemble", "schedule.gamma": "3",
                                                    "method.draft_weight": str(w)})
        for name, w in (("a", 0.1), ("b", 0.2))
    ]  # fmt: skip
    report = write_report(Selection(runs, "two runs"), tmp_path)
    assert report.plots == {}
    notes = " | ".join(report.notes)
    assert "vs gamma: skipped, every run with a drafter has gamma=3 (one x value)" in notes
    assert "quality vs acceptance: skipped, every run has acceptance 0.2 (one x value)" in notes
    assert "per-position acceptance: skipped, every run has only draft position 1 (one x value)" in notes


def test_a_missing_tracking_database_is_named_not_created(tmp_path):
    missing = tmp_path / "nowhere" / "mlflow.db"
    named = re.escape(f"tracking.uri: no MLflow database at '{missing}' (tracking URI 'sqlite:///{missing}')")
    with pytest.raises(reporting.NoRunsError, match=named):
        search_mlflow_runs(tracking_uri=f"sqlite:///{missing}")
    assert not missing.exists()
