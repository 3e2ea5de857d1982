"""Compare runs: select them (Hydra sweep dir or MLflow), tabulate, plot. Usable without Hydra.

>>> from specbench.reporting import load_sweep_dir, write_report
>>> report = write_report(load_sweep_dir("multirun/2026-12-01/10-00-00"), "report_out")
"""

from specbench.reporting.report import Report, write_report
from specbench.reporting.runs import (
    NoRunsError,
    RunRecord,
    Selection,
    load_sweep_dir,
    mlflow_filter,
    parse_tags,
    search_mlflow_runs,
)
from specbench.reporting.table import comparison_table, merge_shards, to_markdown

__all__ = [
    "NoRunsError",
    "Report",
    "RunRecord",
    "Selection",
    "comparison_table",
    "load_sweep_dir",
    "merge_shards",
    "mlflow_filter",
    "parse_tags",
    "search_mlflow_runs",
    "to_markdown",
    "write_report",
]
