"""A transformers causal LM as a drafter (hub / local model, early exit), with its own KV cache."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from specbench.decoding.cache import CachedModel, ForwardOutput
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.drafters.base import Drafter, Proposal, VerifierView


class ModelDrafter(Drafter):
    """Drafts token by token from a causal LM sharing the verifier's vocabulary (``vocab_size`` columns).

    The model keeps its own cache through :class:`CachedModel`; each round it first processes the tokens
    committed since its last forward (the previous round's accepted drafts are already cached, the
    correction/bonus token is not), then draws up to ``caps[b]`` tokens with the engine's sampler.
    """

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None, name: str | None = None):
        self.model = model
        self.cached = CachedModel(model, vocab_size or model.config.vocab_size)
        self.hidden_size = int(model.config.hidden_size)
        self.name = name or getattr(model, "name_or_path", None) or type(model).__name__

    @property
    def vocab_size(self) -> int:
        return self.cached.vocab_size

    @property
    def device(self) -> torch.device:
        return self.cached.device

    def reset(self, batch_size: int) -> None:
        self.cached.reset(batch_size)

    def prefill(self, state: BatchState, view: VerifierView | None) -> None:
        context, valid = state.tokens[:, :-1], state.token_valid[:, :-1]
        if context.shape[1]:
            self._forward(context, valid)

    def _forward(self, tokens: torch.Tensor, valid: torch.Tensor, output_hidden: bool = False) -> ForwardOutput:
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
        for _ in range(max_len):
            out = self._forward(step_input, step_valid, output_hidden=want_hidden)
            forwards += 1
            token, q = sampler.draw(out.logits[:, -1])
            token = torch.where(drafting, token, torch.full_like(token, state.pad_id))
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
        hidden = torch.stack(hiddens, dim=1) if want_hidden else None
        return Proposal(torch.stack(drafts, dim=1), lengths, torch.stack(probs, dim=1), hidden, forwards)

    def commit(self, state: BatchState, view: VerifierView, accepted: torch.Tensor) -> None:
        committed = state.lengths() - 1
        self.cached.keep(torch.minimum(self.cached.num_valid, committed))

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cached.select_rows(rows)

    def describe(self) -> dict:
        return {"drafter": self.name}
