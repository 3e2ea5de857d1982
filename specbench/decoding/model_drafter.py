"""A transformers causal LM as a drafter (hub / local model, early exit), with its own KV cache.

The engine takes only drafters; a model becomes one of these where its pair is built
(:func:`specbench.evaluation.build_engines`, the trainers, the benchmarks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from specbench.decoding.cache import CachedModel, ForwardOutput
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.protocol import Drafter, Proposal, VerifierView
from specbench.decoding.tree import chain_with_leaves, top_leaves
from specbench.models.draft_vocab import DraftVocab
from specbench.values import check_tree_width

# Config keys of models whose logits are not just lm_head(final hidden state) (soft-capping, scaling).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class ModelDrafter(Drafter):
    """Drafts token by token from a causal LM sharing the verifier's vocabulary (``vocab_size`` columns).

    The model keeps its own cache through :class:`CachedModel`; each round it first processes the tokens
    committed since its last forward (the previous round's accepted drafts are already cached, the
    correction/bonus token is not), then draws up to ``caps[b]`` tokens with the engine's sampler.

    ``draft_vocab``: a reduced draft vocabulary (over the same ``vocab_size`` ids). The forward then runs
    the model's body only and multiplies the final-normed last hidden state by the LM head's rows of the
    draft vocabulary (sliced once per device and dtype), never computing the full-vocabulary logits; the
    logits are expanded to ``vocab_size`` with ``-inf`` outside before the sampler warps them, so q is
    exactly 0 there and the exact rules stay exact.

    ``tree_width`` > 1: a tree of drafts, the chain plus the model's next ``tree_width − 1`` tokens as leaves
    at each depth (:mod:`specbench.decoding.tree`; only ``method=sd`` verifies trees).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        vocab_size: int | None = None,
        name: str | None = None,
        draft_vocab: DraftVocab | None = None,
        tree_width: int = 1,
    ):
        check_tree_width(tree_width)
        self.tree_width = tree_width
        self.proposes_trees = tree_width > 1
        self._fed: list[list[int]] = []  # trees: per row, the chain drafts the last propose fed to the cache
        self.model = model
        self._vocab_size = int(vocab_size or model.config.vocab_size)
        self.draft_vocab = draft_vocab
        self._rows: dict[
            tuple[torch.device, torch.dtype], tuple[tuple, torch.Tensor, torch.Tensor | None]
        ] = {}
        if draft_vocab is None:
            self.cached = CachedModel(model, self._vocab_size)
        else:
            check_draft_vocab(model, draft_vocab, self._vocab_size)
            self.cached = CachedModel(model, draft_vocab.size, lm_head=self._draft_logits)
        self.hidden_size = int(model.config.hidden_size)
        self.name = name or getattr(model, "name_or_path", None) or type(model).__name__

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def lm_head_rows(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def draft_rows(
        self, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The LM head's weight (and bias) rows of the draft vocabulary on ``device`` in ``dtype``, sliced
        once and cached (sliced again only if the LM head's weights were changed, e.g. by training)."""
        head = self.model.get_output_embeddings()
        source = (head.weight.data_ptr(), head.weight._version)
        cached = self._rows.get((device, dtype))
        if cached is None or cached[0] != source:
            with torch.no_grad():
                weight, bias = lm_head_rows(self.model, self.draft_vocab)
            weight = weight.to(device=device, dtype=dtype)
            bias = bias.to(device=device, dtype=dtype) if bias is not None else None
            cached = (source, weight, bias)
            self._rows[(device, dtype)] = cached
        return cached[1], cached[2]

    def _draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, 1, draft size) logits of the last column (the only one the drafter reads) from the body's
        final-normed hidden states (B, W, H)."""
        last = hidden[:, -1:]
        weight, bias = self.draft_rows(last.device, last.dtype)
        return F.linear(last, weight, bias)

    def _next_logits(self, out: ForwardOutput) -> torch.Tensor:
        """(B, vocab_size) logits of the next token after the forward ``out``."""
        logits = out.logits[:, -1]
        return logits if self.draft_vocab is None else self.draft_vocab.expand_logits(logits)

    @property
    def device(self) -> torch.device:
        return self.cached.device

    def reset(self, batch_size: int) -> None:
        self.cached.reset(batch_size)

    def prefill(self, state: BatchState, view: VerifierView | None) -> None:
        context, valid = state.tokens[:, :-1], state.token_valid[:, :-1]
        if context.shape[1]:
            self._forward(context, valid)

    def _forward(
        self, tokens: torch.Tensor, valid: torch.Tensor, output_hidden: bool = False
    ) -> ForwardOutput:
        """One forward of the drafter over new columns; subclasses wrap it (e.g. steering hooks)."""
        return self.cached.forward(tokens, valid, output_hidden=output_hidden)

    def propose(
        self, state: BatchState, caps: torch.Tensor, sampler: DraftSampler, want_hidden: bool = False
    ) -> Proposal:
        batch = state.size
        max_len = int(caps.max()) if batch else 0
        if max_len == 0:
            return Proposal.empty(batch, state.device)
        step_input, step_valid = state.pending_for(self.cached.num_valid)
        drafts, probs, hiddens = [], [], []
        drafting = caps > 0
        lengths = torch.zeros(batch, dtype=torch.long, device=state.device)
        forwards = 0
        leaves, before_drafts = [], None
        for _ in range(max_len):
            out = self._forward(step_input, step_valid, output_hidden=want_hidden)
            forwards += 1
            if before_drafts is None:
                before_drafts = self.cached.num_valid.clone()  # the slots after this hold fed drafts
            logits = self._next_logits(out)
            token, q = sampler.draw(logits)
            token = torch.where(drafting, token, torch.full_like(token, state.pad_id))
            if self.proposes_trees:
                leaves.append(top_leaves(logits.float(), token, drafting, self.tree_width - 1))
            drafts.append(token)
            probs.append(q)
            if want_hidden:
                hiddens.append(out.hidden[:, -1])
            lengths = lengths + drafting.long()
            keep_going = drafting & (lengths < caps) & ~state.is_eos(token) & sampler.continues(q, token)
            if not bool(keep_going.any()):
                break
            step_input, step_valid = token.unsqueeze(1), keep_going.unsqueeze(1)
            drafting = keep_going
        if self.proposes_trees:
            chain = torch.stack(drafts, dim=1).tolist()
            fed = (self.cached.num_valid - before_drafts).tolist()
            self._fed = [row[:n] for row, n in zip(chain, fed)]
            return chain_with_leaves(torch.stack(drafts, dim=1), lengths, leaves, state.pad_id, forwards,
                                     torch.stack(probs, dim=1))  # fmt: skip
        hidden = torch.stack(hiddens, dim=1) if want_hidden else None
        return Proposal(torch.stack(drafts, dim=1), lengths, torch.stack(probs, dim=1), hidden, forwards)

    def commit(self, state: BatchState, view: VerifierView, accepted: torch.Tensor) -> None:
        committed = state.lengths() - 1
        keep = torch.minimum(self.cached.num_valid, committed)
        if self.proposes_trees:
            # The cache holds the chain's drafts; a path that left the chain for a leaf keeps only the drafts
            # before it (for a chain the accepted drafts are exactly the leading cached ones).
            keep = keep - torch.tensor(
                self._stale_drafts(state, accepted), dtype=torch.long, device=keep.device
            )
        self.cached.keep(keep)

    def _stale_drafts(self, state: BatchState, accepted: torch.Tensor) -> list[int]:
        """Per row: the cached chain drafts that the accepted path does not share (each row's accepted
        drafts are the ``accepted[b]`` tokens before its newest one)."""
        stale = []
        for row, (fed, n) in enumerate(zip(self._fed, accepted.tolist())):
            kept = state.row_tokens(row)[-1 - n : -1] if n else []
            same = 0
            while same < min(len(fed), n) and fed[same] == kept[same]:
                same += 1
            stale.append(min(len(fed), n) - same)
        return stale

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cached.select_rows(rows)

    def describe(self) -> dict:
        described = {"drafter": self.name}
        if self.draft_vocab is not None:
            described["draft_vocab_size"] = self.draft_vocab.size
        return described


def lm_head_rows(model: PreTrainedModel, draft_vocab: DraftVocab) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LM head's weight (and bias) rows of ``draft_vocab``, in draft-id order (differentiable: training
    over a draft vocabulary trains exactly these rows)."""
    head = model.get_output_embeddings()
    ids = draft_vocab.draft_ids.to(head.weight.device)
    bias = getattr(head, "bias", None)
    return head.weight.index_select(0, ids), bias.index_select(0, ids) if bias is not None else None


def draft_logits(model: PreTrainedModel, draft_vocab: DraftVocab, hidden: torch.Tensor) -> torch.Tensor:
    """(..., draft size) logits of final-normed hidden states (..., H) over ``draft_vocab`` only (the
    LM head's draft rows; the full head never runs)."""
    return F.linear(hidden, *lm_head_rows(model, draft_vocab))


def check_draft_vocab(model: PreTrainedModel, draft_vocab: DraftVocab, vocab_size: int) -> None:
    """Raise ValueError unless ``model``'s logits are its LM head applied to its body's output and
    ``draft_vocab`` covers ``vocab_size`` ids (what a reduced-vocabulary model drafter relies on)."""
    if draft_vocab.vocab_size != vocab_size:
        raise ValueError(
            f"the draft vocabulary covers {draft_vocab.vocab_size} ids, but the drafter's vocabulary shared "
            f"with the verifier has {vocab_size}: it was built for another tokenizer"
        )
    if model.base_model is model:
        raise ValueError(f"{type(model).__name__} has no decoder body (base_model) apart from its LM head")
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or head.weight.shape[0] < vocab_size:
        raise ValueError(
            f"{type(model).__name__} has no plain linear LM head of >= {vocab_size} rows (got "
            f"{type(head).__name__}) to slice a draft vocabulary from"
        )
    transforms = [k for k in LOGIT_TRANSFORMS if getattr(model.config, k, None) not in (None, 1, 1.0)]
    if transforms:
        raise ValueError(
            f"{type(model).__name__} transforms its logits ({', '.join(transforms)}), so they are not its LM "
            "head's rows applied to the hidden state; use it without a draft vocabulary"
        )
