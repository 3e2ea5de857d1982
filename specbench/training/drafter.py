"""Distillation and SD² training of a drafter on synthetic verifier samples (methods.md §4, §6).

Per batch: the frozen verifier's next-token distributions (and, for SD², its features at
``v_layers``) under no_grad; the drafter's distributions, steered (SD²) by the verifier feature
``offset`` positions back; a divergence averaged over the response positions (loss mask).

``train.feature_cache=DIR``: the verifier's part (targets and taps) is computed once into the disk cache
of :mod:`specbench.training.features`, which a distillation and an SD² run on the same data share; a
training step then runs only the drafter. With a reduced draft vocabulary (``model.drafter.draft_vocab``)
the targets are the verifier's distribution restricted to it and renormalised (as EAGLE-3's) and the
drafter computes only its LM head's draft rows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specbench.decoding.model_drafter import ModelDrafter, draft_logits
from specbench.drafters.sd2 import SD2Drafter
from specbench.drafters.steering import SteeredDrafter
from specbench.models.draft_vocab import DraftVocab
from specbench.training.batches import TargetSpec, verifier_targets
from specbench.training.features import FeatureCache
from specbench.training.synth_data import SyntheticDataModule
from specbench.training.trainer import VerifierTraining
from specbench.training.validation import speculative_tau
from specbench.values import TOP_K_RKL, TRAIN_LOSSES

LOSSES = TRAIN_LOSSES
OFFSET_MODES = ("random", "blocked")


def divergence(
    p_logits: torch.Tensor, q_logits: torch.Tensor, kind: str, index: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-position divergence between verifier (p) and drafter (q) logits (N, V) → (N,).

    ``index`` (N, K): ``p_logits`` (N, K) are the verifier's top-K logits at these columns of ``q_logits``
    (top-k targets); p is their softmax there and 0 elsewhere, so ``rkl`` (infinite) is refused and
    ``tvd`` adds the drafter's mass outside the top-K."""
    if kind not in LOSSES:
        raise ValueError(f"train.loss must be one of {list(LOSSES)}, got {kind!r}")
    if index is not None and kind == "rkl":
        raise ValueError(TOP_K_RKL)
    log_p = F.log_softmax(p_logits.float(), dim=-1)
    log_q = F.log_softmax(q_logits.float(), dim=-1)
    if index is not None:
        log_q = log_q.gather(-1, index)
    if kind == "kl":
        return (log_p.exp() * (log_p - log_q)).sum(-1)
    if kind == "rkl":
        return (log_q.exp() * (log_q - log_p)).sum(-1)
    tvd = 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)
    if index is not None:
        tvd = tvd + 0.5 * (1.0 - log_q.exp().sum(-1)).clamp(min=0.0)
    return tvd


def predict_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) positions whose next token is a response token: position t predicts token t + 1."""
    mask = torch.zeros_like(loss_mask, dtype=torch.bool)
    mask[:, :-1] = loss_mask[:, 1:].bool()
    return mask


def steering_sources(
    mode: str, offset: int, prompt_len: torch.Tensor, length: int, max_offset: int, phase: int = 0
) -> torch.Tensor:
    """(B, T) position of the verifier feature that steers each drafter position; -1: not steered.

    ``random``: position t is steered by t − offset (one offset per batch, in [1, k]).
    ``blocked``: response positions fall into rounds of k (the first one shortened by ``phase``), as in
    decoding; a position is steered by the position just before its round's first position, so its
    distance to the source runs 1..k within the round.
    """
    positions = torch.arange(length, device=prompt_len.device).unsqueeze(0).expand(prompt_len.shape[0], -1)
    if mode == "random":
        sources = positions - offset
    elif mode == "blocked":
        first = (prompt_len - 1).unsqueeze(1)  # the first position that predicts a response token
        rel = positions - first
        start = torch.where(
            rel < max_offset - phase,
            0,
            torch.div(rel + phase, max_offset, rounding_mode="floor") * max_offset - phase,
        )
        sources = first + start - 1
        sources = torch.where(rel >= 0, sources, torch.full_like(sources, -1))
    else:
        raise ValueError(f"train.offset must be one of {list(OFFSET_MODES)}, got {mode!r}")
    return torch.where(sources >= 0, sources, torch.full_like(sources, -1))


class DrafterTraining(VerifierTraining):
    """Train a drafter (distillation) or a steered drafter (SD²) against a frozen verifier.

    ``targets``: what the drafter learns, the verifier's distribution over ``targets.vocab`` (restricted
    and renormalised; the top ``targets.top_k`` of it) — default: the full ``vocab_size`` vocabulary. A
    reduced vocabulary makes the drafter compute only its LM head's draft rows (:func:`draft_logits`). A
    batch that carries ``target_values`` (the feature cache, :func:`collate_cached`) is used as it is;
    otherwise the verifier runs on it (:func:`verifier_targets`)."""

    def __init__(
        self,
        verifier: PreTrainedModel,
        drafter: PreTrainedModel,
        steering: SteeredDrafter | None,
        train: Any,
        vocab_size: int,
        metadata: dict,
        val_prompts: list[list[int]] = (),
        eos_token_ids: list[int] = (),
        pad_token_id: int = 0,
        targets: TargetSpec | None = None,
    ):
        super().__init__(verifier, train, metadata, val_prompts, eos_token_ids, pad_token_id)
        self.drafter = drafter
        self.steering = steering
        self.vocab_size = vocab_size
        self.targets = targets or TargetSpec(DraftVocab.full(vocab_size))
        if self.targets.vocab.vocab_size != vocab_size:
            raise ValueError(
                f"the targets' vocabulary covers {self.targets.vocab.vocab_size} ids, the pair {vocab_size}"
            )
        self.taps = tuple(steering.spec.v_layers) if steering is not None else ()

    def _offset(self, training: bool, batch_idx: int) -> tuple[int, int]:
        """(offset, blocked-mode phase) for this batch: seeded by step, so a resumed run draws the same."""
        k = self.train_cfg.max_offset
        if not training:
            return 1 + batch_idx % k, 0
        generator = self.step_generator()
        offset = int(torch.randint(1, k + 1, (1,), generator=generator))
        phase = int(torch.randint(0, k, (1,), generator=generator))
        return offset, phase

    @property
    def draft_vocab(self) -> DraftVocab | None:
        """The reduced draft vocabulary the drafter learns and drafts over (None: the full vocabulary)."""
        return None if self.targets.vocab.is_full else self.targets.vocab

    def drafter_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, draft vocabulary) logits of the drafter's final-normed hidden states (N, H)."""
        if self.draft_vocab is None:
            return self.drafter.get_output_embeddings()(hidden)[:, : self.vocab_size]
        return draft_logits(self.drafter, self.draft_vocab, hidden)

    def losses(self, batch: dict[str, torch.Tensor], offset: int, phase: int = 0) -> dict[str, torch.Tensor]:
        """Loss, TVD and the count of the response-predicting positions of one batch; the verifier's part
        (``predict``, ``target_values`` / ``target_index`` packed, ``features``) from the batch when it
        carries it (the feature cache), else from a verifier pass."""
        if "target_values" not in batch:
            batch = {**batch, **verifier_targets(self.verifier, batch, self.taps, self.targets)}
        ids, attention, predicting = batch["input_ids"], batch["attention_mask"], batch["predict"]
        if self.steering is not None:
            sources = steering_sources(
                self.train_cfg.offset,
                offset,
                batch["prompt_len"],
                ids.shape[1],
                self.train_cfg.max_offset,
                phase,
            )
            steered = predicting & (sources >= 0)
            features = batch["features"]
            index = sources.clamp(min=0).unsqueeze(-1).expand(-1, -1, features.shape[-1])
            deltas = self.steering.deltas(torch.gather(features, 1, index), steered)
            with self.steering.steer(deltas):
                d_out = self.drafter.base_model(input_ids=ids, attention_mask=attention)
        else:
            d_out = self.drafter.base_model(input_ids=ids, attention_mask=attention)
        q_logits = self.drafter_logits(d_out.last_hidden_state[predicting])
        p_logits, p_index = batch["target_values"], batch.get("target_index")
        per_position = divergence(p_logits, q_logits, self.train_cfg.loss, p_index)
        with torch.no_grad():
            tvd = divergence(p_logits, q_logits, "tvd", p_index).mean()
        return {"loss": per_position.mean(), "tvd": tvd, "positions": predicting.sum()}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        offset, phase = self._offset(True, batch_idx)
        out = self.losses(batch, offset, phase)
        size = batch["input_ids"].shape[0]
        self.log("train/loss", out["loss"], prog_bar=True, batch_size=size)
        self.log("train/tvd", out["tvd"], batch_size=size)
        self.log("train/offset", float(offset), batch_size=size)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=size)
        return out["loss"]

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        offset, phase = self._offset(False, batch_idx)
        out = self.losses(batch, offset, phase)
        size = batch["input_ids"].shape[0]
        self.log("val/loss", out["loss"], batch_size=size, sync_dist=True)
        self.log("val/tvd", out["tvd"], batch_size=size, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        if self.val_prompts and not self.trainer.sanity_checking:
            tau = speculative_tau(self, self, tau_drafter(self), self.train_cfg.max_offset, self.vocab_size)
            self.log("val/tau", tau, rank_zero_only=True)


def tau_drafter(module: DrafterTraining) -> SD2Drafter | ModelDrafter:
    """The drafter ``val/tau`` decodes with: the module's steered or plain model as the engine takes it."""
    if module.steering is not None:
        return SD2Drafter(module.steering, module.vocab_size, draft_vocab=module.draft_vocab)
    return ModelDrafter(module.drafter, module.vocab_size, draft_vocab=module.draft_vocab)


def build_drafter_training(
    cfg: Any, method: str, verifier: Any, drafter: Any, vocab_size: int, eos_ids: list[int], pad_id: int
) -> tuple[DrafterTraining, SyntheticDataModule]:
    """The LightningModule and DataModule of ``task=train method=sd2|distill`` (LoadedModel pair in).

    ``drafter.draft_vocab`` (``model.drafter.draft_vocab``): train over that reduced vocabulary (recorded
    in the checkpoint). ``train.feature_cache=DIR``: the verifier's targets and taps come from that cache,
    built on first use (:func:`feature_cache_for`)."""
    from specbench.data.synth_dataset import load_synthetic
    from specbench.decoding.model_drafter import check_draft_vocab
    from specbench.drafters.steering import resolve_spec
    from specbench.drafters.trained import LoraSettings, pair_metadata, trainable_drafter
    from specbench.models.draft_vocab import count_response_tokens, vocab_metadata
    from specbench.models.pair import tokenizer_hash

    train, steering_cfg = cfg.train, cfg.steering
    data, data_meta = load_synthetic(str(train.data))
    check_synthetic_source(data_meta, verifier.name, tokenizer_hash(verifier.tokenizer), train.data)
    finetune = steering_cfg.finetune_drafter
    lora = LoraSettings(train.lora_rank, train.lora_alpha) if finetune == "lora" else None
    model = trainable_drafter(drafter.model, verifier.model, finetune, lora)
    model.train()
    draft_vocab = getattr(drafter, "draft_vocab", None)
    if draft_vocab is not None:
        check_draft_vocab(model, draft_vocab, vocab_size)
    top_k = getattr(train, "feature_top_k", None)
    if top_k and train.loss == "rkl":
        raise ValueError(TOP_K_RKL)
    targets = TargetSpec(draft_vocab or DraftVocab.full(vocab_size), int(top_k) if top_k else None)
    steering = None
    if method == "sd2":
        d_layers = steering_cfg.d_layers if steering_cfg.d_layers == "all" else list(steering_cfg.d_layers)
        spec = resolve_spec(
            verifier.model,
            model,
            list(steering_cfg.v_layers),
            steering_cfg.guide_method,
            d_layers,
            steering_cfg.rank,
        )
        steering = SteeredDrafter(model, spec)
    cache_dir = getattr(train, "feature_cache", None)
    cache = feature_cache_for(cfg, verifier, data, steering, targets, pad_id) if cache_dir else None
    vocab_info = {}
    if draft_vocab is not None:
        counts = count_response_tokens(zip(data["train"]["input_ids"], data["train"]["loss_mask"]))
        vocab_info = {
            **vocab_metadata(draft_vocab),
            "draft_vocab_coverage": round(draft_vocab.coverage(counts), 6),
        }
    metadata = {
        "method": method,
        **pair_metadata(verifier, drafter, vocab_size),
        "finetune_drafter": finetune,
        "lora": lora.to_dict() if lora else None,
        "steering": steering.spec.to_dict() if steering else None,
        "steering_parameters": steering.num_parameters() if steering else 0,
        "loss": train.loss,
        "offset": train.offset,
        "max_offset": train.max_offset,
        "data": str(train.data),
        "data_rows": {split: len(data[split]) for split in data},
        **vocab_info,
        "feature_top_k": targets.top_k,
        "feature_cache": str(Path(cache_dir).expanduser()) if cache_dir else None,
    }
    val_prompts = [
        row["input_ids"][: row["prompt_len"]]
        for row in data["validation"].select(range(min(train.val_prompts, len(data["validation"]))))
    ]
    module = DrafterTraining(
        verifier.model, model, steering, train, vocab_size, metadata, val_prompts, eos_ids, pad_id, targets
    )
    datamodule = SyntheticDataModule(data, train.batch_size, pad_id, train.seed, train.num_workers, cache)
    return module, datamodule


def feature_cache_for(
    cfg: Any, verifier: Any, data: Any, steering: SteeredDrafter | None, targets: TargetSpec, pad_id: int
) -> Callable[[], FeatureCache]:
    """What builds (first call) or opens ``train.feature_cache`` for a distill / SD² run; a directory
    that cannot serve it (another verifier, other data or targets) is refused now, before training.

    The cache holds the targets and the taps ``steering.v_layers`` for both methods: a distillation run
    stores them too (it reads none), so the SD² run of the same data and settings reuses its cache, and
    the other way round."""
    from specbench.models.taps import check_taps
    from specbench.training.feature_build import build_feature_cache
    from specbench.training.features import cache_identity, open_feature_cache

    train = cfg.train
    directory = str(train.feature_cache)
    if steering is not None:
        stored = tuple(steering.spec.v_layers)
    else:
        key = "steering.v_layers (the taps a distill run's train.feature_cache stores for SD² runs)"
        stored = check_taps(verifier.model, list(getattr(cfg.steering, "v_layers", None) or ()), key)
    open_feature_cache(directory, cache_identity(verifier, data, stored, targets))  # refuse a mismatch now
    reading = tuple(steering.spec.v_layers) if steering is not None else ()

    def cache() -> FeatureCache:
        return build_feature_cache(
            directory, verifier, data, stored, targets, pad_id,
            batch_size=int(getattr(train, "feature_batch_size", None) or 8), read=reading,
        )  # fmt: skip

    return cache


def check_synthetic_source(meta: dict, verifier_name: str, verifier_tokenizer_hash: str, where: Any) -> None:
    """The synthetic data must come from this verifier (its distributions are the training targets)."""
    made_by = meta.get("verifier", {})
    name = made_by.get("name") if isinstance(made_by, dict) else made_by
    token_hash = meta.get("tokenizer_hash")
    if token_hash is not None and token_hash != verifier_tokenizer_hash:
        raise ValueError(
            f"train.data={str(where)!r} was tokenized with another tokenizer (hash {token_hash} vs the "
            f"verifier's {verifier_tokenizer_hash}); sample it again with task=synth for this verifier"
        )
    if name is not None and name != verifier_name:
        raise ValueError(
            f"train.data={str(where)!r} was sampled from verifier {name!r}, but model/verifier is "
            f"{verifier_name!r}; pass the model/verifier it was made with or run task=synth for this one"
        )
