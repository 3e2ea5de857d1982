"""Lightning's MLflow logger with every store write held from SIGTERM / SIGINT (``signals.deferred``).

Lightning's ``MLFlowLogger`` writes metrics, params and its final status through its own MlflowClient,
outside ``store.retry``; a signal raised in the middle of one of those SQLAlchemy transactions lost the
write, as it did for the task's own calls. Here each write runs to its end and the signal is raised
after it, so Lightning stops the fit as it does for any interrupt.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import MLFlowLogger

from specbench.tracking import signals


class DeferringMLFlowLogger(MLFlowLogger):
    """``MLFlowLogger`` whose writes are not cut short by a signal."""

    def log_hyperparams(self, params: Any) -> None:
        with signals.deferred():
            super().log_hyperparams(params)

    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        with signals.deferred():
            super().log_metrics(metrics, step)

    def finalize(self, status: str = "success") -> None:
        with signals.deferred():
            super().finalize(status)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        with signals.deferred():
            super().after_save_checkpoint(checkpoint_callback)
