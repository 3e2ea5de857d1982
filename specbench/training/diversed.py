"""Training the DIVERSED weight head (methods.md §5) with Lightning: only the head trains.

Policy: autoregressive decoding of the pooled distribution π_t = pool(p_t, q_t, w_t), where p_t / q_t
are the verifier's / drafter's warped next-token distributions and w_t = head(h_draft,t, h_verifier,t)
(both LMs frozen, run under no_grad with KV caches; gradients reach the head only). Rollouts are
sampled on-policy at ``train.rollout_temperature`` (> 0, default 1.0); 0 decodes greedily, which makes
REINFORCE biased (what the DIVERSED code did) and is only an option.

Loss (manual optimisation): sequence-level REINFORCE with an EMA reward baseline b,

    L = −mean_b[(R_b − b) · Σ_t log π(y_t)]  +  regulariser,

where the regulariser *rewards* acceptance, ``tv``: −λ · mean_t (1 − TV(q_t, π_t)) (for the linear pool
1 − TV(q, π) = 1 − (1 − w)·TV(p, q), the per-token acceptance of speculative sampling against π), or
``l2``: λ · (mean_t w_t − target_weight)². Rewards come from the dataset's scorer (ROUGE-2 F1, sentence
BLEU / 100, exact match, sandboxed pass/fail). The baseline is kept in the checkpoint, so a resumed run
continues with it.

The lead's ``task=train`` builds the pieces with :func:`build_diversed_training` and fits them with
:func:`specbench.training.trainer.build_trainer`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from specbench.data.datasets import dataset_settings, encode_sample
from specbench.data.prompts import Prompt
from specbench.decoding.cache import CachedModel
from specbench.decoding.diversed import DiversedRule, WeightHead, hidden_size, pair_metadata
from specbench.decoding.engine import GenerationSettings
from specbench.decoding.rules import EnsembleRule, pool_distributions
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping, sample
from specbench.evaluation import build_engines, eos_token_ids, pad_token_id
from specbench.models.loading import LoadedModel
from specbench.models.pair import shared_vocab_size
from specbench.scoring import SPEC_BENCH_SCORED, ScoringOptions, sample_rewards
from specbench.training.trainer import TrainedOnlyCheckpoint, warmup_cosine_scheduler

REGULARIZERS = ("tv", "l2")
REWARD_METRICS = ("rouge", "bleu", "exact_match", "pass@1", "spec_bench")
BASELINE_KEY = "diversed_baseline"
_TINY = 1e-30


# -- rollouts ------------------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """R rollouts of at most T tokens from the pooled policy.

    ``log_probs``, ``agreement`` and ``weights`` carry the head's graph; positions past a row's end
    (after its EOS or the token budget) are False in ``mask``.
    """

    tokens: torch.Tensor  # (R, T) long, pad after the end
    mask: torch.Tensor  # (R, T) bool
    log_probs: torch.Tensor  # (R, T) log π_t(y_t)
    agreement: torch.Tensor  # (R, T) 1 − TV(q_t, π_t): acceptance probability of a drafted token vs π_t
    weights: torch.Tensor  # (R, T) w_draft,t
    verifier_agreement: torch.Tensor  # (R, T) 1 − TV(p_t, q_t) (no grad): sd's acceptance at the same step

    def outputs(self) -> list[list[int]]:
        return [row[: int(n)] for row, n in zip(self.tokens.tolist(), self.mask.sum(dim=1).tolist())]


def pooled_log_prob_and_agreement(
    p: torch.Tensor, q: torch.Tensor, w: torch.Tensor, tokens: torch.Tensor, pool: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y) and 1 − TV(q, π) for π = pool(p, q, w), differentiable in ``w`` (shape (...,)); p, q (..., V).

    The linear pool uses closed forms (π(y) = (1−w)p(y) + wq(y); 1 − TV(q, π) = 1 − (1−w)·TV(p, q)), so
    its graph holds scalars per token, not vocabulary-sized tensors.
    """
    p_y = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if pool == "linear":
        q_y = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        tv = 0.5 * (p - q).abs().sum(dim=-1)
        pi_y = (1.0 - w) * p_y + w * q_y
        return torch.log(pi_y.clamp(min=_TINY)), 1.0 - (1.0 - w) * tv
    pi = pool_distributions(p, q, w.unsqueeze(-1), pool)
    pi_y = pi.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.log(pi_y.clamp(min=_TINY)), 1.0 - 0.5 * (q - pi).abs().sum(dim=-1)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        tokens[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        valid[row, width - len(prompt):] = True
    return tokens.to(device), valid.to(device)


def rollout(
    head: WeightHead,
    verifier: CachedModel,
    drafter: CachedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    warping: Warping,
    pool: str = "linear",
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    generator: torch.Generator | None = None,
) -> Rollout:
    """Decode ``prompts`` (a batch of token id lists) autoregressively from π_t = pool(p_t, q_t, w_t).

    Tokens are sampled from π (``warping.greedy``: argmax π). Both LMs run without grad through their KV
    caches; the returned log-probabilities, agreements and weights carry the head's graph.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = verifier.device
    tokens, valid = left_pad(prompts, pad_id, device)
    rows = tokens.shape[0]
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device)
    verifier.reset(rows)
    drafter.reset(rows)
    step_input, step_valid = tokens, valid
    alive = torch.ones(rows, dtype=torch.bool, device=device)
    out_tokens, masks, log_probs, agreements, weights, sd_agreements = [], [], [], [], [], []
    for step in range(max_new_tokens):
        v_out = verifier.forward(step_input, step_valid, output_hidden=True)
        d_out = drafter.forward(step_input, step_valid, output_hidden=True)
        with torch.no_grad():
            p = warping.probs(v_out.logits[:, -1])
            q = warping.probs(d_out.logits[:, -1])
        w = head(d_out.hidden[:, -1], v_out.hidden[:, -1]).to(device)
        with torch.no_grad():
            pi = pool_distributions(p, q, w.detach().unsqueeze(-1), pool)
            token = pi.argmax(dim=-1) if warping.greedy else sample(pi, generator)
            token = torch.where(alive, token, torch.full_like(token, pad_id))
            sd_agreements.append(1.0 - 0.5 * (p - q).abs().sum(dim=-1))
        log_prob, agreement = pooled_log_prob_and_agreement(p, q, w, token, pool)
        out_tokens.append(token)
        masks.append(alive.clone())
        log_probs.append(log_prob)
        agreements.append(agreement)
        weights.append(w)
        if eos.numel():
            alive = alive & ~torch.isin(token, eos)
        if step == max_new_tokens - 1 or not bool(alive.any()):
            break
        step_input, step_valid = token.unsqueeze(1), torch.ones(rows, 1, dtype=torch.bool, device=device)
    return Rollout(
        tokens=torch.stack(out_tokens, dim=1),
        mask=torch.stack(masks, dim=1),
        log_probs=torch.stack(log_probs, dim=1),
        agreement=torch.stack(agreements, dim=1),
        weights=torch.stack(weights, dim=1),
        verifier_agreement=torch.stack(sd_agreements, dim=1),
    )


# -- losses --------------------------------------------------------------------------------------------------


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def reinforce_loss(
    log_probs: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor, baseline: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(−mean_b[(R_b − b) · Σ_t log π(y_t)], advantages R − b); the advantages carry no gradient."""
    advantages = (rewards.to(log_probs.dtype) - baseline).detach()
    sequence_log_prob = (log_probs * mask.to(log_probs.dtype)).sum(dim=1)
    return -(advantages * sequence_log_prob).mean(), advantages


def regularizer_loss(
    kind: str, strength: float, agreement: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor,
    target_weight: float = 0.5,
) -> torch.Tensor:
    """``tv``: −λ · mean_t(1 − TV(q_t, π_t)) (minimising it raises acceptance); ``l2``: λ·(mean w − target)²."""
    if kind == "tv":
        return -strength * masked_mean(agreement, mask)
    if kind == "l2":
        return strength * (masked_mean(weights, mask) - target_weight) ** 2
    raise ValueError(f"train.regularizer: unknown {kind!r}; allowed: {list(REGULARIZERS)}")


def update_baseline(baseline: float | None, rewards: Sequence[float], ema: float) -> float:
    """EMA of the batch mean reward; the first batch sets it."""
    mean = float(sum(rewards) / len(rewards))
    return mean if baseline is None else ema * baseline + (1.0 - ema) * mean


# -- rewards -------------------------------------------------------------------------------------------------


@dataclass
class RewardSpec:
    """How rollouts of a dataset are scored: its metric, stop strings per prompt format, sandbox options."""

    metric: str
    stops: tuple[str, ...]
    options: ScoringOptions

    def __call__(self, texts: Sequence[str], items: Sequence[dict]) -> list[float]:
        """Per-sample rewards in [0, 1] of ``texts`` for the prompt ``items`` (see :class:`PromptItems`)."""
        rewards = [0.0] * len(texts)
        groups: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            metric = SPEC_BENCH_SCORED.get(item.get("category")) if self.metric == "spec_bench" else self.metric
            if metric is None or (metric != "pass@1" and item.get("reference") is None):
                continue  # nothing to score against: reward 0
            groups.setdefault(metric, []).append(i)
        for metric, chosen in groups.items():
            stops = () if items[chosen[0]]["format"] == "chat" else self.stops
            scores = sample_rewards(
                metric,
                [texts[i] for i in chosen],
                [items[i].get("reference") for i in chosen],
                metas=[items[i].get("meta") or {} for i in chosen],
                stops=stops,
                options=self.options,
            )
            for i, score in zip(chosen, scores):
                rewards[i] = float(score)
        return rewards


def reward_spec(cfg: Any) -> RewardSpec:
    """The reward of ``cfg.dataset`` (its metric must have per-sample rewards) with ``cfg.scoring`` options."""
    data = dataset_settings(cfg.dataset)
    metric, stops = data.scorer("plain")
    if metric not in REWARD_METRICS:
        raise ValueError(
            f"dataset.metric: DIVERSED training needs a per-sample reward, but dataset {data.name!r} has metric "
            f"{metric!r}; use a dataset with references (cnndm, xsum, wmt, gsm8k, humaneval, mbpp, spec_bench "
            "translation/math_reasoning) or set dataset.metric"
        )
    return RewardSpec(metric, tuple(stops), ScoringOptions.from_config(cfg.scoring))


# -- data ----------------------------------------------------------------------------------------------------


def prompt_items(tokenizer: Any, prompts: Sequence[Prompt], prompt_format: str = "auto") -> list[dict]:
    """Encoded prompts (as eval encodes them) with what the reward needs."""
    items = []
    for prompt in prompts:
        ids, fmt = encode_sample(tokenizer, prompt, prompt_format)
        items.append({
            "id": prompt.id, "ids": ids, "format": fmt, "reference": prompt.reference,
            "category": prompt.category, "meta": dict(getattr(prompt, "meta", {}) or {}),
        })  # fmt: skip
    return items


def _as_list(batch: list[dict]) -> list[dict]:
    return batch


class PromptDataModule(L.LightningDataModule):
    """Training prompts (shuffled, seeded, repeated over epochs) and a few held-out validation prompts."""

    def __init__(self, train_items: list[dict], val_items: list[dict], batch_size: int, seed: int = 0,
                 num_workers: int = 0) -> None:  # fmt: skip
        super().__init__()
        if not train_items:
            raise ValueError("DIVERSED training needs at least one training prompt")
        self.train_items = train_items
        self.val_items = val_items
        self.batch_size = batch_size
        self.seed = seed
        self.num_workers = num_workers

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_items, batch_size=self.batch_size, shuffle=True, generator=generator,
            collate_fn=_as_list, num_workers=self.num_workers,
        )  # fmt: skip

    def val_dataloader(self) -> DataLoader | list:
        if not self.val_items:
            return []
        return DataLoader(self.val_items, batch_size=self.batch_size, shuffle=False, collate_fn=_as_list)


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
            raise ValueError(f"train.regularizer: unknown {self.regularizer!r}; allowed: {list(REGULARIZERS)}")
        if self.rollout_temperature < 0:
            raise ValueError(f"train.rollout_temperature must be >= 0 (0 = greedy), got {self.rollout_temperature}")
        if self.rollouts_per_prompt < 1:
            raise ValueError(f"train.rollouts_per_prompt must be >= 1, got {self.rollouts_per_prompt}")
        if not 0.0 <= self.baseline_ema < 1.0:
            raise ValueError(f"train.baseline_ema must be in [0, 1), got {self.baseline_ema}")
        if self.regularizer_weight < 0:
            raise ValueError(f"train.regularizer_weight must be >= 0, got {self.regularizer_weight}")
        if not 0.0 <= self.target_weight <= 1.0:
            raise ValueError(f"train.target_weight must be in [0, 1], got {self.target_weight}")
        if self.max_new_tokens < 1:
            raise ValueError(f"gen.max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @classmethod
    def from_config(cls, cfg: Any) -> DiversedSettings:
        train, gen = cfg.train, cfg.gen
        return cls(
            pool=str(cfg.method.pool), max_new_tokens=int(gen.max_new_tokens),
            rollout_temperature=float(train.rollout_temperature), top_k=int(gen.top_k), top_p=float(gen.top_p),
            rollouts_per_prompt=int(train.rollouts_per_prompt), baseline_ema=float(train.baseline_ema),
            regularizer=str(train.regularizer), regularizer_weight=float(train.regularizer_weight),
            target_weight=float(train.target_weight), lr_start=float(train.lr_start),
            weight_decay=float(train.weight_decay), grad_clip=float(train.grad_clip or 0.0), seed=int(train.seed),
            gamma=int(cfg.schedule.gamma), schedule=str(cfg.schedule.name),
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
        drafter: LoadedModel,
        settings: DiversedSettings,
        reward: Callable[[Sequence[str], Sequence[dict]], list[float]],
        train_cfg: Any,
        extra_metadata: dict | None = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.settings = settings
        self.reward = reward
        self.train_cfg = train_cfg
        self._lms = {"verifier": verifier, "drafter": drafter}
        for lm in self._lms.values():
            lm.model.requires_grad_(False)
            lm.model.eval()
        self.head = WeightHead(hidden_size(drafter), hidden_size(verifier), seed=settings.seed)
        self.vocab_size = shared_vocab_size(verifier.model, drafter.model, verifier.tokenizer, drafter.tokenizer)
        self.eos_ids = eos_token_ids(verifier.model, verifier.tokenizer)
        self.pad_id = pad_token_id(verifier.tokenizer, self.eos_ids)
        self.baseline: float | None = None
        self.extra_metadata = dict(extra_metadata or {})
        self._cached: tuple[CachedModel, CachedModel] | None = None
        self._val_engine = None
        self._val_rows: list[tuple[float, int, int, float, int]] = []

    # -- pieces ---------------------------------------------------------------------------------------------

    @property
    def verifier(self) -> LoadedModel:
        return self._lms["verifier"]

    @property
    def drafter(self) -> LoadedModel:
        return self._lms["drafter"]

    def cached_models(self) -> tuple[CachedModel, CachedModel]:
        if self._cached is None:
            self._cached = (
                CachedModel(self.verifier.model, self.vocab_size),
                CachedModel(self.drafter.model, self.vocab_size),
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

    def compute_loss(self, items: Sequence[dict], generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
        """Rollouts of ``items`` (each repeated ``rollouts_per_prompt`` times), rewards, loss and logs.

        Updates the EMA baseline after computing the advantages with the previous one.
        """
        s = self.settings
        rows = [item for item in items for _ in range(s.rollouts_per_prompt)]
        result = self.rollout(rows, generator)
        outputs = result.outputs()
        rewards = self.reward(self.decode(outputs), rows)
        reward_tensor = torch.tensor(rewards, dtype=torch.float32, device=result.log_probs.device)
        baseline = self.baseline if self.baseline is not None else float(reward_tensor.mean())
        pg_loss, advantages = reinforce_loss(result.log_probs, result.mask, reward_tensor, baseline)
        reg_loss = regularizer_loss(
            s.regularizer, s.regularizer_weight, result.agreement, result.weights, result.mask, s.target_weight
        )
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

    def training_step(self, batch: list[dict], batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        loss, logs = self.compute_loss(batch, self._generator(int(self.trainer.global_step)))
        optimizer.zero_grad()
        self.manual_backward(loss)
        if self.settings.grad_clip > 0:
            self.clip_gradients(optimizer, gradient_clip_val=self.settings.grad_clip, gradient_clip_algorithm="norm")
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
                max_new_tokens=s.max_new_tokens, temperature=s.rollout_temperature, top_k=s.top_k, top_p=s.top_p,
                seed=s.seed,
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


def split_validation(prompts: Sequence[Prompt], count: int, seed: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """(training, validation): ``count`` prompts picked with ``seed`` (kept out of training); training keeps ≥ 1."""
    prompts = list(prompts)
    count = max(0, min(count, len(prompts) - 1))
    if count == 0:
        return prompts, []
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed)).tolist()
    held = set(order[:count])
    return [p for i, p in enumerate(prompts) if i not in held], [p for i, p in enumerate(prompts) if i in held]


def build_diversed_training(
    cfg: Any, verifier: LoadedModel, drafter: LoadedModel, prompts: list[Prompt]
) -> tuple[DiversedModule, PromptDataModule]:
    """The LightningModule (head + frozen pair) and DataModule of ``task=train method=diversed``.

    ``prompts`` are the training part of ``cfg.dataset``; ``train.val_prompts`` of them are held out for
    validation (reward and acceptance of speculative decoding with the current head).
    """
    if drafter is None:
        raise ValueError("method=diversed trains a head over a verifier/drafter pair: model.drafter is 'none'")
    settings = DiversedSettings.from_config(cfg)
    reward = reward_spec(cfg)
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
        "reward_metric": reward.metric,
        "train_prompts": len(train_items),
        "val_prompts": len(val_items),
    }
    module = DiversedModule(verifier, drafter, settings, reward, cfg.train, extra)
    datamodule = PromptDataModule(
        train_items, val_items, int(cfg.train.batch_size), int(cfg.train.seed), int(cfg.train.num_workers)
    )
    return module, datamodule


__all__ = [
    "DiversedModule",
    "DiversedSettings",
    "PromptDataModule",
    "RewardSpec",
    "Rollout",
    "build_diversed_training",
    "masked_mean",
    "pooled_log_prob_and_agreement",
    "regularizer_loss",
    "reinforce_loss",
    "reward_spec",
    "rollout",
    "split_validation",
    "update_baseline",
]
