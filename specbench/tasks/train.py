"""``task=train``: train a drafter (``method=distill``), an SD² steered drafter (``method=sd2``), an EAGLE-3
head (``method=eagle3``), a DFlash drafter (``method=dflash``) or the DIVERSED weight head
(``method=diversed``) with Lightning, log into the task's MLflow run, and export the trained part as
``trained.pt`` (what ``task=eval`` loads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from specbench.config.plans import TrainPlan
from specbench.config.train_checks import validate_train
from specbench.errors import ConfigError
from specbench.tasks.base import (
    Task,
    check_writable,
    configured_dir,
    load_task_prompts,
    output_dir,
    verifier_placement,
)

if TYPE_CHECKING:
    import torch

    from specbench.decoding.protocol import Drafter
    from specbench.models.loading import LoadedModel

TRAINED_FILE = "trained.pt"
SUMMARY_FILE = "train_metrics.json"


class TrainTask(Task):
    """check: validate → prompts (diversed) → output dir; run: models → module + data for the method →
    Lightning fit (resuming last.ckpt) → trained.pt."""

    plan: TrainPlan | None = None
    prompts: list | None = None
    config_groups = (
        "task", "model", "method", "steering", "schedule", "dataset", "scoring", "gen", "train", "runtime",
        "tracking",
    )  # fmt: skip

    def check(self) -> None:
        self.plan = validate_train(self.cfg)
        if self.plan.method == "diversed":  # reads prompts: a bad file fails before any run opens
            self.prompts = load_task_prompts(self.cfg.dataset)
        check_writable(configured_dir(self.cfg.train.output_dir), "train.output_dir")
        self.plan.resolve()

    def run_dir(self) -> Path | None:
        configured = self.cfg.train.output_dir
        return Path(configured).expanduser() if configured else super().run_dir()

    def run_name(self) -> str:
        method = self.plan.method if self.plan else self.cfg.method.name
        return f"train {method}"

    def tracked_metrics(self, result: dict) -> dict:
        """Its numbers, and the headline ``tau`` (specbench/tracking/headline.py) when validation decoded."""
        return {**result, "tau": result["final_val_tau"]} if "final_val_tau" in result else result

    def run(self) -> dict:
        import lightning as L
        import torch

        from specbench.models.loading import load_verifier, pair_vocab_size
        from specbench.models.pair import PairMismatchError, shared_vocab_size
        from specbench.pairs import load_drafter
        from specbench.training.snapshots import FINAL_FILE, BestSnapshot
        from specbench.training.trainer import build_trainer, export_trained, last_checkpoint

        if self.plan is None:  # called directly (not through run_task)
            self.check()
        cfg, plan = self.cfg, self.plan
        out = output_dir(cfg.train.output_dir, "train.output_dir")
        if cfg.runtime.num_threads is not None:
            torch.set_num_threads(cfg.runtime.num_threads)
        L.seed_everything(cfg.train.seed, workers=True, verbose=False)
        verifier = load_verifier(
            plan.verifier, plan.device, plan.dtype, placement=verifier_placement(cfg, plan)
        )
        if plan.method in ("eagle3", "dflash"):  # built from the verifier (and the data), not loaded
            drafter = None
            vocab = shared_vocab_size(verifier.model, verifier.model, verifier.tokenizer, verifier.tokenizer)
        else:
            drafter = load_drafter(plan.drafter, verifier, plan.device, plan.dtype)
            try:
                vocab = pair_vocab_size(verifier, drafter)
            except PairMismatchError as err:
                raise ConfigError(f"model.drafter does not fit model.verifier: {err}") from err
        module, data = self._build(plan, verifier, drafter, vocab)
        select = cfg.train.select_by
        snapshot = BestSnapshot(select, cfg.train.select_mode, out) if select else None
        trainer, metrics = build_trainer(
            cfg.train, out, self.tracker, plan.device, callbacks=[snapshot] if snapshot else (),
            automatic_optimization=module.automatic_optimization,
        )  # fmt: skip
        resume = last_checkpoint(out) if cfg.train.resume else None
        if resume is not None:
            print(f"resuming from {resume}")
        self.tracker.set_tags({
            "specbench.method": plan.method,
            "specbench.verifier": verifier.name,
            "specbench.drafter": drafter.name if drafter is not None else plan.drafter.name or plan.method,
            "specbench.resumed_from": str(resume) if resume else "",
        })
        trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume else None)
        summary = {"final_" + k.replace("/", "_"): v for k, v in metrics.last.items() if "/" in k}
        summary.update(global_step=trainer.global_step, trainable_parameters=_trainable(module))
        if not trainer.is_global_zero:  # ddp: rank 0 writes the outputs
            return summary
        metadata = {**module.metadata(), "global_step": trainer.global_step}
        trained = export_trained(module, metadata, out / (FINAL_FILE if snapshot else TRAINED_FILE))
        if snapshot is not None:
            trained = _selected(snapshot, trained, out / TRAINED_FILE)
            summary.update(snapshot.summary())
        (out / SUMMARY_FILE).write_text(json.dumps({**summary, "checkpoint": str(trained)}, indent=2) + "\n")
        self.tracker.set_tags({"specbench.checkpoint": str(trained.resolve())})
        self.tracker.log_artifact(out / SUMMARY_FILE)
        print(f"trained {plan.method}: step {trainer.global_step}, checkpoint {trained}")
        print(f"evaluate it: {eval_command(cfg, plan.method, trained.resolve())}")
        return summary

    def _build(self, plan: TrainPlan, verifier: LoadedModel, drafter: LoadedModel | Drafter, vocab: int):
        from specbench.evaluation import eos_token_ids, pad_token_id

        eos = eos_token_ids(verifier.model, verifier.tokenizer)
        pad = pad_token_id(verifier.tokenizer, eos)
        if plan.method in ("eagle3", "dflash"):
            from specbench.training.objectives import build_training

            try:  # SFT or on-policy distillation (method.objective)
                return build_training(plan.method, self.cfg, verifier, vocab, eos, pad)
            except (FileNotFoundError, ValueError) as err:
                if isinstance(err, ConfigError):
                    raise
                raise ConfigError(" ".join(str(err).split())) from err
        if plan.method in ("sd2", "distill"):
            from specbench.training.drafter import build_drafter_training

            try:
                return build_drafter_training(self.cfg, plan.method, verifier, drafter, vocab, eos, pad)
            except (FileNotFoundError, ValueError) as err:
                if isinstance(err, ConfigError):
                    raise
                raise ConfigError(str(err)) from err
        from specbench.training.diversed import build_diversed_training

        prompts = self.prompts if self.prompts is not None else load_task_prompts(self.cfg.dataset)
        try:
            return build_diversed_training(self.cfg, verifier, drafter, prompts, vocab)
        except ValueError as err:  # bad train.* values, a dataset without per-sample rewards
            if isinstance(err, ConfigError):
                raise
            raise ConfigError(" ".join(str(err).split())) from err


# Where task=eval reads each method's trained part.
CHECKPOINT_KEYS = {
    "diversed": "method.head_checkpoint",
    "distill": "method.drafter_checkpoint",
    "sd2": "steering.checkpoint",
    "eagle3": "model.drafter.params.path",
    "dflash": "model.drafter.params.path",
}
# Overrides that only concern training (or this run's output dir), left out of the eval command.
TRAIN_ONLY = ("task", "train", "synth", "hydra", *CHECKPOINT_KEYS.values())


def eval_command(cfg, method: str, checkpoint: Path) -> str:
    """``python launch.py <this run's overrides, less the training ones> <checkpoint key>=PATH``: the one
    command that evaluates what this run trained (on the held-out part when it trained on
    ``subset=train``)."""
    import shlex

    from hydra.core.hydra_config import HydraConfig

    from specbench.tracking.naming import override_key

    typed = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    kept = [o for o in typed if not {override_key(o), override_key(o).split(".")[0]} & set(TRAIN_ONLY)]
    if not any(override_key(o) in ("method", "experiment") for o in kept):
        kept.insert(0, f"method={method}")
    if cfg.dataset.get("subset") == "train":
        kept.append("dataset.subset=heldout")
    kept.append(f"{CHECKPOINT_KEYS[method]}={checkpoint}")
    return "python launch.py " + " ".join(shlex.quote(o) for o in kept)


def _trainable(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _selected(snapshot, final: Path, trained: Path) -> Path:
    """``trained.pt``: the best validation step's snapshot, or the last step's weights when no validation
    ran (a run shorter than ``train.val_every_steps``)."""
    import shutil

    source = snapshot.path if snapshot.best_step is not None and snapshot.path.exists() else final
    partial = trained.with_name(trained.name + ".partial")
    shutil.copyfile(source, partial)
    partial.replace(trained)
    said = f"train.select_by={snapshot.metric}: {trained.name} is"
    if source == final:
        print(f"{said} the last step's weights (no validation ran)")
    else:
        print(f"{said} step {snapshot.best_step} ({snapshot.metric} = {snapshot.best:.4g}); the last step's "
              f"weights are in {final.name}")  # fmt: skip
    return trained
