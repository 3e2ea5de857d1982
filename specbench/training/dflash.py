"""``task=train method=dflash``: a DFlash draft network trained on task=synth rows (docs/dflash.md).

Per row, up to ``train.dflash_anchors`` anchors ``a`` are drawn (seeded) among the positions whose next
token is a response token. Each anchor is one block, exactly as decoding builds it after ``a + 1`` committed
tokens: slot 0 holds token ``a`` at position ``a``, slots ``1 .. W − 1`` the mask at positions ``a + 1 ..``,
and the block attends to the fused verifier taps of positions ``< a`` (the context decoding holds then)
and to its own slots. All blocks of a batch run in one forward under a block mask; slot ``k`` is scored
by cross-entropy against token ``a + k`` (the verifier's own response in the data) where that token
exists and is a response token, weighted ``exp(−(k − 1) / train.dflash_loss_gamma)`` as in the DFlash
paper and SpecForge (their γ: 7 for blocks of 16, 5 for 10, 4 for 8), the weighted mean over the batch.
Differences from SpecForge: an anchor may be the last prompt token (decoding's first block starts there)
and may lie within a block of the end (slots past it are not scored).

Validation: per-slot top-1 agreement ``val/acc_pos{k}``, ``val/tau_estimate`` = 1 + the mean number of
leading slots that agree (the greedy τ of a full block when the data is the verifier's greedy output), and
``val/tau`` from real greedy decoding of held-out prompts with γ = W − 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specbench.drafters.dflash.config import DFlashConfig, default_target_layer_ids, rope_parameters
from specbench.drafters.dflash.drafter import DFlashDrafter
from specbench.drafters.dflash.model import ContextCache, DFlashDraftModel
from specbench.models.draft_vocab import DraftVocab, draft_vocab_for, vocab_metadata
from specbench.training.batches import predict_positions, verifier_batch
from specbench.training.data_budget import training_rows
from specbench.training.dflash_init import init_from_verifier, starting_weights
from specbench.training.feature_build import build_feature_cache
from specbench.training.features import FeatureCache, cache_identity, open_feature_cache
from specbench.training.opd import objective_module, objective_settings
from specbench.training.synth_data import SyntheticDataModule
from specbench.training.trainer import VerifierTraining, train_option
from specbench.training.validation import speculative_tau

METHOD = "dflash"


# --- blocks and their loss ------------------------------------------------------------------------------


def sample_anchors(
    predict: torch.Tensor, count: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``count`` distinct anchors per row, uniformly among the row's ``predict`` positions (B, T).
    Returns (anchors (B, N), keep (B, N)); N = min(count, the most any row has); unused entries are 0 and
    not kept."""
    scores = torch.rand(predict.shape, generator=generator).to(predict.device)
    scores = scores.masked_fill(~predict, 2.0)
    available = predict.sum(dim=1)
    width = max(1, min(count, int(available.max()) if predict.numel() else 0))
    order = scores.argsort(dim=1)[:, :width]
    keep = torch.arange(width, device=predict.device).unsqueeze(0) < available.clamp(max=width).unsqueeze(1)
    return torch.where(keep, order, torch.zeros_like(order)), keep


def block_mask(anchors: torch.Tensor, attention: torch.Tensor, width: int) -> torch.Tensor:
    """(B, N·W, T + N·W): a block's slots see the context positions before its anchor and their own block."""
    batch, blocks = anchors.shape
    length = attention.shape[1]
    context = torch.arange(length, device=anchors.device)[None, None, :] < anchors[:, :, None]
    context = (context & attention.bool()[:, None, :]).repeat_interleave(width, dim=1)
    block_of = torch.arange(blocks * width, device=anchors.device) // width
    own = (block_of[:, None] == block_of[None, :]).expand(batch, -1, -1)
    return torch.cat([context, own], dim=2)


def block_hidden(
    draft: DFlashDraftModel,
    embedding: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    anchors: torch.Tensor,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over every block: (final-normed hidden states of the mask slots (B, N, W − 1, H), the
    positions of all slots (B, N, W)). Block ``n`` is what decoding drafts from after ``anchors[:, n] + 1``
    committed tokens."""
    ids, attention = batch["input_ids"], batch["attention_mask"].bool()
    size, length = ids.shape
    blocks = anchors.shape[1]
    positions = torch.arange(length, device=ids.device).expand(size, -1)
    cache = ContextCache.of(draft.context_kv(batch["features"], positions), attention)
    block_ids = draft.block_ids(ids.gather(1, anchors).reshape(-1), width)
    embeds = draft.embed_block(block_ids, embedding).reshape(size, blocks * width, -1)
    slots = anchors[:, :, None] + torch.arange(width, device=ids.device)
    hidden = draft(embeds, slots.reshape(size, -1), cache, block_mask=block_mask(anchors, attention, width))
    return hidden.reshape(size, blocks, width, -1)[:, :, 1:], slots


def block_loss(
    draft: DFlashDraftModel,
    embedding: torch.nn.Module,
    lm_head: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    anchors: torch.Tensor,
    keep: torch.Tensor,
    width: int,
    gamma: float | None,
    vocab: DraftVocab,
    reach: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The weighted block cross-entropy of one batch (module docstring) and, per slot ``k = 1 .. W − 1``,
    the agreeing and scored counts (``correct`` / ``scored``, (W − 1,)), plus ``leading`` (the summed count
    of leading agreeing slots per kept block) and ``blocks`` (kept blocks). Over a reduced ``vocab`` the
    logits are its LM-head rows; a label outside it is scored as a miss and left out of the loss.
    ``reach`` (B, N): score only slots ``k <= reach`` of each block (the drafts a rollout judged)."""
    ids, attention = batch["input_ids"], batch["attention_mask"].bool()
    loss_mask = batch["loss_mask"].bool()
    size, length = ids.shape
    hidden, slots = block_hidden(draft, embedding, batch, anchors, width)
    targets = slots[:, :, 1:]
    inside = targets < length
    targets = targets.clamp(max=length - 1)
    labels = ids.gather(1, targets.reshape(size, -1)).reshape(targets.shape)
    scored = keep[:, :, None] & inside
    scored = scored & attention.gather(1, targets.reshape(size, -1)).reshape(targets.shape)
    scored = scored & loss_mask.gather(1, targets.reshape(size, -1)).reshape(targets.shape)
    if reach is not None:
        scored = scored & (torch.arange(1, width, device=ids.device) <= reach[:, :, None])
    k = torch.arange(1, width, device=ids.device, dtype=torch.float32)
    decay = torch.exp(-(k - 1) / gamma) if gamma else torch.ones_like(k)
    weights = scored.float() * decay
    chosen = scored.nonzero(as_tuple=True)
    logits = vocab_logits(lm_head, hidden[chosen], vocab)
    targets = vocab.to_draft(labels[chosen])
    inside = targets >= 0
    losses = F.cross_entropy(logits[inside], targets[inside], reduction="none")
    loss = (losses * weights[chosen][inside]).sum() / weights.sum().clamp(min=1e-6)
    with torch.no_grad():
        agree = torch.zeros_like(scored)
        agree[chosen] = logits.argmax(dim=-1) == targets
        leading = torch.cumprod(agree.long(), dim=-1).sum(dim=-1)
    return {
        "loss": loss,
        "correct": agree.sum(dim=(0, 1)),
        "scored": scored.sum(dim=(0, 1)),
        "leading": leading[keep].sum(),
        "blocks": keep.sum(),
    }


def vocab_logits(lm_head: torch.nn.Module, hidden: torch.Tensor, vocab: DraftVocab) -> torch.Tensor:
    """float32 logits over ``vocab`` (draft ids) from the verifier's LM head rows of its tokens."""
    weight = lm_head.weight
    rows = (
        weight[: vocab.vocab_size]
        if vocab.is_full
        else weight.index_select(0, vocab.draft_ids.to(weight.device))
    )
    return F.linear(hidden.to(weight.dtype), rows).float()


def block_tau_estimate(leading: float, blocks: float) -> float:
    return 1.0 + leading / max(blocks, 1.0)


# --- the module -----------------------------------------------------------------------------------------


class DFlashTraining(VerifierTraining):
    """Train a DFlash draft network against a frozen verifier (held by reference: never saved or trained;
    the draft reads the verifier's embedding and LM head)."""

    objective = "sft"

    def __init__(
        self,
        verifier: torch.nn.Module,
        draft: DFlashDraftModel,
        train: Any,
        vocab: DraftVocab,
        metadata: dict,
        val_prompts: Sequence[Sequence[int]] = (),
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int = 0,
    ):
        super().__init__(verifier, train, metadata, val_prompts, eos_token_ids, pad_token_id)
        self.draft = draft  # its weights are saved as draft.* (checkpoint.TRAINED_PREFIX)
        self.vocab = vocab
        self.vocab_size = vocab.vocab_size
        self.width = draft.config.block_size
        self.anchors = int(train_option(train, "dflash_anchors", 32))
        self.gamma = train_option(train, "dflash_loss_gamma", None)
        self.taps = tuple(i + 1 for i in draft.config.target_layer_ids)  # specbench taps, in the fc's order
        self._val_sums: torch.Tensor | None = None

    def _loss(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict[str, torch.Tensor]:
        if "features" not in batch:
            batch = {**batch, **verifier_batch(self.verifier, batch, self.taps, None)}
        predict = predict_positions(batch["attention_mask"], batch["loss_mask"])
        anchors, keep = sample_anchors(predict, self.anchors, generator)
        return block_loss(
            self.draft, self.verifier.get_input_embeddings(), self.verifier.get_output_embeddings(), batch,
            anchors, keep, self.width, self.gamma, self.vocab,
        )  # fmt: skip

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self._loss(batch, self.step_generator())
        size = batch["input_ids"].shape[0]
        slots = int(out["blocks"]) * self.width
        self.count_compute(size, int(batch["attention_mask"].sum()), slots, slots)
        self.log("train/loss", out["loss"], prog_bar=True, batch_size=size)
        self.log(
            "train/acc", out["correct"].sum().float() / out["scored"].sum().clamp(min=1), batch_size=size
        )
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=size)
        return out["loss"]

    def on_validation_epoch_start(self) -> None:
        self._val_sums = torch.zeros(2 * (self.width - 1) + 2, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        generator = torch.Generator().manual_seed(int(self.train_cfg.seed) + batch_idx)  # the same every time
        out = self._loss(batch, generator)
        self.log("val/loss", out["loss"], batch_size=batch["input_ids"].shape[0], sync_dist=True)
        self._val_sums += torch.cat(
            [out["correct"], out["scored"], out["leading"].view(1), out["blocks"].view(1)]
        ).double()

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking or self._val_sums is None:
            return
        sums = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum").tolist()
        slots = self.width - 1
        for k in range(slots):
            self.log(f"val/acc_pos{k + 1}", sums[k] / max(sums[slots + k], 1.0), rank_zero_only=True)
        self.log("val/tau_estimate", block_tau_estimate(sums[-2], sums[-1]), rank_zero_only=True)
        if self.val_prompts:
            drafter = DFlashDrafter(self.draft, self.verifier, self.vocab_size, draft_vocab=self.vocab)
            tau = speculative_tau(self, self.draft, drafter, self.width - 1, self.vocab_size)
            self.log("val/tau", tau, rank_zero_only=True)


# --- building it from the config ------------------------------------------------------------------------


def draft_config(verifier: torch.nn.Module, train: Any) -> DFlashConfig:
    """The draft network's shape: the verifier's layer shape, ``train.dflash_layers`` layers, taps
    ``train.dflash_taps`` (z-lab ids; null: z-lab's default spread), ``train.dflash_block_size`` slots and the
    mask ``train.dflash_mask_token_id`` (null: a learned mask embedding). Bad values raise ValueError."""
    config = verifier.config
    depth = int(config.num_hidden_layers)
    layers = int(train_option(train, "dflash_layers", 1))
    if layers < 1:
        raise ValueError(f"train.dflash_layers must be >= 1, got {layers}")
    ids = train_option(train, "dflash_taps", None)
    ids = tuple(int(i) for i in ids) if ids else default_target_layer_ids(depth, layers)
    if not ids or min(ids) < 0 or max(ids) >= depth - 1:
        raise ValueError(
            f"train.dflash_taps={list(ids)}: give verifier layer ids in 0..{depth - 2} (z-lab's "
            "target_layer_ids: "
            f"the output of that layer); the last layer ({depth - 1}) is not supported for training"
        )
    block = int(train_option(train, "dflash_block_size", 16))
    if block < 2:
        raise ValueError(
            f"train.dflash_block_size must be >= 2 (the last token and a mask slot), got {block}"
        )
    rows = int(verifier.get_input_embeddings().weight.shape[0])
    mask = train_option(train, "dflash_mask_token_id", None)
    if mask is not None and not 0 <= int(mask) < rows:
        raise ValueError(
            f"train.dflash_mask_token_id={mask} is not a row of the verifier's embedding (0..{rows - 1})"
        )
    heads = int(config.num_attention_heads)
    return DFlashConfig(
        hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads),
        vocab_size=rows,
        target_layer_ids=ids,
        block_size=block,
        mask_token_id=None if mask is None else int(mask),
        num_target_layers=depth,
        rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        attention_bias=bool(getattr(config, "attention_bias", False)),
        max_position_embeddings=int(getattr(config, "max_position_embeddings", 32768)),
        rope=rope_parameters(config.to_dict()),
    )


def build_dflash_training(
    cfg: Any,
    verifier: Any,
    vocab_size: int,
    eos_ids: Sequence[int],
    pad_id: int,
    module_class: type[DFlashTraining] | None = None,
) -> tuple[DFlashTraining, SyntheticDataModule]:
    """The LightningModule and DataModule of ``task=train method=dflash`` (``verifier`` a LoadedModel;
    ``module_class`` the module of ``method.objective``, picked by ``objectives.build_training``)."""
    from specbench.data.synth_dataset import load_synthetic
    from specbench.drafters.eagle3.checkpoint import verifier_identity
    from specbench.models.pair import tokenizer_hash
    from specbench.training.drafter import check_synthetic_source

    train = cfg.train
    data, data_meta = load_synthetic(str(train.data))
    check_synthetic_source(data_meta, verifier.name, tokenizer_hash(verifier.tokenizer), train.data)
    chosen = training_rows(data["train"], verifier.tokenizer, train)  # train.data_tokens & co.
    config = draft_config(verifier.model, train)
    vocab, coverage = draft_vocab_for(
        data,
        train_option(train, "dflash_draft_vocab_size", None),
        vocab_size,
        "train.dflash_draft_vocab_size",
    )
    draft = DFlashDraftModel(config).float()
    init_layer = train_option(train, "init_layer", "random")
    if init_layer == "verifier_last":
        init_from_verifier(draft, verifier.model)
    elif init_layer != "random":
        raise ValueError(f"train.init_layer must be random or verifier_last, got {init_layer!r}")
    if config.mask_token_id is None:  # a learned mask starts as the mean embedding row
        draft.mask_embedding.data.copy_(verifier.model.get_input_embeddings().weight.float().mean(dim=0))
    init_head = train_option(train, "init_head", None)
    starting_weights(draft, init_layer, init_head, verifier, vocab_size)
    objective = objective_settings(cfg, init_head, config.block_size - 1, METHOD)
    draft.train()
    taps = tuple(i + 1 for i in config.target_layer_ids)
    cache_dir = train_option(train, "feature_cache", None)
    cache = None
    if cache_dir:
        open_feature_cache(cache_dir, cache_identity(verifier, data, taps, None))  # refuse a mismatch now

        def cache() -> FeatureCache:
            return build_feature_cache(
                cache_dir, verifier, data, taps, None, pad_id,
                batch_size=int(train_option(train, "feature_batch_size", 8)), read=taps,
                rows={"train": chosen.rows},
            )  # fmt: skip

    gamma = train_option(train, "dflash_loss_gamma", None)
    if gamma is not None and (not math.isfinite(float(gamma)) or float(gamma) <= 0):
        raise ValueError(f"train.dflash_loss_gamma must be > 0 or null (no decay), got {gamma}")
    metadata = {
        "method": METHOD,
        "drafter_kind": "dflash",
        **verifier_identity(verifier, vocab_size),
        "dflash_config": config.to_dict(),
        **(vocab_metadata(vocab) if not vocab.is_full else {}),
        "draft_vocab_coverage": round(coverage, 6),
        "draft_parameters": sum(p.numel() for p in draft.parameters()),
        "dflash_anchors": int(train_option(train, "dflash_anchors", 32)),
        "dflash_loss_gamma": gamma,
        "init_layer": init_layer,
        "init_head": str(init_head) if init_head else None,
        **objective,
        "feature_cache": str(Path(cache_dir).expanduser()) if cache_dir else None,
        "data": str(train.data),
        "data_rows": {split: len(data[split]) for split in data},
        **chosen.info,
    }
    count = min(int(train_option(train, "val_prompts", 0)), len(data["validation"]))
    val_prompts = [row["input_ids"][: row["prompt_len"]] for row in data["validation"].select(range(count))]
    args = (verifier.model, draft, train, vocab, metadata, val_prompts, eos_ids, pad_id)
    module = objective_module(module_class or DFlashTraining, objective, args)
    datamodule = SyntheticDataModule(data, train.batch_size, pad_id, train.seed, train.num_workers, cache,
                                     chosen.rows)  # fmt: skip
    return module, datamodule
