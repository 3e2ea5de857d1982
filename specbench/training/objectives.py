"""The training module of ``method.objective`` for the drafters built from the verifier: SFT (the
``eagle3`` / ``dflash`` objectives) or on-policy distillation (``eagle3_opd`` / ``dflash_opd``,
docs/training.md#on-policy-distillation). Kept apart so neither objective's module imports the other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specbench.training.dflash import DFlashTraining, build_dflash_training
from specbench.training.dflash_opd import DFlashOpdTraining
from specbench.training.eagle3 import Eagle3Training, build_eagle3_training
from specbench.training.eagle3_opd import Eagle3OpdTraining
from specbench.training.opd import objective_of

MODULES = {
    ("eagle3", "sft"): Eagle3Training,
    ("eagle3", "opd"): Eagle3OpdTraining,
    ("dflash", "sft"): DFlashTraining,
    ("dflash", "opd"): DFlashOpdTraining,
}


def build_training(
    method: str, cfg: Any, verifier: Any, vocab_size: int, eos_ids: Sequence[int], pad_id: int
) -> tuple[Any, Any]:
    """The LightningModule and DataModule of ``task=train method=<method>`` (``eagle3`` or ``dflash``) for
    ``cfg.method.objective``."""
    build = build_eagle3_training if method == "eagle3" else build_dflash_training
    return build(cfg, verifier, vocab_size, eos_ids, pad_id, MODULES[method, objective_of(cfg)])
