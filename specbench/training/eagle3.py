"""``task=train method=eagle3``: an EAGLE-3 head trained with training-time test (TTT) on task=synth rows.

Per batch (verifier features from the feature cache, or computed on the fly): the head is unrolled
``train.ttt_steps`` steps (default 7) over every position, each step on its own previous outputs
(:meth:`Eagle3Head.unroll`). Step ``i`` at head index ``t`` predicts token ``t + 2 + i`` and is scored
by soft cross-entropy against the verifier's next-token distribution at position ``t + 1 + i``,
restricted to the draft vocabulary and renormalised (the top-k of it with ``train.feature_top_k``).

Which positions count (SpecForge ``core/eagle3.py``, with its alignment fixed): a position counts when
the token it predicts is a response token (loss mask 1) and the verifier's argmax over the *full*
vocabulary lies in the draft vocabulary (SpecForge's ``position_mask = t2d[argmax] * loss_mask``). The
step loss is the sum over counted positions divided by the number of response-predicting positions of
that step (positions whose argmax is outside the draft vocabulary count as 0, as in SpecForge's mean;
SpecForge divides by batch × sequence length, padding included). Steps are weighted ``0.8**i`` and
summed. SpecForge gates step 0 with the loss mask of the token two before the predicted one and
shifts the step-0 attention block at every step (SpecForge#885, #245; SafeAILab/EAGLE#247, #317);
here the gate is the predicted token's own mask and every draft depth sees all committed positions,
exactly as in decoding (tests/test_eagle3.py checks that the same inputs reach the head at the same
positions in both).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specbench.drafters.eagle3 import Eagle3Drafter
from specbench.drafters.eagle3.head import Eagle3Head, compact, resolve_taps
from specbench.models.draft_vocab import draft_vocab_for, vocab_metadata
from specbench.training.batches import TargetSpec, dense_targets, verifier_batch
from specbench.training.data_budget import training_rows
from specbench.training.feature_build import build_feature_cache
from specbench.training.features import FeatureCache, cache_identity, open_feature_cache
from specbench.training.opd import objective_module, objective_settings
from specbench.training.synth_data import SyntheticDataModule, collate_cached
from specbench.training.trainer import VerifierTraining, train_option
from specbench.training.validation import speculative_tau
from specbench.values import EAGLE3_INIT_LAYERS

TTT_STEPS = 7
LOSS_DECAY = 0.8
METHOD = "eagle3"


# --- the loss -------------------------------------------------------------------------------------------


def ttt_chains(
    predict: torch.Tensor, steps: int, fraction: float = 1.0, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head indices whose TTT chains are unrolled: those with a response-predicting target at some
    depth (``predict[t + 1 + i]`` for ``i < steps``), all of them or a random ``fraction`` per row
    (anchored training-time test: fewer chains, the same sequences). Returns :func:`compact`'s pair."""
    length = predict.shape[1]
    reaches = torch.zeros(predict.shape[0], length - 1, dtype=torch.bool, device=predict.device)
    for step in range(steps):
        reaches[:, : length - 1 - step] |= predict[:, 1 + step :]
    if fraction < 1.0:
        scores = torch.rand(reaches.shape, generator=generator).to(predict.device)
        scores = scores.masked_fill(~reaches, 2.0)
        keep = torch.ceil(reaches.sum(dim=1) * fraction).long()
        rank = scores.argsort(dim=1).argsort(dim=1)
        reaches = reaches & (rank < keep.unsqueeze(1))
    return compact(reaches)


def ttt_loss(
    head: Eagle3Head,
    batch: dict[str, torch.Tensor],
    steps: int,
    decay: float = LOSS_DECAY,
    chains: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict:
    """The TTT loss of one batch (see the module docstring) and per-step top-1 agreement counts.

    ``batch``: ``input_ids``, ``attention_mask`` (B, T); ``features`` (B, T, len(taps)·H_V) the verifier taps
    at every position; ``predict`` / ``in_vocab`` (B, T); ``target_values`` (B, T, K) restricted verifier
    logits at the predict positions (``target_index`` (B, T, K) draft ids for top-k targets). ``chains``:
    the head indices whose chains count (:func:`ttt_chains`; default: every chain that reaches a counted
    position, which gives the same loss as unrolling every index)."""
    ids, attention = batch["input_ids"], batch["attention_mask"].bool()
    predict, in_vocab = batch["predict"].bool(), batch["in_vocab"].bool()
    values, index = batch["target_values"], batch.get("target_index")
    length = ids.shape[1]
    steps = min(steps, length - 1)
    if chains is None:
        chains = ttt_chains(predict, steps)
    # Head index t pairs the feature at t with token t + 1 (it exists: attention at t + 1).
    outputs, heads, inside = head.unroll(
        ids[:, 1:], batch["features"][:, :-1], attention[:, 1:], steps, chains
    )
    outputs[0] = torch.gather(outputs[0], 1, heads.unsqueeze(-1).expand(-1, -1, outputs[0].shape[-1]))
    total = values.new_zeros((), dtype=torch.float32)
    step_losses, correct, counted_positions = [], [], []
    for step, hidden in enumerate(outputs):
        targets = heads + 1 + step  # the position whose verifier distribution step `step` at index t learns
        usable = inside & (targets < length)
        targets = targets.clamp(max=length - 1)
        responding = usable & torch.gather(predict, 1, targets)
        counted = responding & torch.gather(in_vocab, 1, targets)
        rows, columns = counted.nonzero(as_tuple=True)
        positions = targets[rows, columns]
        denominator = responding.sum().clamp(min=1)
        log_q = F.log_softmax(head.logits(hidden[rows, columns]).float(), dim=-1)
        target_logits = values[rows, positions].float()
        p = F.softmax(target_logits, dim=-1)
        if index is None:
            cross_entropy = -(p * log_q).sum(dim=-1)
            top = target_logits.argmax(dim=-1)
        else:
            draft_ids = index[rows, positions]
            cross_entropy = -(p * log_q.gather(-1, draft_ids)).sum(dim=-1)
            top = draft_ids.gather(-1, target_logits.argmax(dim=-1, keepdim=True)).squeeze(-1)
        loss = cross_entropy.sum() / denominator
        total = total + decay**step * loss
        step_losses.append(loss.detach())
        correct.append((log_q.argmax(dim=-1) == top).sum().detach())
        counted_positions.append(responding.sum().detach())
    return {"loss": total, "step_losses": step_losses, "correct": correct, "positions": counted_positions}


def chain_tau_estimate(accuracies: Sequence[float]) -> float:
    """Greedy chain τ implied by per-depth top-1 agreement: ``1 + Σ_k Π_{i<k} acc_i`` (step ``i``'s
    agreement is conditional on the earlier drafts being right, as the TTT inputs are true tokens)."""
    tau, survive = 1.0, 1.0
    for acc in accuracies:
        survive *= acc
        tau += survive
    return tau


# --- data -----------------------------------------------------------------------------------------------


def collate(rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; cached features / targets become dense (B, T, ·) tensors."""
    return dense_targets(collate_cached(rows, pad_id))


class Eagle3DataModule(SyntheticDataModule):
    """The synth rows of :class:`SyntheticDataModule` (with the feature cache when one is configured),
    targets dense as :func:`ttt_loss` reads them."""

    def collate(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        return collate(batch, self.pad_id)


# --- the module -----------------------------------------------------------------------------------------


class Eagle3Training(VerifierTraining):
    """Train an EAGLE-3 head against a frozen verifier (not a submodule: never saved or trained)."""

    objective = "sft"

    def __init__(
        self,
        verifier: torch.nn.Module,
        head: Eagle3Head,
        train: Any,
        targets: TargetSpec,
        metadata: dict,
        val_prompts: Sequence[Sequence[int]] = (),
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int = 0,
    ):
        super().__init__(verifier, train, metadata, val_prompts, eos_token_ids, pad_token_id)
        self.head = head
        self.targets = targets
        self.steps = int(train_option(train, "ttt_steps", TTT_STEPS))
        self.decay = float(train_option(train, "loss_decay", LOSS_DECAY))
        self.chain_fraction = float(train_option(train, "ttt_chain_fraction", 1.0))
        if self.steps < 1:
            raise ValueError(f"train.ttt_steps must be >= 1, got {self.steps}")
        if not 0.0 < self.chain_fraction <= 1.0:
            raise ValueError(f"train.ttt_chain_fraction must be in (0, 1], got {self.chain_fraction}")
        self._val_sums: torch.Tensor | None = None

    def _with_features(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "target_values" in batch:
            return batch
        return {**batch, **verifier_batch(self.verifier, batch, self.head.taps, self.targets)}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        batch = self._with_features(batch)
        generator = self.step_generator() if self.chain_fraction < 1.0 else None  # resumed: same chains
        steps = min(self.steps, batch["input_ids"].shape[1] - 1)
        chains = ttt_chains(batch["predict"].bool(), steps, self.chain_fraction, generator)
        out = ttt_loss(self.head, batch, self.steps, self.decay, chains)
        size = batch["input_ids"].shape[0]
        heads = int(chains[1].sum()) * (steps - 1) + int(batch["attention_mask"][:, 1:].sum())
        self.count_compute(size, int(batch["attention_mask"].sum()), heads, heads)
        self.log("train/loss", out["loss"], prog_bar=True, batch_size=size)
        self.log("train/loss_step0", out["step_losses"][0], batch_size=size)
        self.log(
            "train/acc_step0", out["correct"][0].float() / out["positions"][0].clamp(min=1), batch_size=size
        )
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=size)
        return out["loss"]

    def on_validation_epoch_start(self) -> None:
        self._val_sums = torch.zeros(2, self.steps, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        out = ttt_loss(self.head, self._with_features(batch), self.steps, self.decay)
        self.log("val/loss", out["loss"], batch_size=batch["input_ids"].shape[0], sync_dist=True)
        for step, (right, count) in enumerate(zip(out["correct"], out["positions"])):
            self._val_sums[0, step] += right.double()
            self._val_sums[1, step] += count.double()

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking or self._val_sums is None:
            return
        sums = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum")
        accuracies = (sums[0] / sums[1].clamp(min=1)).tolist()
        for step, acc in enumerate(accuracies):
            self.log(f"val/acc_step{step}", acc, rank_zero_only=True)
        self.log("val/tau_estimate", chain_tau_estimate(accuracies), rank_zero_only=True)
        if self.val_prompts:
            vocab_size = self.targets.vocab.vocab_size
            tau = speculative_tau(self, self.head, Eagle3Drafter(self.head), self.steps, vocab_size)
            self.log("val/tau", tau, rank_zero_only=True)


# --- building it from the config ------------------------------------------------------------------------


def head_metadata(verifier: Any, head: Eagle3Head, vocab_size: int) -> dict:
    """What ties a head to its verifier (checked when it is loaded) and rebuilds its architecture."""
    from specbench.drafters.eagle3.checkpoint import verifier_identity

    return {
        "method": METHOD,
        "drafter_kind": "eagle3",
        **verifier_identity(verifier, vocab_size),
        "layer_arch": head.config.model_type,
        "taps": list(head.taps),
        **vocab_metadata(head.vocab),
        "lm_head": "trained" if head.lm_head.weight.requires_grad else "verifier",
        "head_parameters": head.num_parameters(trainable_only=True),
    }


@torch.no_grad()
def warm_start(head: Eagle3Head, path: str | Path, verifier: Any, vocab_size: int) -> None:
    """Start ``head`` from a head trained before (``train.init_head``: its ``trained.pt`` / ``last.ckpt``),
    e.g. to go on training on more data. The checkpoint must come from this verifier (checked as when
    decoding) and have the same taps. Its fc, decoder layer and norm are copied; the LM head rows of the
    tokens both draft vocabularies hold are copied when the checkpoint trained its LM head, and the rows of
    tokens new to this vocabulary stay the verifier's."""
    from specbench.drafters.eagle3.checkpoint import load_trained_eagle3
    from specbench.models.pair import CheckpointMismatchError

    source, metadata = load_trained_eagle3(path, verifier, vocab_size)
    if tuple(source.taps) != tuple(head.taps):
        raise CheckpointMismatchError(
            f"train.init_head: {str(path)!r} reads verifier taps {list(source.taps)}, this training "
            f"{list(head.taps)}; set train.taps={list(source.taps)} or start from another head"
        )
    weights = {k: v for k, v in source.state_dict().items() if not k.startswith("lm_head.")}
    head.load_state_dict(weights, strict=False)
    if metadata.get("lm_head", "trained") == "trained":
        position = {int(t): i for i, t in enumerate(source.vocab.draft_ids.tolist())}
        for row, token in enumerate(head.vocab.draft_ids.tolist()):
            if int(token) in position:
                head.lm_head.weight[row].copy_(source.lm_head.weight[position[int(token)]])


def build_eagle3_training(
    cfg: Any,
    verifier: Any,
    vocab_size: int,
    eos_ids: Sequence[int],
    pad_id: int,
    module_class: type[Eagle3Training] | None = None,
) -> tuple[Eagle3Training, Eagle3DataModule]:
    """The LightningModule and DataModule of ``task=train method=eagle3`` (``verifier`` a LoadedModel;
    ``vocab_size`` the vocabulary p and q are compared over, ``shared_vocab_size``). ``module_class``: the
    module of ``method.objective`` (:func:`specbench.training.objectives.build_training` picks it)."""
    from specbench.data.synth_dataset import load_synthetic
    from specbench.models.pair import tokenizer_hash
    from specbench.training.drafter import check_synthetic_source

    train = cfg.train
    data, data_meta = load_synthetic(str(train.data))
    check_synthetic_source(data_meta, verifier.name, tokenizer_hash(verifier.tokenizer), train.data)
    chosen = training_rows(data["train"], verifier.tokenizer, train)  # train.data_tokens & co.
    vocab, coverage = draft_vocab_for(data, train_option(train, "draft_vocab_size", None), vocab_size)
    taps = resolve_taps(
        train_option(train, "taps", None), int(verifier.model.config.num_hidden_layers), "train.taps"
    )
    head = Eagle3Head.for_verifier(verifier.model, vocab, taps).float()
    init_layer = train_option(train, "init_layer", "random")
    if init_layer not in EAGLE3_INIT_LAYERS:
        raise ValueError(f"train.init_layer must be one of {list(EAGLE3_INIT_LAYERS)}, got {init_layer!r}")
    if init_layer == "verifier_last":
        head.init_layer_from_verifier(verifier.model)
    init_head = train_option(train, "init_head", None)
    if init_head:
        if init_layer != "random":
            raise ValueError(
                "train.init_head and train.init_layer both set the head's starting weights; drop one"
            )
        warm_start(head, init_head, verifier, vocab_size)
    head.lm_head.requires_grad_(not bool(train_option(train, "freeze_lm_head", False)))
    head.train()
    top_k = train_option(train, "feature_top_k", None)
    targets = TargetSpec(vocab, int(top_k) if top_k else None)
    cache_dir = train_option(train, "feature_cache", None)
    cache = None
    if cache_dir:
        open_feature_cache(cache_dir, cache_identity(verifier, data, taps, targets))  # refuse a mismatch now

        def cache() -> FeatureCache:
            size = int(train_option(train, "feature_batch_size", 8))
            return build_feature_cache(cache_dir, verifier, data, taps, targets, pad_id, batch_size=size,
                                       rows={"train": chosen.rows})  # a budget's rows: the rest can wait

    steps = int(train_option(train, "ttt_steps", TTT_STEPS))
    objective = objective_settings(cfg, init_head, steps, METHOD)
    metadata = {
        **head_metadata(verifier, head, vocab_size),
        **objective,
        "draft_vocab_coverage": round(coverage, 6),
        "ttt_steps": steps,
        "loss_decay": float(train_option(train, "loss_decay", LOSS_DECAY)),
        "ttt_chain_fraction": float(train_option(train, "ttt_chain_fraction", 1.0)),
        "init_layer": init_layer,
        "init_head": str(init_head) if init_head else None,
        "feature_top_k": targets.top_k,
        "feature_cache": str(Path(cache_dir).expanduser()) if cache_dir else None,
        "data": str(train.data),
        "data_rows": {split: len(data[split]) for split in data},
        **chosen.info,
    }
    count = min(int(train_option(train, "val_prompts", 0) or 0), len(data["validation"]))
    val_prompts = [row["input_ids"][: row["prompt_len"]] for row in data["validation"].select(range(count))]
    args = (verifier.model, head, train, targets, metadata, val_prompts, eos_ids, pad_id)
    module = objective_module(module_class or Eagle3Training, objective, args)
    datamodule = Eagle3DataModule(data, train.batch_size, pad_id, train.seed, train.num_workers, cache,
                                  chosen.rows)  # fmt: skip
    return module, datamodule
