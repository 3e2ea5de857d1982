"""``task=train method=dflash_opd``: on-policy distillation of a DFlash drafter (docs/training.md).

The rollout (:mod:`specbench.training.opd`) needs the drafter's block from every candidate round start: a
no-gradient pass over the blocks anchored at every response-predicting position (in chunks), each block's
accepted count the leading slots whose greedy draft is the row's token. The rounds the walk visits are the
training blocks (up to ``train.dflash_anchors`` of them per row, drawn seeded by step), and a block at
anchor ``a`` scores only its judged slots ``k <= min(acc + 1, γ)``: the accepted drafts and the first
rejected one. The loss is the cross-entropy against the target's token there (the row's, its greedy choice
when the data is greedy) with equal weights: the rollout, not the DFlash decay, says which slots count.
"""

from __future__ import annotations

from typing import Any

import torch

from specbench.drafters.eagle3.head import compact
from specbench.training.batches import predict_positions, verifier_batch
from specbench.training.dflash import DFlashTraining, block_hidden, block_loss, sample_anchors, vocab_logits
from specbench.training.opd import Rollout, leading_accepts, rollout_metrics, walk_rounds

ROLLOUT_CHUNK = 64  # anchors per no-gradient block forward of the rollout (bounds its memory)


def block_rollout(module: DFlashTraining, batch: dict[str, torch.Tensor], gamma: int) -> tuple[Rollout, int]:
    """The target-assisted rollout of one batch (module docstring): (rollout over anchors (B, T), the
    block slots it ran)."""
    ids, attention = batch["input_ids"], batch["attention_mask"].bool()
    loss_mask = batch["loss_mask"].bool()
    size, length = ids.shape
    predict = predict_positions(attention, loss_mask)
    index, inside = compact(predict)
    embedding = module.verifier.get_input_embeddings()
    lm_head = module.verifier.get_output_embeddings()
    accepts = torch.zeros(size, length, dtype=torch.long, device=ids.device)
    with torch.no_grad():
        for start in range(0, index.shape[1], ROLLOUT_CHUNK):
            anchors = index[:, start : start + ROLLOUT_CHUNK]
            hidden, slots = block_hidden(module.draft, embedding, batch, anchors, module.width)
            hidden, slots = hidden[:, :, :gamma], slots[:, :, 1 : gamma + 1]
            drafts = module.vocab.to_target(vocab_logits(lm_head, hidden, module.vocab).argmax(dim=-1))
            usable = slots < length
            flat = slots.clamp(max=length - 1).reshape(size, -1)
            truth = ids.gather(1, flat).reshape(slots.shape)
            responding = (loss_mask & attention).gather(1, flat).reshape(slots.shape)
            counts = leading_accepts(usable & responding & (drafts == truth))
            keep = inside[:, start : start + ROLLOUT_CHUNK]
            accepts.scatter_(1, anchors, torch.where(keep, counts, torch.zeros_like(counts)))
    has = predict.any(dim=1)
    first = torch.where(has, predict.long().argmax(dim=1), torch.full((size,), -1, device=ids.device))
    room = predict.long().flip(1).cumsum(1).flip(1)  # anchor a: response tokens a + 1 .. still to come
    rollout = walk_rounds(accepts, first, room, gamma)
    return rollout, int(inside.sum()) * module.width


class DFlashOpdTraining(DFlashTraining):
    """:class:`DFlashTraining` with the on-policy objective (validation as for SFT, plus the rollout)."""

    objective = "opd"

    def __init__(self, *args: Any, gamma: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if gamma > self.width - 1:
            raise ValueError(
                f"method.opd_gamma={gamma}: a DFlash block of {self.width} slots drafts at most "
                f"{self.width - 1}; set method.opd_gamma <= {self.width - 1} or null"
            )
        self.opd_gamma = gamma

    def _opd_loss(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> dict:
        if "features" not in batch:
            batch = {**batch, **verifier_batch(self.verifier, batch, self.taps, None)}
        rollout, rollout_slots = block_rollout(self, batch, self.opd_gamma)
        anchors, keep = sample_anchors(rollout.visited, self.anchors, generator)
        out = block_loss(
            self.draft, self.verifier.get_input_embeddings(), self.verifier.get_output_embeddings(), batch,
            anchors, keep, self.width, None, self.vocab, reach=rollout.reach.gather(1, anchors),
        )  # fmt: skip
        trained = int(keep.sum()) * self.width
        return {**out, "rollout": rollout, "head_tokens": rollout_slots + trained, "grad_tokens": trained}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self._opd_loss(batch, self.step_generator())
        size = batch["input_ids"].shape[0]
        self.log("train/loss", out["loss"], prog_bar=True, batch_size=size)
        self.log(
            "train/acc", out["correct"].sum().float() / out["scored"].sum().clamp(min=1), batch_size=size
        )
        for key, value in rollout_metrics(out["rollout"]).items():
            self.log(f"train/{key}", value, batch_size=size)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=size)
        tokens = int(batch["attention_mask"].sum())
        self.count_compute(size, tokens, out["head_tokens"], out["grad_tokens"])
        return out["loss"]

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        generator = torch.Generator().manual_seed(int(self.train_cfg.seed) + batch_idx)
        out = self._opd_loss(batch, generator)
        size = batch["input_ids"].shape[0]
        self.log("val/opd_loss", out["loss"], batch_size=size, sync_dist=True)
        self.log("val/rollout_tau", out["rollout"].tau, batch_size=size, sync_dist=True)
