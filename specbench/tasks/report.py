"""``task=report``: compare runs (from a sweep dir, or MLflow by parent, experiment, tags): a table, plots."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from specbench.errors import ConfigError
from specbench.tasks.base import Task, check_writable, configured_dir, output_dir

if TYPE_CHECKING:
    from specbench.reporting import Selection

ARTIFACT_DIR = "report"


class ReportTask(Task):
    """check: selectors → the runs they select → output dir; run: merge shards → report.md, report.csv,
    plots (→ artifacts of the task's MLflow run). A selector that matches nothing opens no MLflow run."""

    config_groups = ("task", "tracking")
    selection: Selection | None = None

    def __init__(self, cfg: DictConfig, **_task_fields: Any) -> None:
        # Hydra's instantiate also passes the fields of ``cfg.task``; they are read from ``cfg.task``.
        super().__init__(cfg)

    def check(self) -> None:
        """Selector values, then the selection itself (files or MLflow), then the output dir."""
        from specbench.reporting import parse_tags

        opts = self.cfg.task
        if opts.max_runs < 1:
            raise ConfigError(f"task.max_runs must be >= 1, got {opts.max_runs}")
        if opts.sweep_dir and (opts.parent_run_id or opts.tags or opts.filter):
            raise ConfigError(
                "task.sweep_dir reads runs from files; it cannot be combined with the MLflow selectors "
                "task.parent_run_id / task.tags / task.filter"
            )
        try:
            parse_tags(self._tags())
        except (ValueError, TypeError) as err:
            raise ConfigError(" ".join(str(err).split())) from err
        self.selection = self.select()
        check_writable(configured_dir(opts.output_dir), "task.output_dir")

    def run_name(self) -> str:
        opts = self.cfg.task
        if opts.sweep_dir:
            return f"report {opts.sweep_dir}"
        if opts.parent_run_id:
            return f"report parent {opts.parent_run_id[:8]}"
        return f"report {opts.experiment}"

    def run(self) -> dict:
        from specbench.reporting import write_report
        from specbench.reporting.table import to_markdown

        if self.selection is None:  # called directly (not through run_task)
            self.check()
        opts = self.cfg.task
        selection = self.selection
        out = output_dir(opts.output_dir, "task.output_dir")
        report = write_report(selection, out, title=f"specbench report: {selection.description}")
        print(to_markdown(report.table))
        for note in report.notes:
            print(f"note: {note}")
        print(f"report: {report.markdown} ({len(report.table)} runs, {len(report.plots)} plots)")
        self.tracker.set_tags({"specbench.report.selector": selection.description})
        for path in report.files:
            self.tracker.log_artifact(path, ARTIFACT_DIR)
        return {"report_runs": len(report.table), "report_plots": len(report.plots)}

    def select(self) -> Selection:
        """Runs from ``task.sweep_dir`` (files) if set, else from MLflow; a ConfigError names an empty one."""
        from specbench.reporting import NoRunsError, load_sweep_dir, search_mlflow_runs

        opts = self.cfg.task
        try:
            if opts.sweep_dir:
                return load_sweep_dir(opts.sweep_dir)
            return search_mlflow_runs(
                experiment=opts.experiment,
                parent_run_id=opts.parent_run_id,
                tags=self._tags(),
                filter_string=opts.filter,
                tracking_uri=OmegaConf.select(self.cfg, "tracking.uri", default=None),
                max_runs=opts.max_runs,
            )
        except NoRunsError as err:
            raise ConfigError(f"task=report: {err}") from err
        except ConfigError:
            raise
        except Exception as err:
            if type(err).__name__ == "MlflowException" and "filter" in str(err).lower():
                message = " ".join(str(err).split())
                raise ConfigError(f"task.filter / task.tags: MLflow rejected the filter: {message}") from err
            raise

    def _tags(self) -> Any:
        tags = self.cfg.task.tags
        return OmegaConf.to_container(tags) if OmegaConf.is_config(tags) else tags
