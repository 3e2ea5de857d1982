"""The drafter interface: the one thing the decoding engine knows about drafters (drafter authors may import
it from :mod:`specbench.drafters.base`).

A drafter proposes up to ``caps[b]`` tokens for each row of a batch; the engine verifies them with one
verifier forward and tells the drafter what was kept. Model drafters (a transformers model with its own KV
cache), SD²-steered drafters, EAGLE-style heads and model-free lookup drafters all implement it; the
engine never asks which kind it has.

Life cycle, per batch of prompts::

    reset(batch_size)
    prefill(state, view)                       # the prompts; view = the verifier's forward over all but
                                               # the last prompt token (None if nothing was requested)
    loop:
        proposal = propose(state, caps, sampler, want_hidden)   # up to caps[b] drafts per row
        ... the verifier scores [last token, drafts] in one forward (its view), the rule accepts n[b] ...
        commit(state, view, accepted)          # state now ends with the n[b] drafts + correction/bonus
        select_rows(alive)                     # when rows finish

A drafter declares in ``needs`` which verifier outputs it reads; the engine requests exactly those from the
verification forward that runs anyway (never an extra verifier pass) and hands them over in a
:class:`VerifierView`.

Hidden-state convention (one for every tap, checked by tests against the model's own forward):
``taps[i]`` with ``0 <= i <= L`` is the residual stream after ``i`` decoder layers, *before* the final norm
(``i = 0`` is the embedding output, ``i = L`` the last layer's output); ``hidden`` is the final-normed last
hidden state, the one the LM head reads (``lm_head(hidden) == logits``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from specbench.decoding.drafting import BatchState, DraftSampler


@dataclass(frozen=True)
class VerifierNeeds:
    """Which verifier outputs a drafter (or a rule) reads from the forwards that already run."""

    hidden: bool = False  # the final-normed last hidden state (B, W, H)
    taps: tuple[int, ...] = ()  # residual-stream taps (indices into 0..L, see the module docstring)

    def union(self, other: VerifierNeeds) -> VerifierNeeds:
        return VerifierNeeds(self.hidden or other.hidden, tuple(sorted(set(self.taps) | set(other.taps))))

    @property
    def any(self) -> bool:
        return self.hidden or bool(self.taps)


@dataclass
class VerifierView:
    """What one verifier forward exposes: its inputs and the outputs some drafter or rule asked for.

    ``input_ids`` / ``valid`` are (B, W); ``hidden`` is (B, W, H) or None; ``taps`` maps a tap index to its
    (B, W, H) tensor (only the requested ones). Column ``j`` of a verification forward holds the state
    whose input is token ``j`` of ``[last token, draft 1, ..., draft γ]``.
    """

    input_ids: torch.Tensor
    valid: torch.Tensor
    hidden: torch.Tensor | None = None
    taps: dict[int, torch.Tensor] = field(default_factory=dict)

    def tap_features(self, layers: tuple[int, ...]) -> torch.Tensor:
        """The requested taps concatenated on the last dim, in the given order: (B, W, len(layers)·H)."""
        return torch.cat([self.taps[i] for i in layers], dim=-1)


@dataclass
class Proposal:
    """The drafts of one round.

    tokens: (B, G) drafted ids (G = the longest row; entries past ``lengths[b]`` are padding);
    lengths: (B,) drafts per row, ``0 <= lengths[b] <= caps[b]``;
    q: (B, G, V) the exact distributions the drafts were sampled from, or None for a deterministic proposer
    (the verification rules then treat q as one-hot on the drafted token);
    hidden: (B, G, H) the drafter's own final hidden state at each drafted position (rules that read drafter
    states, e.g. DIVERSED, ask for it through ``want_hidden``), else None;
    forwards: drafter forward passes spent (0 for model-free drafters), for the cost accounting;
    match_lengths: (B,) for lookup drafters, the length of the context match each row's drafts continue
    (0: no match), which the cost-aware schedule uses to estimate acceptance; None otherwise;
    parents: (B, G) for a tree of drafts (:mod:`specbench.decoding.tree`), the verifier column of each
    draft's parent (0: the last committed token; draft ``j`` is column ``j + 1``; -1: padding), with
    ``lengths[b]`` the row's number of real nodes; None for a chain. Tree drafts are verified only by the
    exact ``sd`` rule, one-hot, except a first child whose ``q`` row is the distribution it was drawn from
    (other nodes' rows are zeros).
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    q: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    forwards: int = 0
    match_lengths: torch.Tensor | None = None
    parents: torch.Tensor | None = None

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def truncated(self, lengths: torch.Tensor) -> Proposal:
        """The same drafts cut to ``lengths`` (<= the current ones), columns no row uses dropped."""
        if self.is_tree:
            raise ValueError("a tree of drafts cannot be cut to lengths; schedules trim chains only")
        lengths = torch.minimum(lengths, self.lengths)
        width = int(lengths.max()) if lengths.numel() else 0
        return Proposal(
            self.tokens[:, :width], lengths,
            None if self.q is None else self.q[:, :width],
            None if self.hidden is None else self.hidden[:, :width],
            self.forwards, self.match_lengths,
        )  # fmt: skip

    @classmethod
    def empty(cls, batch: int, device: torch.device) -> Proposal:
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        return cls(torch.zeros(batch, 0, dtype=torch.long, device=device), zeros)


class Drafter(ABC):
    """Base class of every drafter. Subclasses set ``needs`` / ``deterministic`` and implement ``propose``.

    ``deterministic``: the drafter proposes tokens without a distribution (``Proposal.q is None``); the
    config refuses rules whose math needs a real q for such a drafter.
    ``hidden_size``: width of ``Proposal.hidden`` when the drafter can produce it (None: it cannot).
    ``proposes_trees``: its proposals may be trees of drafts (``Proposal.parents``).
    ``trimmed_by_schedule``: ``schedule=cost_aware`` lets it propose up to ``max_gamma`` tokens and trims the
    proposal by its rows' ``match_lengths``, instead of capping γ before it drafts (default: the
    deterministic, lookup drafters).
    """

    needs: VerifierNeeds = VerifierNeeds()
    deterministic: bool = False
    proposes_trees: bool = False  # Proposal.parents set: verified by the exact sd rule only
    hidden_size: int | None = None
    name: str = "drafter"

    @property
    def trimmed_by_schedule(self) -> bool:
        return self.deterministic

    @property
    def lm_head_rows(self) -> int | None:
        """Rows of the drafter's own LM head, which the engine checks against the verifier's vocabulary
        (None: it has none of its own, as lookup drafters and heads reading the verifier's)."""
        return None

    def reset(self, batch_size: int) -> None:
        """Forget every row; a new batch of ``batch_size`` rows starts."""

    def prefill(self, state: BatchState, view: VerifierView | None) -> None:
        """Start the batch: ``state`` holds the prompts (right-aligned, left padding). The verifier has just
        processed every prompt token but the last (``state.tokens[:, :-1]``); ``view`` is that forward's
        output (None when no drafter or rule asked for verifier outputs, or the context is empty)."""

    @abstractmethod
    def propose(
        self, state: BatchState, caps: torch.Tensor, sampler: DraftSampler, want_hidden: bool = False
    ) -> Proposal:
        """Up to ``caps[b]`` drafts for each row of ``state`` (the committed tokens of every row)."""

    def commit(self, state: BatchState, view: VerifierView, accepted: torch.Tensor) -> None:
        """After a round: row ``b`` accepted ``accepted[b]`` drafts and ``state`` now ends with them and the
        correction/bonus token. ``view`` is this round's verification forward: its columns
        ``0..accepted[b]`` are the true verifier states whose inputs were the last token and the accepted
        drafts. Every token of ``state`` except the newest is final context (the verifier has processed
        it); a drafter with a cache drops whatever it holds beyond that."""

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given rows (finished sequences leave the batch)."""

    def memory_state(self) -> object:
        """What the drafter remembers across requests (a suffix drafter's global tree), to hand back to
        :meth:`restore_memory` after a generation that must leave no trace, such as a warm-up."""
        return None

    def restore_memory(self, state: object) -> None:
        """Forget every request since :meth:`memory_state` returned ``state``."""

    def save_memory(self) -> Path | None:
        """After a run: write what the drafter remembers across requests where it was told to keep it (a
        suffix drafter's ``cache_file``), and return that file; None when it keeps nothing."""
        return None

    def describe(self) -> dict:
        """What identifies this drafter in metrics and run records."""
        return {"drafter": self.name}
