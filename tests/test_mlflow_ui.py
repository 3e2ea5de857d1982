"""The MLflow UI, rendered by headless Chromium over a real sweep, shows the comparison: the runs table opens
on the sweep's headline columns with the parent's best values, the parent's page lists every child with its
headline numbers, and a child's page shows its own numbers and swept values."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from helpers import launch

from specbench.tracking import PARENT_FILE, PARENT_TAG
from specbench.tracking.headline import HEADLINE_METRICS, format_headline
from specbench.tracking.ui_browser import find_chromium, render_text, serve_ui

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium)")

SWEEP = [
    "model/verifier=tiny-random",
    "model/drafter=tiny-random",
    "gen.max_new_tokens=3",
    "dataset.limit=1",
    "eval.warmup=false",
    "runtime.num_threads=1",
    "method=static_ensemble",
    "schedule.gamma=1,2",
    "method.draft_weight=0.1,0.3",
]


def js_number(value: float) -> str:
    """How the UI prints a metric: JavaScript's shortest form (1, not 1.0)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@pytest.fixture(scope="module")
def sweep(_mlflow_template, tmp_path_factory):
    """A 4-job sweep with a baseline (all four headline metrics), its MLflow runs, and the UI serving them."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("ui")
    database = root / "mlflow.db"
    shutil.copy(_mlflow_template, database)
    uri = f"sqlite:///{database}"
    sweep_dir = root / "sweep"
    proc = launch(
        ["-m", *SWEEP, f"hydra.sweep.dir={sweep_dir}"],
        env_extra={"MLFLOW_TRACKING_URI": uri},
        cache_dir=root / "cache",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((sweep_dir / PARENT_FILE).read_text())
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(record["run_id"])
    children = client.search_runs(
        [record["experiment_id"]], filter_string=f"tags.`{PARENT_TAG}` = '{record['run_id']}'"
    )
    printed = re.search(r"or http://127\.0\.0\.1:5000(/#/experiments/\S+) \(its experiment", proc.stderr)
    assert printed, proc.stderr[-2000:]
    with serve_ui(uri) as base:
        yield {"base": base, "parent": parent, "children": children, "runs_table": printed.group(1)}


def test_the_runs_table_opens_on_the_sweep_columns_with_the_best_values(sweep):
    parent = sweep["parent"]
    best = [js_number(parent.data.metrics[name]) for name in HEADLINE_METRICS]
    url = sweep["base"] + sweep["runs_table"]
    text = render_text(url, expect=[parent.info.run_name, *best], chromium=CHROMIUM)
    assert "matching runs" in text and "Traces 0" not in text, text[:1500]  # runs, not the GenAI overview
    assert parent.info.run_name in text
    for name in HEADLINE_METRICS:
        assert name in text
    row = text.split(parent.info.run_name, 1)[1]
    assert all(value in row for value in best), row[:600]


def test_the_parent_page_lists_every_child_with_its_headline_numbers(sweep):
    parent, children = sweep["parent"], sweep["children"]
    url = f"{sweep['base']}/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}"
    text = render_text(url, expect=["Child runs", *(c.info.run_name for c in children)], chromium=CHROMIUM)
    assert "4 of 4 jobs finished" in text
    for child in children:
        numbers = " ".join(format_headline(n, child.data.metrics[n]) for n in HEADLINE_METRICS)
        gamma, weight = child.data.params["schedule.gamma"], child.data.params["method.draft_weight"]
        assert f"{child.info.run_name} {gamma} {weight} FINISHED {numbers}" in text, text[:3000]
    for name in HEADLINE_METRICS:
        assert f"{name} {js_number(parent.data.metrics[name])}" in text
        assert f"best_job/{name} {int(parent.data.metrics[f'best_job/{name}'])}" in text
    assert "sweep.axes schedule.gamma, method.draft_weight" in text
    assert "Child runs" in text


def test_a_child_page_shows_its_numbers_and_swept_values(sweep):
    child = sweep["children"][0]
    url = f"{sweep['base']}/#/experiments/{child.info.experiment_id}/runs/{child.info.run_id}"
    text = render_text(url, expect=[child.info.run_name, "Parent run"], chromium=CHROMIUM)
    assert child.info.run_name in text
    for name in HEADLINE_METRICS:
        assert f"{name} {js_number(child.data.metrics[name])}" in text, text[:3000]
    assert f"sweep.schedule.gamma : {child.data.params['schedule.gamma']}" in text
    assert sweep["parent"].info.run_name in text  # its parent, named on the page
