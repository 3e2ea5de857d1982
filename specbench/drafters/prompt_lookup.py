"""Prompt lookup decoding: propose the tokens that followed an earlier occurrence of the last n-gram.

``match_rule="hf"`` is HF transformers' ``PromptLookupCandidateGenerator`` (what
``generate(prompt_lookup_num_tokens=k, max_matching_ngram_size=n)`` runs), decision for decision:

- n-gram sizes from ``min(max_matching_ngram_size, len - 1)`` down to 1; the first size with a usable
  match wins;
- for one size, the leftmost occurrence of the last n tokens whose continuation is non-empty, i.e. any
  occurrence but the last n tokens themselves (occurrences may overlap them);
- the proposal is up to ``num_output_tokens`` tokens that followed it, ending at the context's end;
- it is cut before its first EOS token; if that leaves nothing, nothing is proposed (HF does not fall back
  to another occurrence);
- ``max_length`` (HF's absolute length limit, optional here): no proposal when one token is left.
  The engine's ``caps`` bound each row's drafts to its remaining budget in any case.

HF's optional ``logits_processor`` screening of forbidden tokens is not reproduced (specbench has no
token-forbidding processors).

``match_rule="spec-bench"`` is the original prompt lookup decoding as Spec-Bench's PLD baseline runs it:
the leftmost occurrence whose full ``num_output_tokens`` continuation lies in the context and starts before
the last n tokens; no EOS cut beyond the engine's (the engine stops a row at EOS). Spec-Bench's
placeholder draft when nothing matches (token 100) is not reproduced: no match proposes nothing.
"""

from __future__ import annotations

import torch

from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.protocol import Drafter, Proposal, VerifierView
from specbench.drafters.token_history import FirstOccurrenceIndex, RowHistories, proposal_from_lists

MATCH_RULES = ("hf", "spec-bench")


class PromptLookupDrafter(Drafter):
    """HF's prompt lookup (defaults: n-grams up to 2, 10 tokens) over each row's prompt + output."""

    deterministic = True
    name = "prompt-lookup"

    def __init__(
        self,
        max_matching_ngram_size: int = 2,
        num_output_tokens: int = 10,
        max_length: int | None = None,
        match_rule: str = "hf",
    ):
        if max_matching_ngram_size < 1 or num_output_tokens < 1:
            raise ValueError(
                "prompt-lookup needs max_matching_ngram_size >= 1 and num_output_tokens >= 1, got "
                f"{max_matching_ngram_size} and {num_output_tokens}"
            )
        if match_rule not in MATCH_RULES:
            raise ValueError(
                f"prompt-lookup match_rule must be one of {list(MATCH_RULES)}, got {match_rule!r}"
            )
        self.max_matching_ngram_size = max_matching_ngram_size
        self.num_output_tokens = num_output_tokens
        self.max_length = max_length
        self.match_rule = match_rule
        self.histories: RowHistories[FirstOccurrenceIndex] = RowHistories(
            lambda: FirstOccurrenceIndex(1, max_matching_ngram_size)
        )

    @classmethod
    def spec_bench(cls) -> PromptLookupDrafter:
        """Spec-Bench's PLD baseline: n-grams up to 3, 10 tokens, its match rule."""
        return cls(max_matching_ngram_size=3, num_output_tokens=10, match_rule="spec-bench")

    def reset(self, batch_size: int) -> None:
        self.histories.start(batch_size)

    def prefill(self, state: BatchState, view: VerifierView | None) -> None:
        self.histories.start(state.size)
        self.histories.sync(state)

    def commit(self, state: BatchState, view: VerifierView, accepted: torch.Tensor) -> None:
        self.histories.sync(state)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.histories.select(rows)

    def propose(
        self, state: BatchState, caps: torch.Tensor, sampler: DraftSampler, want_hidden: bool = False
    ) -> Proposal:
        self.histories.sync(state)
        lookup = self._lookup_hf if self.match_rule == "hf" else self._lookup_spec_bench
        found = [
            lookup(row, cap) if cap > 0 else (0, []) for row, cap in zip(self.histories.rows, caps.tolist())
        ]
        return proposal_from_lists(
            [draft for _, draft in found],
            state,
            keep_eos=self.match_rule != "hf",
            match_lengths=[n for n, _ in found],
        )

    def _lookup_hf(self, index: FirstOccurrenceIndex, cap: int) -> tuple[int, list[int]]:
        """(n-gram size matched, proposal) for one row; (0, []) without a match."""
        tokens = index.tokens
        end = len(tokens)
        if self.max_length is not None and self.max_length == end + 1:
            return 0, []
        limit = end if self.max_length is None else min(end, self.max_length)
        for n in range(min(self.max_matching_ngram_size, end - 1), 0, -1):
            follow = index.continuation(n)
            if follow is None or follow >= limit:
                continue
            # HF drops EOS and what follows afterwards and does not try another match: the caller's cut
            # (keep_eos=False) does the same on this list.
            return n, tokens[follow : min(follow + self.num_output_tokens, limit, follow + cap)]
        return 0, []

    def _lookup_spec_bench(self, index: FirstOccurrenceIndex, cap: int) -> tuple[int, list[int]]:
        tokens = index.tokens
        end = len(tokens)
        k = self.num_output_tokens
        for n in range(min(self.max_matching_ngram_size, end), 0, -1):
            start = index.first_start(n)
            # The first occurrence is the best candidate: every later one has a larger start.
            if start + n + k <= end and start + n < end - n:
                return n, tokens[start + n : start + n + min(k, cap)]
        return 0, []

    def describe(self) -> dict:
        return {
            "drafter": self.name,
            "max_matching_ngram_size": self.max_matching_ngram_size,
            "num_output_tokens": self.num_output_tokens,
            "match_rule": self.match_rule,
        }
