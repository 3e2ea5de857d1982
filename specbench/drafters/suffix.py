"""SuffixDecoding (arXiv 2411.04975), as vLLM's ``suffix`` method runs it through ArcticInference.

Two kinds of suffix trees of depth ``max_tree_depth`` (D) count every substring of length <= D:

- one per row over its prompt + output (the *local* tree);
- one *global* tree over the outputs of the run (rows still decoding included, as in vLLM), holding at most
  ``max_cached_requests`` outputs (oldest evicted first; 0 disables it, -1 means no limit); it can be saved
  to a file and loaded again in a later run.

Each round, for every match length m = 1 .. min(len(context), D) - 1 of the context's last m tokens, a chain
is drafted greedily from the matched node: always the child with the largest count, each token's
probability estimated as count(match + drafted prefix) / count(match), stopping before a token whose
probability falls below ``min_token_prob``, after ``min(cap, floor(max_spec_factor * m + max_spec_offset))``
tokens, or at depth D. A draft's score is the sum of its probabilities; the highest score over m wins
(ties: the longer match), then the local tree's draft against the global one's (ties: local). Only chains
(the best path) are proposed, never trees. Defaults are vLLM's.

Two interchangeable tree backends give the same drafts:

- ``arctic``: ArcticInference's C++ ``SuffixTree`` (``arctic-inference`` on PyPI, an sdist that needs a
  local build, see docs/drafters-model-free.md);
- ``python``: :class:`~specbench.drafters.suffix_tree.PySuffixTree`, written for specbench. It reproduces
  ArcticInference's counts, float32 scoring and its order among children of equal count (which decides
  ties between candidates), so both backends propose the same tokens; a test checks this against the C++
  tree wherever it is installed.

``backend="auto"`` takes ``arctic`` when it can be imported, else ``python``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.protocol import Drafter, Proposal, VerifierView
from specbench.drafters.suffix_tree import PySuffixTree, SuffixDraft, SuffixTree
from specbench.drafters.token_history import RowHistories, proposal_from_lists
from specbench.models.checkpoints import resolve_project_path

BACKENDS = ("auto", "python", "arctic")
CACHE_FORMAT = "specbench.suffix-cache"


# -- backends -------------------------------------------------------------------------------------------


class ArcticSuffixTree:
    """ArcticInference's C++ suffix tree behind the :class:`SuffixTree` protocol."""

    def __init__(self, max_depth: int):
        from arctic_inference.suffix_decoding._C import SuffixTree as NativeTree

        self.max_depth = max_depth
        self._tree = NativeTree(max_depth)

    def extend(self, seq_id: int, tokens: list[int]) -> None:
        self._tree.extend(seq_id, tokens)

    def remove(self, seq_id: int) -> None:
        self._tree.remove(seq_id)

    def num_seqs(self) -> int:
        return self._tree.num_seqs()

    def speculate(
        self,
        context: list[int],
        max_spec_tokens: int,
        max_spec_factor: float,
        max_spec_offset: float,
        min_token_prob: float,
        tail_of: int | None = None,
    ) -> SuffixDraft:
        draft = self._tree.speculate(
            context, max_spec_tokens, max_spec_factor, max_spec_offset, min_token_prob, False
        )
        return SuffixDraft(list(draft.token_ids), list(draft.probs), float(draft.score), int(draft.match_len))


def arctic_available() -> bool:
    try:
        import arctic_inference.suffix_decoding._C  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str) -> str:
    """``auto`` → ``arctic`` when ArcticInference's extension imports, else ``python``."""
    if backend not in BACKENDS:
        raise ValueError(f"suffix backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "arctic" if arctic_available() else "python"
    if backend == "arctic" and not arctic_available():
        raise ImportError(
            "suffix backend 'arctic' needs ArcticInference's suffix tree "
            "(arctic_inference.suffix_decoding._C); "
            "build it as docs/drafters-model-free.md describes, or use backend=python"
        )
    return backend


def new_tree(backend: str, max_depth: int) -> SuffixTree:
    return ArcticSuffixTree(max_depth) if resolve_backend(backend) == "arctic" else PySuffixTree(max_depth)


# -- the drafter ----------------------------------------------------------------------------------------


class _SuffixRow:
    """One row: its tokens, its local tree, and its output's slot in the global cache."""

    __slots__ = ("local", "owner", "seq_id", "tokens")

    def __init__(self, owner: SuffixDrafter):
        self.tokens: list[int] = []
        self.local = new_tree(owner.backend, owner.max_tree_depth)
        self.seq_id: int | None = None
        self.owner = owner

    def extend(self, new_tokens: list[int]) -> None:
        is_prompt = not self.tokens
        self.tokens.extend(new_tokens)
        self.local.extend(0, new_tokens)
        if is_prompt:
            self.seq_id = self.owner._start_response()
        else:
            self.owner._add_response(self.seq_id, new_tokens)


def write_cache(path: str | Path, responses, max_tree_depth: int, source: dict | None = None) -> Path:
    """Write token-id ``responses`` (oldest first; empty ones dropped) as a suffix cache file that
    ``SuffixDrafter(cache_file=...)`` loads into its global tree. ``source``: where they came from (kept
    in the file for the reader; token ids only mean something for the tokenizer that produced them)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": CACHE_FORMAT,
        "version": 1,
        "max_tree_depth": max_tree_depth,
        **({"source": source} if source else {}),
        "responses": [list(r) for r in responses if r],
    }
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(payload))
    partial.replace(target)  # a crash mid-write leaves the previous cache whole
    return target


class SuffixDrafter(Drafter):
    """SuffixDecoding over each row's prompt + output and the run's earlier outputs (vLLM's defaults)."""

    deterministic = True
    name = "suffix"

    def __init__(
        self,
        max_tree_depth: int = 24,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        max_cached_requests: int = 10000,
        num_speculative_tokens: int | None = None,
        cache_file: str | None = None,
        backend: str = "auto",
        update_cache_file: bool = True,
    ):
        if max_tree_depth < 1:
            raise ValueError(f"suffix max_tree_depth must be >= 1, got {max_tree_depth}")
        if max_spec_factor < 0 or not 0.0 <= min_token_prob <= 1.0:
            raise ValueError(
                f"suffix needs max_spec_factor >= 0 and 0 <= min_token_prob <= 1, got {max_spec_factor} and "
                f"{min_token_prob}"
            )
        if max_cached_requests < -1:
            raise ValueError(
                f"suffix max_cached_requests must be >= -1 (-1: no limit), got {max_cached_requests}"
            )
        if num_speculative_tokens is not None and num_speculative_tokens < 1:
            raise ValueError(
                "suffix num_speculative_tokens must be >= 1 (or null: the tree depth), "
                f"got {num_speculative_tokens}"
            )
        self.max_tree_depth = max_tree_depth
        self.max_spec_factor = max_spec_factor
        self.max_spec_offset = max_spec_offset
        self.min_token_prob = min_token_prob
        self.max_cached_requests = max_cached_requests
        self.num_speculative_tokens = num_speculative_tokens or max_tree_depth  # vLLM's fallback: the depth
        self.backend = resolve_backend(backend)
        if cache_file is not None and not update_cache_file:
            cache_file = resolve_project_path(cache_file)  # a committed seed loads from any directory
            if not Path(cache_file).is_file():
                raise ValueError(
                    f"suffix cache_file {cache_file!r} does not exist; a read-only cache (update_cache_file="
                    "false) must: write it with python -m specbench.drafters.suffix_seed SYNTH_DIR --out FILE"
                )
        self.cache_file = cache_file
        self.update_cache_file = update_cache_file
        self.cache_source: dict | None = None  # the loaded file's 'source', written back with it
        self._global = new_tree(self.backend, max_tree_depth) if max_cached_requests != 0 else None
        self._responses: dict[int, list[int]] = {}  # global cache contents, oldest first
        self._next_seq_id = 0
        self.histories: RowHistories[_SuffixRow] = RowHistories(lambda: _SuffixRow(self))
        self.last_drafts: list[SuffixDraft] = []
        self.seeded_responses = 0  # how many outputs cache_file held when the drafter was built
        if cache_file is not None and Path(cache_file).exists():
            self.seeded_responses = self.load_cache(cache_file)

    # -- global cache ----------------------------------------------------------------------------------

    def _start_response(self) -> int | None:
        if self._global is None:
            return None
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        self._responses[seq_id] = []
        while 0 <= self.max_cached_requests < len(self._responses):
            oldest = next(iter(self._responses))
            del self._responses[oldest]
            self._global.remove(oldest)
        return seq_id

    def _add_response(self, seq_id: int | None, tokens: list[int]) -> None:
        response = self._responses.get(seq_id) if seq_id is not None else None
        if response is None:  # no global cache, or this response was evicted already
            return
        response.extend(tokens)
        self._global.extend(seq_id, tokens)

    @property
    def cached_responses(self) -> list[list[int]]:
        """The outputs the global tree holds, oldest first (rows still decoding included)."""
        return [list(r) for r in self._responses.values()]

    def memory_state(self) -> object:
        return {seq_id: list(tokens) for seq_id, tokens in self._responses.items()}, self._next_seq_id

    def restore_memory(self, state: object) -> None:
        responses, next_seq_id = state
        if self._global is not None:
            if any(seq_id not in self._responses for seq_id in responses):  # evicted since: rebuild
                self._global = new_tree(self.backend, self.max_tree_depth)
                for seq_id, tokens in responses.items():
                    self._global.extend(seq_id, tokens)
            else:
                for seq_id in [s for s in self._responses if s not in responses]:
                    self._global.remove(seq_id)
        self._responses = {seq_id: list(tokens) for seq_id, tokens in responses.items()}
        self._next_seq_id = next_seq_id

    def save_memory(self) -> Path | None:
        """The global tree written to ``cache_file`` unless there is none or it is read-only."""
        return self.save_cache() if self.cache_file and self.update_cache_file else None

    def save_cache(self, path: str | Path | None = None) -> Path:
        """Write the global cache's outputs to a JSON file (``cache_file`` by default)."""
        if not (path or self.cache_file):
            raise ValueError("save_cache needs a path (or the drafter's cache_file)")
        return write_cache(
            path or self.cache_file, self._responses.values(), self.max_tree_depth, self.cache_source
        )

    def load_cache(self, path: str | Path) -> int:
        """Add the outputs saved in ``path`` to the global cache (oldest first); returns how many."""
        if self._global is None:
            raise ValueError(
                "this suffix drafter has no global cache (max_cached_requests=0): nothing to load into"
            )
        try:
            payload = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: unreadable suffix cache ({err}); delete it or write it again") from err
        if not isinstance(payload, dict) or payload.get("format") != CACHE_FORMAT:
            found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
            raise ValueError(f"{path} is not a specbench suffix cache (format {found!r})")
        self.cache_source = payload.get("source") or self.cache_source
        responses = payload.get("responses")
        if not isinstance(responses, list) or not all(isinstance(r, list) for r in responses):
            raise ValueError(f"{path}: a suffix cache needs 'responses', a list of token-id lists")
        for response in responses:
            seq_id = self._start_response()
            self._add_response(seq_id, [int(t) for t in response])
        return len(payload["responses"])

    # -- the drafter interface ---------------------------------------------------------------------------

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
        self.last_drafts = [
            self.speculate(row, min(cap, self.num_speculative_tokens))
            for row, cap in zip(self.histories.rows, caps.tolist())
        ]
        return proposal_from_lists(
            [d.token_ids for d in self.last_drafts],
            state,
            keep_eos=True,
            match_lengths=[d.match_len for d in self.last_drafts],
        )

    def speculate(self, row: _SuffixRow, max_tokens: int) -> SuffixDraft:
        """The best chain for one row from its local tree and the global tree (ties: local)."""
        if max_tokens <= 0:
            return SuffixDraft()
        context = row.tokens[-self.max_tree_depth :]
        args = (max_tokens, self.max_spec_factor, self.max_spec_offset, self.min_token_prob)
        best = row.local.speculate(context, *args, tail_of=0)
        if self._global is not None:
            other = self._global.speculate(
                context, *args, tail_of=row.seq_id if row.seq_id in self._responses else None
            )
            if other.score > best.score:
                best = other
        return best

    def describe(self) -> dict:
        return {
            "drafter": self.name,
            "max_tree_depth": self.max_tree_depth,
            "max_spec_factor": self.max_spec_factor,
            "max_spec_offset": self.max_spec_offset,
            "min_token_prob": self.min_token_prob,
            "max_cached_requests": self.max_cached_requests,
            "num_speculative_tokens": self.num_speculative_tokens,
            "backend": self.backend,
            "cache_file": self.cache_file,
            "seeded_responses": self.seeded_responses,
        }
