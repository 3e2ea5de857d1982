"""Where a sweep opens in the MLflow UI: a shared runs-table view with its columns chosen, and the URLs.

MLflow 3.17's UI opens an experiment on the GenAI overview unless the browser's workflow switch says "Model
training" or the URL carries ``workflowType=machine_learning``; the experiment tag ``mlflow.experimentKind``
is read only when that switch is turned off by a feature flag, so the URLs below carry the query parameter
(and new experiments get the tag too). A runs-table view is shared through an experiment tag
``mlflow.sharedViewState.<key>`` holding the view's JSON, opened by ``?viewStateShareKey=<key>`` (the UI's
own "share view" mechanism). Which runs are expanded is not part of a shared view, so the table shows the
sweep's parent collapsed; the parent's run page lists the children with their numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from specbench.tracking import store
from specbench.tracking.headline import HEADLINE_METRICS

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
RUNS_KIND = "custom_model_development"
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
RUNS_QUERY = "workflowType=machine_learning"
DEFAULT_UI = "http://127.0.0.1:5000"


def column(kind: str, name: str) -> str:
    """A runs-table column key as the UI writes it: ``metrics.`tau```, ``params.`schedule.gamma```."""
    return f"{kind}.`{name}`"


def view_state(swept: Iterable[str]) -> dict[str, Any]:
    """The runs-table view of a sweep: its headline metrics, then the swept params, as columns."""
    columns = [column("metrics", name) for name in HEADLINE_METRICS]
    columns += [column("params", key) for key in swept if "/" not in key]  # a group choice is no param
    columns += [column("tags", f"sweep.{key}") for key in swept if "/" in key]
    return {"selectedColumns": columns, "runsHiddenMode": "SHOW_ALL"}


def share_key(parent_run_id: str) -> str:
    return f"specbench-sweep-{parent_run_id}"


def share_sweep_view(client: Any, experiment_id: str, parent_run_id: str, swept: Iterable[str]) -> str:
    """Store the sweep's runs-table view in the experiment; returns its share key."""
    key = share_key(parent_run_id)
    store.retry(
        client.set_experiment_tag, experiment_id, SHARED_VIEW_PREFIX + key, json.dumps(view_state(swept))
    )
    return key


def mark_runs_experiment(client: Any, experiment_id: str) -> None:
    """Tag the experiment as one of model runs (not GenAI traces), unless someone chose its kind already."""
    experiment = store.retry(client.get_experiment, experiment_id)
    if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):
        store.retry(client.set_experiment_tag, experiment_id, EXPERIMENT_KIND_TAG, RUNS_KIND)


def runs_table_path(experiment_id: str, key: str | None = None) -> str:
    """The UI route (after the host) of the experiment's runs table, in the sweep's shared view if ``key``."""
    path = f"/#/experiments/{experiment_id}/runs?{RUNS_QUERY}"
    return path + (f"&viewStateShareKey={key}" if key else "")


def run_page_path(experiment_id: str, run_id: str) -> str:
    """The UI route of one run's page (the parent's lists its children and shows the comparison)."""
    return f"/#/experiments/{experiment_id}/runs/{run_id}?{RUNS_QUERY}"
