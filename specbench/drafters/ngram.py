"""vLLM's ``ngram`` method: the longest suffix match of a size in [prompt_lookup_min, prompt_lookup_max].

The rule, as vLLM's ``vllm/v1/spec_decode/ngram_proposer.py`` implements it
(``_find_longest_matched_ngram_and_propose_tokens``, a KMP pass over the reversed context):

- take the largest n in ``[prompt_lookup_min, prompt_lookup_max]`` such that the last n tokens also occur
  ending before the last token (occurrences may overlap the last n tokens);
- tie rule: among the occurrences of that n-gram, the earliest (leftmost) one;
- propose the ``num_speculative_tokens`` tokens that followed it, fewer when the context ends first;
- nothing when the context is shorter than ``prompt_lookup_min`` or no size matches.

Defaults are vLLM's: ``prompt_lookup_min = prompt_lookup_max = 5`` when neither is given, the other mirrors
the one given; ``num_speculative_tokens`` has no default in vLLM (5 here, as in its documentation's example).
vLLM itself does not look at EOS (its scheduler stops a request there); this drafter ends a proposal at its
first EOS token (the EOS kept as the last draft) so that nothing is ever proposed past an EOS.
"""

from __future__ import annotations

import torch

from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.protocol import Drafter, Proposal, VerifierView
from specbench.drafters.token_history import FirstOccurrenceIndex, RowHistories, proposal_from_lists


class NgramDrafter(Drafter):
    """vLLM-compatible n-gram lookup over each row's prompt + output."""

    deterministic = True
    name = "ngram"

    def __init__(
        self,
        prompt_lookup_min: int | None = None,
        prompt_lookup_max: int | None = None,
        num_speculative_tokens: int = 5,
    ):
        if prompt_lookup_min is None and prompt_lookup_max is None:
            prompt_lookup_min = prompt_lookup_max = 5
        elif prompt_lookup_min is None:
            prompt_lookup_min = prompt_lookup_max
        elif prompt_lookup_max is None:
            prompt_lookup_max = prompt_lookup_min
        if prompt_lookup_min < 1 or prompt_lookup_max < prompt_lookup_min:
            raise ValueError(
                "ngram needs 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"prompt_lookup_min={prompt_lookup_min}, prompt_lookup_max={prompt_lookup_max}"
            )
        if num_speculative_tokens < 1:
            raise ValueError(f"ngram needs num_speculative_tokens >= 1, got {num_speculative_tokens}")
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max
        self.num_speculative_tokens = num_speculative_tokens
        self.histories: RowHistories[FirstOccurrenceIndex] = RowHistories(
            lambda: FirstOccurrenceIndex(prompt_lookup_min, prompt_lookup_max)
        )

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
        found = [
            self._lookup(row, cap) if cap > 0 else (0, [])
            for row, cap in zip(self.histories.rows, caps.tolist())
        ]
        return proposal_from_lists(
            [draft for _, draft in found], state, keep_eos=True, match_lengths=[n for n, _ in found]
        )

    def _lookup(self, index: FirstOccurrenceIndex, cap: int) -> tuple[int, list[int]]:
        """(n-gram size matched, proposal) for one row; (0, []) without a match."""
        tokens = index.tokens
        end = len(tokens)
        for n in range(min(self.prompt_lookup_max, end - 1), self.prompt_lookup_min - 1, -1):
            follow = index.continuation(n)
            if follow is not None:
                return n, tokens[follow : follow + min(self.num_speculative_tokens, cap)]
        return 0, []

    def describe(self) -> dict:
        return {
            "drafter": self.name,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
