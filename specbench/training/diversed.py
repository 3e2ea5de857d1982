"""Training the DIVERSED weight head (methods.md §5) with Lightning: only the head trains.

Policy: autoregressive decoding of the pooled distribution π_t = pool(p_t, q_t, w_t), where p_t / q_t
are the verifier's / drafter's warped next-token distributions and w_t = head(h_draft,t, h_verifier,t)
(both LMs frozen; gradients reach the head only). Rollouts (:mod:`specbench.training.diversed_rollout`) run
through the engine's verifier cache and drafter objects, so any drafter with hidden states works (a model
drafter, an SD²-steered one, an EAGLE-3 head). They are sampled on-policy at ``train.rollout_temperature``
(> 0, default 1.0); 0 decodes greedily, which makes REINFORCE biased (what the DIVERSED code did) and is only
an option. The loss is in :mod:`specbench.training.diversed_objective`, the rewards in
:mod:`specbench.training.diversed_rewards`, the prompt data in :mod:`specbench.training.prompt_data`. The
reward baseline is kept in the checkpoint, so a resumed run continues with it.

``task=train`` builds the pieces with :func:`build_diversed_training` and fits them with
:func:`specbench.training.trainer.build_trainer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from specbench.data.dataset_config import dataset_settings
from specbench.data.prompts import Prompt
from specbench.decoding.cache import CachedModel
from specbench.decoding.diversed import DiversedRule, WeightHead, hidden_size, pair_metadata
from specbench.decoding.engine import GenerationSettings
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.protocol import Drafter
from specbench.decoding.rules import EnsembleRule
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping
from specbench.evaluation import build_engines, eos_token_ids, pad_token_id
from specbench.models.loading import LoadedModel, pair_vocab_size
from specbench.training.diversed_objective import (
    REGULARIZERS,
    gate_loss,
    masked_mean,
    regularizer_loss,
    reinforce_loss,
    update_baseline,
)
from specbench.training.diversed_rewards import reward_spec
from specbench.training.diversed_rollout import Rollout, rollout
from specbench.training.prompt_data import PromptDataModule, prompt_items, split_validation
from specbench.training.trainer import TrainedOnlyCheckpoint, warmup_cosine_scheduler
from specbench.values import DIVERSED_REWARDS

BASELINE_KEY = "diversed_baseline"


# -- the LightningModule -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiversedSettings:
    """The ``train:`` / ``gen:`` / ``method:`` values the module uses (checked)."""

    pool: str = "linear"
    max_new_tokens: int = 64
    rollout_temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    rollouts_per_prompt: int = 1
    baseline_ema: float = 0.9
    regularizer: str = "tv"
    regularizer_weight: float = 0.1
    target_weight: float = 0.5
    reward: str = "task"  # task: the dataset's scorer | verifier_logp: mean log p_verifier of the rollout
    reward_weight: float = 1.0  # scale of the REINFORCE term (0: the regulariser alone)
    lr_start: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    seed: int = 0
    gamma: int = 3  # validation: speculative decoding with this draft length
    schedule: str = "constant"

    def __post_init__(self) -> None:
        if self.pool not in EnsembleRule.POOLS:
            raise ValueError(f"method.pool: unknown pool {self.pool!r}; allowed: {list(EnsembleRule.POOLS)}")
        if self.regularizer not in REGULARIZERS:
            raise ValueError(
                f"train.regularizer: unknown {self.regularizer!r}; allowed: {list(REGULARIZERS)}"
            )
        if self.rollout_temperature < 0:
            raise ValueError(
                f"train.rollout_temperature must be >= 0 (0 = greedy), got {self.rollout_temperature}"
            )
        if self.rollouts_per_prompt < 1:
            raise ValueError(f"train.rollouts_per_prompt must be >= 1, got {self.rollouts_per_prompt}")
        if not 0.0 <= self.baseline_ema < 1.0:
            raise ValueError(f"train.baseline_ema must be in [0, 1), got {self.baseline_ema}")
        if self.reward not in DIVERSED_REWARDS:
            raise ValueError(f"train.reward: unknown {self.reward!r}; allowed: {list(DIVERSED_REWARDS)}")
        if self.reward_weight < 0:
            raise ValueError(f"train.reward_weight must be >= 0, got {self.reward_weight}")
        if self.regularizer_weight < 0:
            raise ValueError(f"train.regularizer_weight must be >= 0, got {self.regularizer_weight}")
        if not 0.0 <= self.target_weight <= 1.0:
            raise ValueError(f"train.target_weight must be in [0, 1], got {self.target_weight}")
        if self.max_new_tokens < 1:
            raise ValueError(f"gen.max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @classmethod
    def from_config(cls, cfg: Any) -> DiversedSettings:
        from specbench.config.train_checks import resolved_reward as _reward
        train, gen = cfg.train, cfg.gen
        return cls(
            pool=str(cfg.method.pool), max_new_tokens=int(gen.max_new_tokens),
            rollout_temperature=float(train.rollout_temperature), top_k=int(gen.top_k),
            top_p=float(gen.top_p), rollouts_per_prompt=int(train.rollouts_per_prompt),
            baseline_ema=float(train.baseline_ema), regularizer=str(train.regularizer),
            regularizer_weight=float(train.regularizer_weight), target_weight=float(train.target_weight),
            reward=_reward(cfg), reward_weight=float(train.reward_weight), lr_start=float(train.lr_start),
            weight_decay=float(train.weight_decay), grad_clip=float(train.grad_clip or 0.0),
            seed=int(train.seed), gamma=int(cfg.schedule.gamma), schedule=str(cfg.schedule.name),
        )  # fmt: skip

    @property
    def warping(self) -> Warping:
        return Warping(self.rollout_temperature, self.top_k, self.top_p)


class DiversedModule(TrainedOnlyCheckpoint, L.LightningModule):
    """The DIVERSED head trained by REINFORCE on rollouts of the pooled policy; the two LMs stay frozen.

    The LMs are held outside the module tree (not submodules): Lightning neither moves, re-modes nor
    saves them; checkpoints hold the head, the metadata and the reward baseline.
    """

    def __init__(
        self,
        verifier: LoadedModel,
        drafter: LoadedModel | Drafter,
        settings: DiversedSettings,
        vocab_size: int,
        reward: Callable[[Sequence[str], Sequence[dict]], list[float]] | None,
        train_cfg: Any,
        extra_metadata: dict | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.settings = settings
        self.reward = reward
        self.train_cfg = train_cfg
        self._lms = {"verifier": verifier, "drafter": drafter}
        for part in (verifier.model, getattr(drafter, "model", None), getattr(drafter, "head", None)):
            if isinstance(part, torch.nn.Module):
                part.requires_grad_(False)
                part.eval()
        self.head = WeightHead(hidden_size(drafter), hidden_size(verifier), seed=settings.seed)
        self.vocab_size = int(vocab_size)
        self.eos_ids = eos_token_ids(verifier.model, verifier.tokenizer)
        self.pad_id = pad_token_id(verifier.tokenizer, self.eos_ids)
        self.baseline: float | None = None
        self.extra_metadata = dict(extra_metadata or {})
        self._cached: tuple[CachedModel, Drafter] | None = None
        self._val_engine = None
        self._val_rows: list[tuple[float, int, int, float, int]] = []

    # -- pieces ---------------------------------------------------------------------------------------------

    @property
    def verifier(self) -> LoadedModel:
        return self._lms["verifier"]

    @property
    def drafter(self) -> LoadedModel | Drafter:
        return self._lms["drafter"]

    def cached_models(self) -> tuple[CachedModel, Drafter]:
        """The verifier's cache and the drafter object the rollouts decode with (the engine's kinds)."""
        if self._cached is None:
            drafter = self.drafter
            self._cached = (
                CachedModel(self.verifier.model, self.vocab_size),
                drafter if isinstance(drafter, Drafter) else ModelDrafter(drafter.model, self.vocab_size),
            )
        return self._cached

    def rule(self) -> DiversedRule:
        """A decoding rule sharing this module's head (for evaluation during training)."""
        return DiversedRule(self.head, self.settings.pool, self.metadata())

    def metadata(self) -> dict:
        steps = int(self.trainer.global_step) if self._trainer is not None else 0
        s = self.settings
        return {
            **pair_metadata(self.verifier, self.drafter, s.pool),
            "trained_steps": steps,
            "rollout_temperature": s.rollout_temperature,
            "rollouts_per_prompt": s.rollouts_per_prompt,
            "max_new_tokens": s.max_new_tokens,
            "regularizer": s.regularizer,
            "regularizer_weight": s.regularizer_weight,
            "target_weight": s.target_weight,
            "reward": s.reward,
            "reward_weight": s.reward_weight,
            "baseline_ema": s.baseline_ema,
            "reward_baseline": self.baseline,
            **self.extra_metadata,
        }

    def _generator(self, salt: int) -> torch.Generator:
        generator = torch.Generator(device=self.verifier.model.device)
        generator.manual_seed((self.settings.seed * 1_000_003 + salt) % (2**63))
        return generator

    def rollout(self, items: Sequence[dict], generator: torch.Generator | None = None) -> Rollout:
        verifier, drafter = self.cached_models()
        with torch.autocast(device_type=verifier.device.type, enabled=False):
            return rollout(
                self.head, verifier, drafter, [item["ids"] for item in items], self.settings.max_new_tokens,
                self.settings.warping, self.settings.pool, self.eos_ids, self.pad_id, generator,
            )  # fmt: skip

    def decode(self, outputs: Sequence[Sequence[int]]) -> list[str]:
        return [self.verifier.tokenizer.decode(list(ids), skip_special_tokens=True) for ids in outputs]

    # -- Lightning ------------------------------------------------------------------------------------------

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(
            self.head.parameters(), lr=self.settings.lr_start, weight_decay=self.settings.weight_decay
        )
        return {"optimizer": optimizer, "lr_scheduler": warmup_cosine_scheduler(optimizer, self.train_cfg)}

    def compute_loss(
        self, items: Sequence[dict], generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Rollouts of ``items`` (each repeated ``rollouts_per_prompt`` times), rewards, loss and logs.

        Updates the EMA baseline after computing the advantages with the previous one.
        """
        s = self.settings
        rows = [item for item in items for _ in range(s.rollouts_per_prompt)]
        result = self.rollout(rows, generator)
        rewards = self.rewards_of(result, rows)
        reward_tensor = torch.tensor(rewards, dtype=torch.float32, device=result.log_probs.device)
        baseline = self.baseline if self.baseline is not None else float(reward_tensor.mean())
        if s.reward == "expected_verifier_logp":  # the per-token expectation itself is the objective
            pg_loss = -masked_mean(result.expected_verifier_log_probs, result.mask)
            advantages = (reward_tensor - baseline).detach()
        elif s.reward == "per_token_gate":
            pg_loss = gate_loss(result, s.regularizer_weight)
            advantages = (reward_tensor - baseline).detach()
        else:
            pg_loss, advantages = reinforce_loss(result.log_probs, result.mask, reward_tensor, baseline)
        pg_loss = s.reward_weight * pg_loss
        reg_loss = (
            regularizer_loss(
                s.regularizer,
                s.regularizer_weight,
                result.agreement,
                result.weights,
                result.mask,
                s.target_weight,
            )
            if s.reward != "per_token_gate"
            else torch.zeros((), device=pg_loss.device)
        )  # λ sets the gate instead
        self.baseline = update_baseline(self.baseline, rewards, s.baseline_ema)
        mask = result.mask
        logs = {
            "reward": reward_tensor.mean(),
            "advantage": advantages.mean(),
            "advantage_abs": advantages.abs().mean(),
            "baseline": torch.tensor(baseline),
            "mean_draft_weight": masked_mean(result.weights.detach(), mask),
            "acceptance_proxy": masked_mean(result.agreement.detach(), mask),  # mean 1 − TV(q, π)
            "sd_acceptance_proxy": masked_mean(result.verifier_agreement, mask),  # mean 1 − TV(q, p)
            "loss_pg": pg_loss.detach(),
            "loss_reg": reg_loss.detach(),
            "rollout_tokens": mask.sum(dim=1).float().mean(),
        }
        return pg_loss + reg_loss, logs

    def rewards_of(self, result: Rollout, items: Sequence[dict]) -> list[float]:
        """Per-rollout rewards: the dataset's scorer on the decoded texts, or the verifier's
        log-likelihood."""
        if self.settings.reward != "task":
            return result.mean_verifier_log_prob()
        return self.reward(self.decode(result.outputs()), items)

    def training_step(self, batch: list[dict], batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        loss, logs = self.compute_loss(batch, self._generator(int(self.trainer.global_step)))
        optimizer.zero_grad()
        self.manual_backward(loss)
        if self.settings.grad_clip > 0:
            self.clip_gradients(
                optimizer, gradient_clip_val=self.settings.grad_clip, gradient_clip_algorithm="norm"
            )
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        size = len(batch) * self.settings.rollouts_per_prompt
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=size)
        for key, value in logs.items():
            self.log(f"train/{key}", value, prog_bar=key in ("reward", "mean_draft_weight"), batch_size=size)
        lr = scheduler.get_last_lr()[0] if scheduler is not None else self.settings.lr_start
        self.log("train/lr", float(lr), batch_size=size)
        return loss.detach()

    def _engine(self):
        if self._val_engine is None:
            s = self.settings
            settings = GenerationSettings(
                max_new_tokens=s.max_new_tokens, temperature=s.rollout_temperature, top_k=s.top_k,
                top_p=s.top_p, seed=s.seed,
            )  # fmt: skip
            schedule = DraftSchedule(s.schedule, gamma=s.gamma, max_gamma=max(s.gamma, 16))
            self._val_engine, _ = build_engines(self.verifier, self.drafter, self.rule(), schedule, settings,
                                                baseline=False)  # fmt: skip
        return self._val_engine

    def on_validation_epoch_start(self) -> None:
        self._val_rows = []
        self._engine().reseed(self.settings.seed)

    def validation_step(self, batch: list[dict], batch_idx: int) -> None:
        """Speculative decoding with the current head: reward and acceptance rate on held-out prompts."""
        with torch.autocast(device_type=self.verifier.model.device.type, enabled=False):
            results = self._engine().generate([item["ids"] for item in batch])
        if self.settings.reward != "task":
            rewards = [r.verifier_logp or 0.0 for r in results]
        else:
            rewards = self.reward(self.decode([r.output_ids for r in results]), batch)
        for reward, result in zip(rewards, results):
            drafted = sum(r.drafted for r in result.rounds)
            accepted = sum(r.accepted for r in result.rounds)
            weights = [w for r in result.rounds for w in (r.draft_weights or ())]
            self._val_rows.append((reward, drafted, accepted, sum(weights), len(weights)))

    def on_validation_epoch_end(self) -> None:
        rows = self._val_rows
        if not rows:
            return
        drafted = sum(r[1] for r in rows)
        count = sum(r[4] for r in rows)
        self.log("val/reward", sum(r[0] for r in rows) / len(rows))
        self.log("val/acceptance_rate", sum(r[2] for r in rows) / drafted if drafted else 0.0)
        self.log("val/mean_draft_weight", sum(r[3] for r in rows) / count if count else 0.5)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[BASELINE_KEY] = self.baseline

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.baseline = checkpoint.get(BASELINE_KEY)


def build_diversed_training(
    cfg: Any, verifier: LoadedModel, drafter: LoadedModel | Drafter, prompts: list[Prompt],
    vocab_size: int | None = None,
) -> tuple[DiversedModule, PromptDataModule]:
    """The LightningModule (head + frozen pair) and DataModule of ``task=train method=diversed``.

    ``prompts`` are the training part of ``cfg.dataset``; ``train.val_prompts`` of them are held out for
    validation (reward and acceptance of speculative decoding with the current head).
    """
    if drafter is None:
        raise ValueError(
            "method=diversed trains a head over a verifier/drafter pair: model.drafter is 'none'"
        )
    settings = DiversedSettings.from_config(cfg)
    reward = reward_spec(cfg) if settings.reward == "task" else None
    if settings.rollout_temperature == 0:
        import warnings

        warnings.warn(
            "train.rollout_temperature=0: greedy rollouts make the REINFORCE gradient biased (methods.md §5)",
            stacklevel=2,
        )
    train_prompts, val_prompts = split_validation(prompts, int(cfg.train.val_prompts), int(cfg.train.seed))
    fmt = str(cfg.dataset.prompt_format)
    train_items = prompt_items(verifier.tokenizer, train_prompts, fmt)
    val_items = prompt_items(verifier.tokenizer, val_prompts, fmt)
    data = dataset_settings(cfg.dataset)
    extra = {
        "dataset": data.name,
        "dataset_subset": data.subset,
        "reward_metric": reward.metric if reward is not None else settings.reward,
        "train_prompts": len(train_items),
        "val_prompts": len(val_items),
    }
    vocab_size = vocab_size if vocab_size is not None else pair_vocab_size(verifier, drafter)
    module = DiversedModule(verifier, drafter, settings, vocab_size, reward, cfg.train, extra)
    datamodule = PromptDataModule(
        train_items, val_items, int(cfg.train.batch_size), int(cfg.train.seed), int(cfg.train.num_workers)
    )
    return module, datamodule


__all__ = ["BASELINE_KEY", "DiversedModule", "DiversedSettings", "build_diversed_training"]

