"""MLflow tracking: one run per task, a parent run per multirun, SQLite by default.

What a run is called and records (names, params, tags, run files) is :mod:`specbench.tracking.naming`;
the run itself :mod:`specbench.tracking.run`. Importing this package does not import mlflow and touches no
database; the Hydra callback lives in
:mod:`specbench.tracking.callbacks` (``hydra.callbacks`` in ``conf/config.yaml``).
"""

from specbench.tracking.naming import PARENT_FILE, PARENT_TAG, RUN_FILE, config_params, run_name, task_kind
from specbench.tracking.run import NULL_TRACKER, NullTracker, Tracker, task_run
from specbench.tracking.store import default_tracking_uri, project_root, resolve_tracking_uri

__all__ = [
    "NULL_TRACKER",
    "PARENT_FILE",
    "PARENT_TAG",
    "RUN_FILE",
    "NullTracker",
    "Tracker",
    "config_params",
    "default_tracking_uri",
    "project_root",
    "resolve_tracking_uri",
    "run_name",
    "task_kind",
    "task_run",
]
