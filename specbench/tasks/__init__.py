"""Tasks that ``launch.py`` instantiates from ``cfg.task``: thin wrappers that read config and call the
library."""

from specbench.tasks.base import Task, output_dir, run_task

__all__ = ["Task", "output_dir", "run_task"]
