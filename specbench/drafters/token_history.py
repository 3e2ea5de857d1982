"""Per-row token histories for model-free drafters, kept in step with the engine's ``BatchState``.

Each round only the tokens a row gained since the previous call are read from the state (one small tensor
slice for the whole batch) and handed to that row's index, so a lookup drafter never rescans its context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import torch

from specbench.decoding.protocol import Proposal

if TYPE_CHECKING:  # pragma: no cover
    from specbench.decoding.drafting import BatchState


class TokenRow(Protocol):
    """What a row index offers: its full token list and a way to append new tokens."""

    tokens: list[int]

    def extend(self, new_tokens: list[int]) -> None: ...


Row = TypeVar("Row", bound=TokenRow)


class RowHistories(Generic[Row]):
    """One index object per row of the batch, fed each row's new tokens from a ``BatchState``."""

    def __init__(self, new_row: Callable[[], Row]):
        self._new_row = new_row
        self.rows: list[Row] = []

    def start(self, batch_size: int) -> None:
        """Forget every row; ``batch_size`` empty rows."""
        self.rows = [self._new_row() for _ in range(batch_size)]

    def sync(self, state: BatchState) -> list[list[int]]:
        """Append to each row the tokens ``state`` has beyond what the row holds; return them per row."""
        if len(self.rows) != state.size:
            raise ValueError(
                f"the drafter holds {len(self.rows)} rows but the batch has {state.size}: call reset/prefill "
                "for a new batch and select_rows when rows leave it"
            )
        lengths = state.lengths().tolist()
        counts = [length - len(row.tokens) for length, row in zip(lengths, self.rows)]
        if counts and min(counts) < 0:
            raise ValueError(
                "a row of the batch got shorter than the drafter's history: tokens are never removed"
            )
        width = max(counts, default=0)
        if width == 0:
            return [[] for _ in self.rows]
        block = state.tokens[:, -width:].tolist()
        new = [values[width - count :] if count else [] for values, count in zip(block, counts)]
        for row, tokens in zip(self.rows, new):
            if tokens:
                row.extend(tokens)
        return new

    def select(self, rows: torch.Tensor) -> list[Row]:
        """Keep only the given rows (in that order); return the rows that left."""
        keep = [int(i) for i in rows.tolist()]
        kept = set(keep)
        dropped = [row for i, row in enumerate(self.rows) if i not in kept]
        self.rows = [self.rows[i] for i in keep]
        return dropped


class FirstOccurrenceIndex:
    """A token list and, for every n in ``[min_n, max_n]``, where each n-gram first occurred.

    Appending a token adds the n-grams that end at it (``max_n - min_n + 1`` dictionary inserts); the
    earliest earlier occurrence of the last n tokens is then one dictionary lookup.
    """

    __slots__ = ("_min_n", "_tables", "tokens")

    def __init__(self, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.tokens: list[int] = []
        self._min_n = min_n
        self._tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n - min_n + 1)]

    def extend(self, new_tokens: list[int]) -> None:
        tokens = self.tokens
        for token in new_tokens:
            tokens.append(token)
            end = len(tokens)
            start = end - self._min_n
            for table in self._tables:
                if start < 0:
                    break
                key = tuple(tokens[start:end])
                if key not in table:
                    table[key] = start
                start -= 1

    def first_start(self, n: int) -> int:
        """Start of the first occurrence of the last ``n`` tokens (``len - n``: no other occurrence)."""
        return self._tables[n - self._min_n][tuple(self.tokens[-n:])]

    def continuation(self, n: int) -> int | None:
        """Where the tokens that followed the first earlier occurrence of the last ``n`` tokens begin, or None
        when the last ``n`` tokens occur nowhere else (an occurrence may overlap the last ``n`` tokens)."""
        end = len(self.tokens)
        if n >= end:
            return None
        follow = self.first_start(n) + n
        return follow if follow < end else None


def proposal_from_lists(
    drafts: list[list[int]], state: BatchState, keep_eos: bool, match_lengths: list[int]
) -> Proposal:
    """A deterministic ``Proposal`` from per-row draft lists, each cut at its first EOS token.

    ``keep_eos``: the EOS token itself stays the last draft (the engine stops the row there if it is
    accepted); otherwise the draft ends just before it, as HF's prompt lookup does. ``match_lengths``: the
    context match each row's draft continues (reported as 0 for rows left without drafts).
    """
    flat = [token for draft in drafts for token in draft]
    if not flat:
        empty = Proposal.empty(len(drafts), state.device)
        empty.match_lengths = torch.zeros(len(drafts), dtype=torch.long, device=state.device)
        return empty
    is_eos = state.is_eos(torch.tensor(flat, dtype=torch.long, device=state.device)).tolist()
    if any(is_eos):
        cut, at = [], 0
        for draft in drafts:
            marks = is_eos[at : at + len(draft)]
            at += len(draft)
            cut.append(draft[: marks.index(True) + keep_eos] if True in marks else draft)
        drafts = cut
    width = max(len(draft) for draft in drafts)
    padded = [draft + [state.pad_id] * (width - len(draft)) for draft in drafts]
    return Proposal(
        tokens=torch.tensor(padded, dtype=torch.long, device=state.device).reshape(len(drafts), width),
        lengths=torch.tensor([len(draft) for draft in drafts], dtype=torch.long, device=state.device),
        q=None,
        forwards=0,
        match_lengths=torch.tensor(
            [m if draft else 0 for m, draft in zip(match_lengths, drafts)],
            dtype=torch.long,
            device=state.device,
        ),
    )
