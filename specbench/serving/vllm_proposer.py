"""specbench's model-free drafters as vLLM proposers (``speculative_config`` method ``custom_class``).

vLLM (v1 engine) builds the class named in the speculative config with ``cls(vllm_config)`` and calls, after
every verification step, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)``:

- ``sampled_token_ids``: one list per request in the persistent batch (the accepted drafts and the bonus
  token of this step; empty for a request still in a partial prefill);
- ``num_tokens_no_spec``: numpy (max_num_reqs,), each request's committed length (prompt + output);
- ``token_ids_cpu``: numpy (max_num_reqs, max_model_len), row ``i`` holds request ``i``'s committed tokens
  in ``[:num_tokens_no_spec[i]]``;

and it expects one draft list per request (``[]``: no drafts). The proposer never sees request ids, and
vLLM moves requests between rows (finished requests leave holes that later rows fill, rows are reordered),
so :class:`DrafterProposer` recognises a request by its tokens: a row continues a request it knows when
that request's tokens are a prefix of the row. Known requests keep their drafter row (their history is
only extended: no rescans), unknown ones get a new row fed their prompt then their output, and requests
that left the batch leave the drafter (``select_rows``). Proposals are capped at
``num_speculative_tokens`` and at ``max_model_len``, like vLLM's own n-gram proposer.

The drafter is driven through its :class:`~specbench.decoding.protocol.Drafter` interface (``commit`` /
``propose`` / ``select_rows``) on a :class:`~specbench.decoding.drafting.BatchState` of the live requests,
so vLLM gets the drafts specbench's engine would propose for the same contexts. New rows are added with
the per-row token-history API the lookup drafters share (``drafter.histories``, a
:class:`~specbench.drafters.token_history.RowHistories`): the interface has no "add rows" step.

Classes to name in ``speculative_config`` (parameters from vLLM's own fields, then the JSON object in the
``SPECBENCH_DRAFTER_KWARGS`` environment variable, which wins):

- :class:`PromptLookupProposer`: HF prompt lookup (``prompt_lookup_max`` = n-gram size, default 2);
- :class:`SpecBenchPLDProposer`: Spec-Bench's PLD (n-grams up to 3, its match rule);
- :class:`NgramProposer`: vLLM's ``ngram`` rule as specbench implements it (``prompt_lookup_min/max``);
- :class:`SuffixProposer`: SuffixDecoding (``suffix_decoding_*`` fields), one global tree per process.

vLLM is not installed where specbench's tests run: tests call ``propose`` with the numpy arrays vLLM
passes, from a scheduler that moves rows as vLLM's does (tests/test_serving.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.protocol import Drafter, VerifierView
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping
from specbench.drafters.token_history import RowHistories

KWARGS_ENV = "SPECBENCH_DRAFTER_KWARGS"
_PAD = 0  # padding of the BatchState; never a draft (proposals carry their lengths)


class _Request:
    """What the proposer knows of one request: the tokens its drafter row holds."""

    __slots__ = ("length", "tokens")

    def __init__(self) -> None:
        self.tokens = np.zeros(0, dtype=np.int64)
        self.length = 0

    def continued_by(self, row: np.ndarray, length: int) -> bool:
        """Whether a row of ``length`` tokens starts with every token this request holds."""
        return length >= self.length and np.array_equal(row[: self.length], self.tokens[: self.length])

    def extend(self, row: np.ndarray, length: int) -> None:
        if length > self.tokens.shape[0]:
            grown = np.zeros(max(length, 2 * self.tokens.shape[0], 64), dtype=np.int64)
            grown[: self.length] = self.tokens[: self.length]
            self.tokens = grown
        self.tokens[self.length: length] = row[self.length: length]
        self.length = length


def _eos_ids(model_config: Any) -> tuple[int, ...]:
    """The EOS ids vLLM's model config names (hf_config, generation config), for the drafters' EOS cut."""
    ids: set[int] = set()
    sources = [getattr(getattr(model_config, "hf_config", None), "eos_token_id", None)]
    getter = getattr(model_config, "try_get_generation_config", None)
    if callable(getter):
        try:
            sources.append((getter() or {}).get("eos_token_id"))
        except (OSError, ValueError, AttributeError):  # no generation config: hf_config's EOS is enough
            sources.append(None)
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return tuple(sorted(ids))


def _env_kwargs() -> dict[str, Any]:
    text = os.environ.get(KWARGS_ENV, "").strip()
    if not text:
        return {}
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{KWARGS_ENV} must be a JSON object of drafter arguments, got {text!r} ({err.msg})"
        ) from err
    if not isinstance(kwargs, dict):
        raise TypeError(f"{KWARGS_ENV} must be a JSON object of drafter arguments, got {text!r}")
    return kwargs


def check_model_free(drafter: Drafter) -> None:
    """Raise ValueError / TypeError unless ``drafter`` can run inside vLLM's proposer hook: deterministic,
    reading no verifier output (vLLM hands a custom proposer tokens only), with per-row token histories."""
    name = getattr(drafter, "name", type(drafter).__name__)
    if not isinstance(drafter, Drafter):
        raise TypeError(f"{type(drafter).__name__} is not a specbench Drafter")
    if not drafter.deterministic or drafter.needs.any:
        raise ValueError(
            f"drafter {name!r} needs the verifier's hidden states or its own distribution; vLLM's "
            "custom_class "
            "hook passes token ids only: serve a model drafter with vLLM's draft_model / eagle3 methods"
        )
    if not isinstance(getattr(drafter, "histories", None), RowHistories):
        raise TypeError(
            f"drafter {name!r} keeps no per-row token histories (drafter.histories): it cannot be exported"
        )


class DrafterProposer:
    """A vLLM ``custom_class`` proposer around a specbench model-free drafter (see the module doc).

    Subclasses implement :meth:`build_drafter`; ``drafter`` (tests, scripts) uses a ready one instead.
    """

    def __init__(self, vllm_config: Any, drafter: Drafter | None = None):
        spec = getattr(vllm_config, "speculative_config", None)
        if spec is None or not getattr(spec, "num_speculative_tokens", None):
            raise ValueError(
                f"{type(self).__name__} is a vLLM speculative proposer: pass speculative_config with "
                "num_speculative_tokens (and method='custom_class')"
            )
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.eos_token_ids = _eos_ids(vllm_config.model_config)
        self.drafter = drafter if drafter is not None else self.build_drafter(spec, **_env_kwargs())
        check_model_free(self.drafter)
        schedule = DraftSchedule(
            gamma=self.num_speculative_tokens, max_gamma=max(self.num_speculative_tokens, 32)
        )
        self._sampler = DraftSampler(Warping(), torch.Generator(), schedule)  # drafts are deterministic
        self._requests: list[_Request] = []  # in drafter row order
        self._rows: list[int] = []  # the vLLM row of each request at the last call
        self.drafter.reset(0)

    def build_drafter(self, spec: Any, **kwargs: Any) -> Drafter:
        raise NotImplementedError(f"{type(self).__name__} must build its drafter")

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM calls this after loading the target; a model-free drafter has nothing to load."""

    # -- vLLM's hook --------------------------------------------------------------------------------------

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Drafts for every request of the batch (``[]`` where none): see the module docstring."""
        num_reqs = len(sampled_token_ids)
        lengths = np.asarray(num_tokens_no_spec)[:num_reqs].astype(np.int64)
        tokens = (
            token_ids_cpu.numpy() if isinstance(token_ids_cpu, torch.Tensor) else np.asarray(token_ids_cpu)
        )
        owner = self._match(num_reqs, lengths, tokens)  # vLLM row -> request index (after drops)
        fresh = [
            row for row in range(num_reqs)
            if row not in owner and len(sampled_token_ids[row]) and lengths[row] > 0
        ]  # fmt: skip
        if fresh:
            self._add(fresh, owner, sampled_token_ids, lengths, tokens)
        drafts = [[] for _ in range(num_reqs)]
        if not self._requests:
            return drafts
        order = self._rows
        state = self._state([tokens[row, : lengths[row]] for row in order])
        accepted = torch.tensor([max(len(sampled_token_ids[row]) - 1, 0) for row in order])
        self.drafter.commit(state, _view(state), accepted)
        caps = torch.tensor([
            min(self.num_speculative_tokens, self.max_model_len - int(lengths[row]))
            if len(sampled_token_ids[row]) and lengths[row] < self.max_model_len else 0
            for row in order
        ])  # fmt: skip
        proposal = self.drafter.propose(state, caps, self._sampler)
        counts, ids = proposal.lengths.tolist(), proposal.tokens.tolist()
        for index, row in enumerate(order):
            drafts[row] = ids[index][: counts[index]]
            self._requests[index].extend(tokens[row], int(lengths[row]))
        return drafts

    # -- requests <-> rows ----------------------------------------------------------------------------------

    def _match(self, num_reqs: int, lengths: np.ndarray, tokens: np.ndarray) -> dict[int, int]:
        """Find every known request's row (the same row as last time first, else any row it is a prefix of),
        drop the requests that left, and return {vLLM row: request index}; ``_rows`` becomes the rows now."""
        owner: dict[int, int] = {}
        unplaced = []
        for index, row in enumerate(self._rows):
            if (
                row < num_reqs
                and row not in owner
                and self._requests[index].continued_by(tokens[row], lengths[row])
            ):
                owner[row] = index
            else:
                unplaced.append(index)
        for index in unplaced:
            request = self._requests[index]
            for row in range(num_reqs):
                if row not in owner and lengths[row] > 0 and request.continued_by(tokens[row], lengths[row]):
                    owner[row] = index
                    break
        kept = sorted(owner.values())
        if len(kept) < len(self._requests):
            self.drafter.select_rows(torch.tensor(kept, dtype=torch.long))
            renumber = {old: new for new, old in enumerate(kept)}
            self._requests = [self._requests[i] for i in kept]
            owner = {row: renumber[index] for row, index in owner.items()}
        self._rows = sorted(owner, key=owner.__getitem__)
        return owner

    def _add(
        self, rows: list[int], owner: dict[int, int], sampled, lengths: np.ndarray, tokens: np.ndarray
    ) -> None:
        """New drafter rows for requests first seen in ``rows``: fed the prompt (the row without this step's
        tokens), then, by the caller's commit, the rest."""
        held = list(self.drafter.histories.rows)
        self.drafter.reset(len(held) + len(rows))  # fresh rows for the new requests ...
        self.drafter.histories.rows[: len(held)] = held  # ... the known ones keep theirs
        for row in rows:
            owner[row] = len(self._requests)
            self._requests.append(_Request())
            self._rows.append(row)
        contexts = []
        for index, row in enumerate(self._rows):
            length = int(lengths[row])
            if index >= len(held):
                length = max(length - len(sampled[row]), 1)
            contexts.append(tokens[row, :length])
        state = self._state(contexts)
        self.drafter.commit(state, _view(state), torch.zeros(len(contexts), dtype=torch.long))

    def _state(self, contexts: list[np.ndarray]) -> BatchState:
        """The committed tokens of the live requests, right-aligned, as the engine keeps them."""
        width = max(len(c) for c in contexts)
        ids = np.full((len(contexts), width), _PAD, dtype=np.int64)
        valid = np.zeros((len(contexts), width), dtype=bool)
        for row, context in enumerate(contexts):
            ids[row, width - len(context):] = context
            valid[row, width - len(context):] = True
        batch = len(contexts)
        return BatchState(
            torch.from_numpy(ids), torch.from_numpy(valid),
            torch.full((batch,), self.num_speculative_tokens, dtype=torch.long),
            torch.zeros(batch, dtype=torch.long), self.max_model_len,
            torch.tensor(self.eos_token_ids, dtype=torch.long), _PAD,
        )  # fmt: skip


def _view(state: BatchState) -> VerifierView:
    """The last committed column: model-free drafters read no verifier output, the argument is formal."""
    return VerifierView(state.tokens[:, -1:], state.token_valid[:, -1:])


def _pick(kwargs: dict[str, Any], **defaults: Any) -> dict[str, Any]:
    """``defaults`` (vLLM's fields, None left out) overridden by ``kwargs`` (the environment's)."""
    return {**{k: v for k, v in defaults.items() if v is not None}, **kwargs}


class PromptLookupProposer(DrafterProposer):
    """HF prompt lookup: ``prompt_lookup_max`` is ``max_matching_ngram_size`` (default 2)."""

    def build_drafter(self, spec: Any, **kwargs: Any) -> Drafter:
        from specbench.drafters.prompt_lookup import PromptLookupDrafter

        return PromptLookupDrafter(**_pick(
            kwargs, max_matching_ngram_size=getattr(spec, "prompt_lookup_max", None) or 2,
            num_output_tokens=self.num_speculative_tokens,
        ))  # fmt: skip


class SpecBenchPLDProposer(DrafterProposer):
    """Spec-Bench's PLD baseline: n-grams up to 3, its leftmost full-continuation match rule."""

    def build_drafter(self, spec: Any, **kwargs: Any) -> Drafter:
        from specbench.drafters.prompt_lookup import PromptLookupDrafter

        return PromptLookupDrafter(**_pick(
            kwargs, max_matching_ngram_size=3, num_output_tokens=self.num_speculative_tokens,
            match_rule="spec-bench",
        ))  # fmt: skip


class NgramProposer(DrafterProposer):
    """vLLM's n-gram rule (longest suffix match in [prompt_lookup_min, prompt_lookup_max]) as specbench has
    it."""

    def build_drafter(self, spec: Any, **kwargs: Any) -> Drafter:
        from specbench.drafters.ngram import NgramDrafter

        return NgramDrafter(**_pick(
            kwargs, prompt_lookup_min=getattr(spec, "prompt_lookup_min", None),
            prompt_lookup_max=getattr(spec, "prompt_lookup_max", None),
            num_speculative_tokens=self.num_speculative_tokens,
        ))  # fmt: skip


class SuffixProposer(DrafterProposer):
    """SuffixDecoding with vLLM's ``suffix_decoding_*`` settings; the global tree spans this process's
    requests."""

    def build_drafter(self, spec: Any, **kwargs: Any) -> Drafter:
        from specbench.drafters.suffix import SuffixDrafter

        return SuffixDrafter(**_pick(
            kwargs,
            max_tree_depth=getattr(spec, "suffix_decoding_max_tree_depth", None),
            max_spec_factor=getattr(spec, "suffix_decoding_max_spec_factor", None),
            min_token_prob=getattr(spec, "suffix_decoding_min_token_prob", None),
            max_cached_requests=getattr(spec, "suffix_decoding_max_cached_requests", None),
            num_speculative_tokens=self.num_speculative_tokens,
        ))  # fmt: skip
