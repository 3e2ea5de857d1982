"""``train.select_by``: keep the weights of the validation step that scored best on a validation metric.

Long runs on a small corpus overfit (DFlash did from step 500), so the last step's weights are not the ones
to ship. Validation runs on the synth data's own validation split, never on the harness's held-out
questions, so choosing by it leaves those questions unseen. Each time the metric improves, the trainable
weights are written to ``best.pt`` (the ``trained.pt`` format, with the step and value in its metadata); at
the end of the run ``trained.pt`` is that snapshot and ``final.pt`` the last step's weights. The best value so
far is part of Lightning's checkpoint, so a resumed run keeps comparing against it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from specbench.errors import ConfigError
from specbench.training.trainer import export_trained

BEST_FILE = "best.pt"
FINAL_FILE = "final.pt"
MODES = ("max", "min")


class BestSnapshot(Callback):
    def __init__(self, metric: str, mode: str, out_dir: Path):
        if mode not in MODES:
            raise ConfigError(f"train.select_mode must be one of {list(MODES)}, got {mode!r}")
        self.metric, self.mode, self.path = metric, mode, Path(out_dir) / BEST_FILE
        self.best: float | None = None
        self.best_step: int | None = None

    @property
    def state_key(self) -> str:
        return f"BestSnapshot[{self.metric},{self.mode}]"

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.best_step = state_dict.get("best"), state_dict.get("best_step")

    def improves(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value > self.best if self.mode == "max" else value < self.best

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        logged = trainer.callback_metrics
        if self.metric not in logged:
            names = sorted(k for k in logged if k.startswith("val/"))
            raise ConfigError(
                f"train.select_by={self.metric}: validation did not log it; it logged {names}"
            )
        value = float(logged[self.metric])
        if not self.improves(value):
            return
        self.best, self.best_step = value, trainer.global_step
        if trainer.is_global_zero:
            selected = {"metric": self.metric, "mode": self.mode, "value": value}
            metadata = {**pl_module.metadata(), "global_step": trainer.global_step, "selected_by": selected}
            export_trained(pl_module, metadata, self.path)

    def summary(self) -> dict[str, Any]:
        return {"selected_by": self.metric, "selected_mode": self.mode, "selected_step": self.best_step,
                "selected_value": self.best}  # fmt: skip
