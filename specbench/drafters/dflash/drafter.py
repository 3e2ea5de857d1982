"""The DFlash :class:`~specbench.drafters.base.Drafter` (``model/drafter=dflash``; docs/dflash.md).

A row with ``n`` committed tokens holds draft context for positions ``0 .. n − 2`` (every token the
verifier has processed): per draft layer, the keys/values computed from the fused verifier taps at those
positions. ``propose`` runs one draft forward over the block ``[token n − 1, mask × (block_size − 1)]`` at
positions ``n − 1 ..`` and draws up to ``min(caps[b], block_size − 1)`` tokens, each from its slot's own
distribution q (the slots are predicted in parallel, so draft ``j``'s law does not depend on drafts
``< j``: q is the exact proposal law and every rule that needs q applies). ``commit`` appends the
context entries of the tokens the round made final, from the taps of the verification forward that ran
anyway (view columns ``0 .. accepted``); drafts the verifier rejected never enter the context, so a
partial acceptance leaves exactly the context a fresh prefill of the committed tokens would.

Taps: z-lab's ``target_layer_ids`` name HF ``hidden_states[id + 1]``, the output of verifier layer ``id``;
that is specbench tap ``id + 1`` (``specbench/drafters/base.py``), except for the last layer, where
HF's entry is the final-normed state: the view's ``hidden``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specbench.drafters.base import Drafter, Proposal, VerifierNeeds, VerifierView
from specbench.drafters.dflash.checkpoint import check_fits_verifier, load_dflash, load_trained_dflash
from specbench.drafters.dflash.model import DFlashDraftModel
from specbench.models.draft_vocab import DraftVocab


def verifier_needs(target_layer_ids: tuple[int, ...], depth: int) -> VerifierNeeds:
    """The verifier outputs the taps of ``target_layer_ids`` come from (see the module docstring)."""
    taps = tuple(sorted({i + 1 for i in target_layer_ids if i + 1 < depth}))
    return VerifierNeeds(hidden=any(i + 1 == depth for i in target_layer_ids), taps=taps)


class DFlashDrafter(Drafter):
    """A :class:`DFlashDraftModel` on a verifier (a transformers causal LM whose embedding and LM head the
    draft reads through); ``vocab_size``: the vocabulary p and q share (logits are cut to it)."""

    name = "dflash"

    def __init__(
        self,
        model: DFlashDraftModel,
        verifier: nn.Module,
        vocab_size: int | None = None,
        block_size: int | None = None,
        name: str = "dflash",
        draft_vocab: DraftVocab | None = None,
    ):
        check_fits_verifier(model.config, verifier)
        self.model = model.eval()
        self.name = name
        self._embedding = [verifier.get_input_embeddings()]  # lists: held by reference, not as submodules
        self.vocab_size = int(vocab_size or verifier.config.vocab_size)
        self.draft_vocab = draft_vocab if draft_vocab is not None and not draft_vocab.is_full else None
        if self.draft_vocab is not None and self.draft_vocab.vocab_size != self.vocab_size:
            raise ValueError(
                f"the DFlash draft vocabulary maps into {self.draft_vocab.vocab_size} tokens, the pair "
                "shares "
                f"{self.vocab_size}; use the drafter with the verifier it was trained for"
            )
        head = verifier.get_output_embeddings().weight
        # The LM head rows the draft reads: the draft vocabulary's (q is 0 outside it), else the shared
        # vocabulary.
        self._rows = [
            head[: self.vocab_size] if self.draft_vocab is None else head[self.draft_vocab.draft_ids]
        ]
        self.block_size = int(block_size or model.config.block_size)
        if self.block_size < 2:
            raise ValueError(
                f"model.drafter.params.block_size={self.block_size}: needs >= 2 (last token + masks)"
            )
        self.depth = int(verifier.config.num_hidden_layers)
        self.needs = verifier_needs(model.config.target_layer_ids, self.depth)
        self.hidden_size = model.config.hidden_size
        self.cache = model.empty_cache(0)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def reset(self, batch_size: int) -> None:
        self.cache = self.model.empty_cache(batch_size)

    def features(self, view: VerifierView) -> torch.Tensor:
        """The view's taps of ``target_layer_ids``, concatenated in the checkpoint's order."""
        parts = [
            view.hidden if i + 1 == self.depth else view.taps[i + 1]
            for i in self.model.config.target_layer_ids
        ]
        return torch.cat([p.to(self.device) for p in parts], dim=-1)

    def _append(self, view: VerifierView, valid: torch.Tensor, positions: torch.Tensor) -> None:
        kv = self.model.context_kv(self.features(view), positions.clamp(min=0))
        self.cache.append(kv, valid)

    @torch.no_grad()
    def prefill(self, state, view: VerifierView | None) -> None:
        if view is None or view.valid.shape[1] == 0:
            return
        valid = view.valid.to(self.device).bool()
        self._append(view, valid, valid.long().cumsum(dim=1) - 1)

    @torch.no_grad()
    def commit(self, state, view: VerifierView, accepted: torch.Tensor) -> None:
        held = self.cache.lengths
        new = state.lengths().to(self.device) - 1 - held
        width = view.valid.shape[1]
        if bool((new < 0).any()) or bool((new > torch.clamp(accepted.to(self.device) + 1, max=width)).any()):
            raise RuntimeError(
                f"DFlash drafter out of step with the batch: {new.tolist()} new committed tokens per row for "
                f"accepted={accepted.tolist()}"
            )
        columns = torch.arange(width, device=self.device).unsqueeze(0)
        self._append(view, columns < new.unsqueeze(1), held.unsqueeze(1) + columns)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.select_rows(rows.to(self.device))

    @torch.no_grad()
    def draft_logits(self, state, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft forward of the whole block: (logits (B, width, vocab_size) float32 of the first ``width``
        mask slots (default all ``block_size − 1``; the LM head runs on those only), their final-normed
        hidden)."""
        lengths = state.lengths().to(self.device)
        held = self.cache.lengths
        if not torch.equal(held, lengths - 1):
            raise RuntimeError(
                f"DFlash drafter holds context for {held.tolist()} positions per row, the batch has "
                f"{(lengths - 1).tolist()} committed tokens before the last"
            )
        ids = self.model.block_ids(state.last_tokens().to(self.device), self.block_size)
        positions = (lengths - 1).unsqueeze(1) + torch.arange(self.block_size, device=self.device).unsqueeze(
            0
        )
        hidden = self.model(self.model.embed_block(ids, self._embedding[0]), positions, self.cache)[:, 1:]
        hidden = hidden[:, : self.block_size - 1 if width is None else width]
        rows = self._rows[0]
        logits = F.linear(hidden.to(rows.dtype), rows).float()
        if self.draft_vocab is not None:
            logits = self.draft_vocab.expand_logits(logits)
        return logits, hidden

    @torch.no_grad()
    def propose(self, state, caps: torch.Tensor, sampler, want_hidden: bool = False) -> Proposal:
        batch, device = state.size, state.device
        caps = torch.clamp(caps.to(device), max=self.block_size - 1)
        width = int(caps.max()) if batch else 0
        if width == 0:
            return Proposal.empty(batch, device)
        logits, hidden = self.draft_logits(state, width)
        drafting = caps > 0
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        tokens, qs = [], []
        for j in range(width):
            token, q = sampler.draw(logits[:, j].to(device))
            tokens.append(torch.where(drafting, token, torch.full_like(token, state.pad_id)))
            qs.append(q)
            lengths = lengths + drafting.long()
            drafting = drafting & (lengths < caps) & ~state.is_eos(token) & sampler.continues(q, token)
            if not bool(drafting.any()):
                break
        count = len(tokens)
        return Proposal(
            tokens=torch.stack(tokens, dim=1),
            lengths=lengths,
            q=torch.stack(qs, dim=1),
            hidden=hidden[:, :count].float().to(device) if want_hidden else None,
            forwards=1,
        )

    def describe(self) -> dict:
        return {
            "drafter": self.name,
            "drafter_kind": "dflash",
            "target_layer_ids": list(self.model.config.target_layer_ids),
            "block_size": self.block_size,
            "draft_vocab_size": self.draft_vocab.size if self.draft_vocab is not None else None,
        }


def dflash_drafter(
    path: str | None, verifier: Any, vocab_size: int, block_size: int | None = None
) -> DFlashDrafter:
    """``model/drafter=dflash``: ``path`` (``model.drafter.params.path``) is the ``trained.pt`` /
    ``last.ckpt`` of ``task=train method=dflash``, a z-lab layout directory or a hub id, for this verifier (a
    ``LoadedModel``); ``block_size`` (null: the checkpoint's) sets the slots per forward."""
    from specbench.models.checkpoints import resolve_project_path

    if not path:
        raise ValueError(
            "model.drafter.params.path is null: pass a DFlash checkpoint: the trained.pt of task=train "
            "method=dflash, or a directory in the z-lab layout (config.json + model.safetensors), e.g. a "
            "download "
            "of z-lab/Qwen3-8B-DFlash-b16"
        )
    model = getattr(verifier, "model", verifier)
    source = Path(resolve_project_path(str(path))).expanduser()
    draft_vocab = None
    if source.is_file():
        draft, draft_vocab = load_trained_dflash(source, verifier, vocab_size)
        name = f"dflash ({source.parent.name or source.name})"
    else:
        if not source.is_dir():
            from huggingface_hub import snapshot_download

            from specbench.drafters.eagle3.format import looks_like_file

            if looks_like_file(str(path)):
                raise FileNotFoundError(
                    f"model.drafter.params.path={str(path)!r}: no such file or directory (a trained.pt of "
                    "task=train "
                    "method=dflash, or a z-lab layout directory)"
                )

            source = Path(snapshot_download(str(path), allow_patterns=["*.json", "*.safetensors"]))
        draft, name = load_dflash(source, model), f"dflash ({source.name})"
    return DFlashDrafter(draft, model, vocab_size, block_size, name, draft_vocab)
