"""EAGLE-3 as a :class:`~specbench.decoding.protocol.Drafter`: an
:class:`~specbench.drafters.eagle3.head.Eagle3Head` with its own KV cache, fed the verifier features the
engine hands over.

Decoding pairs the verifier feature at position ``t`` with the embedding of token ``t + 1``: after the
prefill over the prompt minus its last token the head has entries for positions ``0 .. n − 2`` and its
last output predicts token ``n``, the first draft. After a round its draft entries are dropped and the
verifier features of the accepted positions (view columns ``0 .. accepted``) are paired with the emitted
tokens at the next ``propose``. Training (:mod:`specbench.training.eagle3`) unrolls the same step.
"""

from __future__ import annotations

import torch

from specbench.decoding.cache import CachedModel
from specbench.decoding.protocol import Drafter, Proposal, VerifierNeeds, VerifierView
from specbench.decoding.tree import chain_with_leaves, top_leaves
from specbench.drafters.eagle3.head import Eagle3Head
from specbench.values import check_tree_width


class Eagle3Drafter(Drafter):
    """An :class:`Eagle3Head` behind the drafter interface, with its own KV cache (:class:`CachedModel`).

    Per row it keeps the verifier features that arrived (prefill / commit) but the head has not processed
    yet, right-aligned like the batch's tokens; ``propose`` processes them, then drafts on its own hidden
    states. Drafted tokens lie in the draft vocabulary and ``Proposal.q`` is exactly 0 outside it.
    """

    name = "eagle3"

    def __init__(self, head: Eagle3Head, name: str = "eagle3", tree_width: int = 1):
        check_tree_width(tree_width)
        self.head = head.eval()
        self.name = name
        # tree_width > 1: at every depth of the drafted chain also propose the head's next tree_width - 1
        # most likely tokens as leaves (one verifier forward checks them all; decoding/tree.py).
        self.tree_width = tree_width
        self.proposes_trees = tree_width > 1
        self.needs = VerifierNeeds(taps=head.taps)
        self.hidden_size = head.hidden_size
        self.cached = CachedModel(head, head.vocab.size)
        self._pending: torch.Tensor | None = None  # (B, W, F) right-aligned unprocessed verifier features
        self._pending_valid: torch.Tensor | None = None  # (B, W)
        self._processed = torch.zeros(0, dtype=torch.long)  # (B,) head entries holding true features

    @property
    def device(self) -> torch.device:
        return self.cached.device

    def reset(self, batch_size: int) -> None:
        self.cached.reset(batch_size)
        self._pending = self._pending_valid = None
        self._processed = torch.zeros(batch_size, dtype=torch.long, device=self.device)

    def _features(self, view: VerifierView) -> torch.Tensor:
        """The view's taps in the head's order, on the head's device (a verifier spread over several GPUs
        yields taps on several devices)."""
        return torch.cat([view.taps[i].to(self.device) for i in self.head.taps], dim=-1)

    def prefill(self, state, view: VerifierView | None) -> None:
        if view is not None and view.valid.shape[1] > 0:
            self._add_pending(self._features(view), view.valid.to(self.device).bool())

    def _add_pending(self, features: torch.Tensor, valid: torch.Tensor) -> None:
        if self._pending is not None:
            features = torch.cat([self._pending, features.to(self._pending.dtype)], dim=1)
            valid = torch.cat([self._pending_valid, valid], dim=1)
        order = torch.sort(valid.long(), dim=1, stable=True).indices  # right-align each row's entries
        valid = torch.gather(valid, 1, order)
        features = torch.gather(features, 1, order.unsqueeze(-1).expand(-1, -1, features.shape[-1]))
        keep = int(valid.sum(dim=1).max()) if valid.numel() else 0
        self._pending = features[:, features.shape[1] - keep :]
        self._pending_valid = valid[:, valid.shape[1] - keep :]

    def _forward(
        self, tokens, valid, want_hidden: bool, **inputs
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One head forward through the cache: (logits, pre-norm h, final-normed hidden or None) of the last
        column (B, ...)."""
        out = self.cached.forward(tokens, valid, output_hidden=want_hidden, output_taps=(1,), **inputs)
        normed = out.hidden[:, -1].float() if want_hidden else None
        return out.logits[:, -1], out.taps[1][:, -1:], normed

    @torch.no_grad()
    def _process_pending(self, state, want_hidden: bool):
        """Feed the pending (feature, next token) pairs; the outputs of each row's last one."""
        if self._pending is None or self._pending.shape[1] == 0:
            return None, None, None
        width = self._pending.shape[1]
        counts = self._pending_valid.sum(dim=1)
        expected = state.lengths() - 1 - self._processed
        if not torch.equal(counts, expected):
            raise RuntimeError(
                f"EAGLE-3 head out of step with the batch: {counts.tolist()} pending verifier features for "
                f"{expected.tolist()} unprocessed tokens per row"
            )
        outputs = self._forward(
            state.tokens[:, -width:], self._pending_valid, want_hidden, verifier_features=self._pending
        )
        self._processed = self._processed + counts
        self._pending = self._pending_valid = None
        return outputs

    @torch.no_grad()
    def propose(self, state, caps: torch.Tensor, sampler, want_hidden: bool = False) -> Proposal:
        logits, hidden, normed = self._process_pending(state, want_hidden)
        caps = torch.where(self._processed > 0, caps, torch.zeros_like(caps))  # a row with no context yet
        batch, device = state.size, state.device
        max_len = int(caps.max()) if batch else 0
        if logits is None or max_len == 0:
            if logits is None and bool((caps > 0).any()):
                raise RuntimeError("EAGLE-3 head asked to draft before any verifier feature arrived")
            return Proposal.empty(batch, device)
        drafting = caps > 0
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        tokens, qs, hiddens, leaves = [], [], [], []
        forwards = 0
        for _ in range(max_len):
            full_logits = self.head.vocab.expand_logits(logits.float())
            token, q = sampler.draw(full_logits)
            token = torch.where(drafting, token, torch.full_like(token, state.pad_id))
            if self.proposes_trees:
                leaves.append(top_leaves(full_logits, token, drafting, self.tree_width - 1))
            tokens.append(token)
            qs.append(q)
            if want_hidden:
                hiddens.append(normed)
            lengths = lengths + drafting.long()
            drafting = drafting & (lengths < caps) & ~state.is_eos(token) & sampler.continues(q, token)
            if not bool(drafting.any()):
                break
            logits, hidden, normed = self._forward(
                token.unsqueeze(1), drafting.unsqueeze(1), want_hidden, draft_hidden=hidden
            )
            forwards += 1
        if self.proposes_trees:
            return chain_with_leaves(torch.stack(tokens, dim=1), lengths, leaves, state.pad_id, forwards + 1,
                                     torch.stack(qs, dim=1))  # fmt: skip
        return Proposal(
            tokens=torch.stack(tokens, dim=1),
            lengths=lengths,
            q=torch.stack(qs, dim=1),
            hidden=torch.stack(hiddens, dim=1) if want_hidden else None,
            forwards=forwards + 1,
        )

    def commit(self, state, view: VerifierView, accepted: torch.Tensor) -> None:
        self.cached.keep(self._processed)  # drop this round's draft entries
        pending = self._pending_valid.sum(dim=1) if self._pending is not None else torch.zeros_like(accepted)
        new = state.lengths() - 1 - self._processed - pending
        width = view.valid.shape[1]
        if bool((new < 0).any()) or bool(
            (new > torch.minimum(accepted + 1, torch.full_like(new, width))).any()
        ):
            raise RuntimeError(
                f"EAGLE-3 head: {new.tolist()} new committed tokens per row do not fit "
                f"accepted={accepted.tolist()}"
            )
        columns = torch.arange(width, device=new.device).unsqueeze(0)
        self._add_pending(self._features(view), columns < new.unsqueeze(1))

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cached.select_rows(rows)
        self._processed = self._processed[rows]
        if self._pending is not None:
            features, valid = self._pending[rows], self._pending_valid[rows]
            self._pending = self._pending_valid = None
            self._add_pending(features, valid)

    def describe(self) -> dict:
        return {
            "drafter": self.name,
            "drafter_kind": "eagle3",
            "taps": list(self.head.taps),
            "draft_vocab_size": self.head.vocab.size,
            "tree_width": self.tree_width,
        }
