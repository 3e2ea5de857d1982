"""The Lightning Trainer every specbench training task uses: schedule, checkpoints, MLflow, SLURM.

- One owner of the preemption signal: submitit (it asks SLURM for USR2 and requeues the job); so
  Lightning's own SLURM auto-requeue is off, and a requeued job resumes from its ``last.ckpt``.
- Lightning logs into the task's MLflow run (the one ``run_task`` opened), not into a new run.
- Checkpoints hold only trainable weights plus metadata (:class:`TrainedOnlyCheckpoint`).
"""

from __future__ import annotations

import logging
import math
import re
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from specbench.models.checkpoints import METADATA_KEY, read_checkpoint  # noqa: F401  (re-exported)
from specbench.tracking import NullTracker

CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"
# Cumulative training compute every objective logs as train/<key> (docs/training.md#training-compute).
COMPUTE_KEYS = ("verifier_tokens", "head_tokens", "head_grad_tokens", "wall_seconds")
COMPUTE_STATE = "specbench_compute"  # the counters in last.ckpt, so a resumed run continues them


def train_option(node: Any, key: str, default: Any) -> Any:
    """``node.key`` (``node[key]`` for a dict), or ``default`` when the train config (DictConfig, dataclass,
    namespace, dict) has no such key or it is None."""
    try:
        value = node.get(key) if isinstance(node, dict) else getattr(node, key)
    except (AttributeError, KeyError):
        return default
    return default if value is None else value


def warmup_cosine_lr(step: int, warmup_steps: int, total_steps: int, lr_start: float, lr_end: float) -> float:
    """Linear warm-up 0 → lr_start over ``warmup_steps``, then cosine lr_start → lr_end at ``total_steps``.

    Sequential (methods.md §4), not the product of a warm-up factor and a cosine factor.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return lr_start * (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    return lr_end + 0.5 * (lr_start - lr_end) * (1.0 + math.cos(math.pi * progress))


def warmup_cosine_scheduler(optimizer: torch.optim.Optimizer, train: Any) -> dict:
    """A per-step LambdaLR for Lightning's ``configure_optimizers`` (the optimiser's lr must be lr_start)."""

    def factor(step: int) -> float:
        lr = warmup_cosine_lr(step, train.warmup_steps, train.max_steps, train.lr_start, train.lr_end)
        return lr / train.lr_start

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"scheduler": scheduler, "interval": "step", "frequency": 1}


def trainable_state(module: torch.nn.Module) -> set[str]:
    """Names (as in ``module.state_dict()``) of the parameters that train."""
    return {name for name, param in module.named_parameters() if param.requires_grad}


class TrainedOnlyCheckpoint:
    """LightningModule mixin: checkpoints keep only trainable weights and carry ``metadata()``.

    Frozen models (the verifier; a frozen drafter) are rebuilt from their own source when loading, so a
    checkpoint of a steering head is megabytes, not the verifier's gigabytes.
    """

    strict_loading = False  # frozen weights are absent from the checkpoint by design

    def metadata(self) -> dict:
        return {}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        keep = trainable_state(self)
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}
        checkpoint[METADATA_KEY] = self.metadata()


class VerifierTraining(TrainedOnlyCheckpoint, L.LightningModule):
    """A LightningModule that trains a part against a frozen verifier: the verifier is held by reference (not
    a submodule: never saved, never handed to the optimiser) and moved to the module's device at fit start;
    AdamW over the trainable parameters with the warm-up / cosine schedule of ``train``; checkpoints carry
    ``metadata``; validation decodes ``val_prompts`` (token ids) with these EOS and pad ids."""

    def __init__(
        self,
        verifier: torch.nn.Module,
        train: Any,
        metadata: dict,
        val_prompts: Iterable[Iterable[int]] = (),
        eos_token_ids: Iterable[int] = (),
        pad_token_id: int = 0,
    ):
        super().__init__()
        self._verifier = [verifier]
        self.train_cfg = train
        self._metadata = metadata
        self.val_prompts = [list(p) for p in val_prompts]
        self.eos_token_ids, self.pad_token_id = list(eos_token_ids), pad_token_id

    @property
    def verifier(self) -> torch.nn.Module:
        return self._verifier[0]

    def metadata(self) -> dict:
        return dict(self._metadata)

    def on_fit_start(self) -> None:
        self.verifier.to(self.device)

    def count_compute(
        self, batch_size: int, verifier_tokens: int, head_tokens: int, head_grad_tokens: int
    ) -> None:
        """Add one training batch's compute to the cumulative ``train/verifier_tokens`` (tokens whose
        verifier forward the batch consumed, live or from the feature cache), ``train/head_tokens`` (token
        positions the drafter ran forward, with or without gradient) and ``train/head_grad_tokens`` (those
        that also ran backward), and log them with ``train/wall_seconds`` (training-step time so far)."""
        counts = self._compute_counts()
        for key, value in zip(COMPUTE_KEYS, (verifier_tokens, head_tokens, head_grad_tokens)):
            counts[key] += float(value)
        for key in COMPUTE_KEYS:
            self.log(f"train/{key}", counts[key], batch_size=batch_size)

    def _compute_counts(self) -> dict[str, float]:
        if not hasattr(self, "_compute"):
            self._compute = dict.fromkeys(COMPUTE_KEYS, 0.0)
        return self._compute

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._batch_started = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        started = getattr(self, "_batch_started", None)
        if started is not None:
            self._compute_counts()["wall_seconds"] += time.perf_counter() - started

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[COMPUTE_STATE] = dict(self._compute_counts())

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._compute_counts().update(checkpoint.get(COMPUTE_STATE) or {})

    def step_generator(self) -> torch.Generator:
        """A generator seeded by ``train.seed`` and the step: a resumed run draws what the first run would."""
        return torch.Generator().manual_seed(int(self.train_cfg.seed) * 1_000_003 + self.global_step)

    def configure_optimizers(self) -> dict:
        params = [p for p in self.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=self.train_cfg.lr_start, weight_decay=self.train_cfg.weight_decay
        )
        return {"optimizer": optimizer, "lr_scheduler": warmup_cosine_scheduler(optimizer, self.train_cfg)}


class LastMetrics(Callback):
    """Keep the last value of every metric the module logged (the step-wise history goes to MLflow
    through Lightning's MLFlowLogger)."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    def _keep(self, trainer: L.Trainer) -> None:
        self.last.update(
            {
                k: float(v)
                for k, v in trainer.callback_metrics.items()
                if torch.is_tensor(v) and v.numel() == 1
            }
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._keep(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._keep(trainer)


class StepProgress(Callback):
    """The console's view of training: a line every ``every`` optimiser steps (step / max_steps and the
    train metrics) and one after each validation. It replaces Lightning's progress bar, which counts
    epochs (``Epoch 1/-2`` for a run bounded by steps) and garbles log files."""

    def __init__(self, every: int, max_steps: int) -> None:
        self.every = max(1, every)
        self.max_steps = max_steps
        self._printed = -1

    @staticmethod
    def _values(trainer: L.Trainer, prefix: str) -> str:
        items = [
            (k.removeprefix(prefix), float(v))
            for k, v in sorted(trainer.callback_metrics.items())
            if k.startswith(prefix) and torch.is_tensor(v) and v.numel() == 1
        ]
        return "  ".join(f"{k} {v:.4g}" for k, v in items)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._printed or not trainer.is_global_zero:
            return
        if step % self.every == 0 or step >= self.max_steps:
            self._printed = step
            print(f"step {step}/{self.max_steps}  {self._values(trainer, 'train/')}".rstrip(), flush=True)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.is_global_zero:
            values = self._values(trainer, "val/")
            print(f"validation at step {trainer.global_step}: {values}".rstrip(), flush=True)


# Lightning messages that say nothing a specbench user can act on.
QUIET_WARNINGS = (
    r"Using ModelCheckpoint with manual optimization",  # the state after the step is what resume needs
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning vs torch >= 2.9, internal
    r".*does not have many workers",  # num_workers=0 is the default on purpose (tiny CPU datasets)
    # SLURM jobs come from submitit, which uses srun itself
    r"The `srun` command is available on your system",
)
QUIET_INFO = re.compile(r"^(💡 Tip|GPU available|TPU available|HPU available|`Trainer.fit` stopped)")


class _QuietInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not QUIET_INFO.match(record.getMessage())


def quiet_lightning() -> None:
    """Lightning on the console once, without its tips, accelerator lines and known-harmless warnings.

    The ``lightning`` logger has its own console handler and also propagates to the root logger (which
    Hydra sets up for the console and the job's log file), so every line came twice: when the root has
    handlers, Lightning's own is dropped.
    """
    logger = logging.getLogger("lightning")
    if logging.getLogger().handlers:
        for handler in [h for h in logger.handlers if type(h) is logging.StreamHandler]:
            logger.removeHandler(handler)
    # A logger's filters see only the records it creates, so each logger Lightning logs these with.
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning.pytorch.trainer.connectors.accelerator_connector"):
        named = logging.getLogger(name)
        if not any(isinstance(f, _QuietInfo) for f in named.filters):
            named.addFilter(_QuietInfo())
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def last_checkpoint(out_dir: Path) -> Path | None:
    path = Path(out_dir) / CHECKPOINT_DIR / LAST_CHECKPOINT
    return path if path.is_file() else None


def precision_for(device: torch.device, configured: str | None) -> str:
    if configured:
        return configured
    return "bf16-mixed" if device.type == "cuda" else "32-true"


def _plugins() -> list:
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    # Under SLURM, submitit owns USR2 → requeue; Lightning must not also requeue on its signal.
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def build_trainer(
    train: Any,
    out_dir: Path,
    tracker: NullTracker,
    device: torch.device,
    callbacks: Iterable[Callback] = (),
    automatic_optimization: bool = True,
    log_every_n_steps: int | None = None,
) -> tuple[L.Trainer, LastMetrics]:
    """A Trainer for ``train`` (the ``train:`` config): max_steps, accumulation, grad clip (automatic
    optimisation only; manual modules clip themselves), precision, devices/strategy, ``last.ckpt`` every
    ``checkpoint_every_steps``, validation every ``val_every_steps``, step-wise metrics into ``tracker``'s
    MLflow run (Lightning's MLFlowLogger attached to it by run id, its writes held from signals). The
    console shows :class:`StepProgress` lines, not Lightning's bar, tips or accelerator lines."""
    quiet_lightning()
    checkpoints = ModelCheckpoint(
        dirpath=Path(out_dir) / CHECKPOINT_DIR,
        save_last=True,
        save_top_k=0,
        every_n_train_steps=train.checkpoint_every_steps,
        save_on_train_epoch_end=False,
    )
    metrics = LastMetrics()
    if log_every_n_steps is None:  # about 10 points for a short run, every 10 steps for a long one
        log_every_n_steps = max(1, min(10, train.max_steps // 10))
    loggers = []
    if tracker.enabled:
        from specbench.training.mlflow_logger import DeferringMLFlowLogger

        loggers.append(
            DeferringMLFlowLogger(tracking_uri=tracker.tracking_uri, run_id=tracker.run_id, log_model=False)
        )
    trainer = L.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=train.devices,
        strategy=train.strategy,
        precision=precision_for(device, train.precision),
        max_steps=train.max_steps,
        max_epochs=-1,
        accumulate_grad_batches=train.accumulate_grad_batches if automatic_optimization else 1,
        gradient_clip_val=(train.grad_clip or None) if automatic_optimization else None,
        val_check_interval=train.val_every_steps,
        check_val_every_n_epoch=None,
        limit_val_batches=train.val_batches or 1.0,
        num_sanity_val_steps=0,
        log_every_n_steps=log_every_n_steps,
        logger=loggers or False,
        callbacks=[checkpoints, metrics, StepProgress(log_every_n_steps, train.max_steps), *callbacks],
        plugins=_plugins(),
        default_root_dir=str(out_dir),
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=False,
    )
    return trainer, metrics


def export_trained(module: torch.nn.Module, metadata: dict, path: Path) -> Path:
    """Write ``{state_dict: trainable weights, specbench: metadata}`` (loadable with weights_only=True)."""
    keep = trainable_state(module)
    state = {k: v.detach().cpu() for k, v in module.state_dict().items() if k in keep}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"state_dict": state, METADATA_KEY: metadata}, tmp)
    tmp.replace(path)
    return path
