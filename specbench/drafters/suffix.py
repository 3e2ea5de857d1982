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
- ``python``: :class:`PySuffixTree` below, written for specbench. It reproduces ArcticInference's counts,
  float32 scoring and its order among children of equal count (which decides ties between candidates), so
  both backends propose the same tokens; a test checks this against the C++ tree wherever it is installed.

``backend="auto"`` takes ``arctic`` when it can be imported, else ``python``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.protocol import Drafter, Proposal, VerifierView
from specbench.drafters.token_history import RowHistories, proposal_from_lists
from specbench.models.checkpoints import resolve_project_path

BACKENDS = ("auto", "python", "arctic")
CACHE_FORMAT = "specbench.suffix-cache"

_FLOAT32 = struct.Struct("f")


def _f32(value: float) -> float:
    """``value`` rounded to float32, the precision ArcticInference scores drafts in."""
    return _FLOAT32.unpack(_FLOAT32.pack(value))[0]


@dataclass
class SuffixDraft:
    """A drafted chain: tokens, the estimated probability of each, their sum, and the match it came from."""

    token_ids: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


class SuffixTree(Protocol):
    """What the drafter needs from a suffix tree backend (ArcticInference's ``SuffixTree`` API)."""

    def extend(self, seq_id: int, tokens: list[int]) -> None: ...

    def remove(self, seq_id: int) -> None: ...

    def speculate(
        self,
        context: list[int],
        max_spec_tokens: int,
        max_spec_factor: float,
        max_spec_offset: float,
        min_token_prob: float,
        tail_of: int | None = None,
    ) -> SuffixDraft: ...


class _Node:
    """A substring of length ``depth`` (implicit: callers track it) and how often it occurs.

    A leaf (``children is None``) occurs once, at ``tokens[start:]`` of sequence ``seq``; its longer
    extensions are read from that sequence instead of being stored (they occur once too). Internal nodes
    keep their children in ArcticInference's order: non-increasing count, ``head`` first; ``groups`` maps a
    count to the first child with that count.
    """

    __slots__ = ("children", "count", "groups", "head", "next", "prev", "seq", "start", "tail", "token")

    def __init__(self, token: int, seq: int, start: int, children: dict | None = None):
        self.count = 1
        self.token = token
        self.children = children
        self.seq = seq
        self.start = start
        self.prev = self.next = self.head = self.tail = None
        self.groups = None


class _Sequence:
    """A sequence's tokens and, for each suffix still shorter than D, its node (None: inside a leaf)."""

    __slots__ = ("active", "tokens")

    def __init__(self):
        self.tokens: list[int] = []
        self.active: list[_Node | None] = []  # suffixes starting at len(tokens) - len(active) ... len - 1


class PySuffixTree:
    """A depth-limited suffix tree over several token sequences, in Python (same results as ArcticInference).

    Appending a token extends the at most D - 1 suffixes of its sequence that are still shorter than D:
    O(D) dictionary operations per token, whatever the length of the sequence.
    """

    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"suffix tree depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self._root = _Node(-1, -1, -1, children={})
        self._root.count = 0
        self._seqs: dict[int, _Sequence] = {}

    def num_seqs(self) -> int:
        return len(self._seqs)

    # -- building -------------------------------------------------------------------------------------

    def extend(self, seq_id: int, tokens: list[int]) -> None:
        seq = self._seqs.get(seq_id)
        if seq is None:
            seq = self._seqs[seq_id] = _Sequence()
        for token in tokens:
            self._append(seq, seq_id, int(token))

    def _append(self, seq: _Sequence, seq_id: int, token: int) -> None:
        root = self._root
        tokens, active = seq.tokens, seq.active
        tokens.append(token)
        root.count += 1
        active.append(root)  # the new one-token suffix starts at the root
        end = len(tokens)
        first = end - len(active)
        # Longest suffixes first: a leaf split below may need to see a deeper suffix already extended.
        for i, node in enumerate(active):
            if node is None:
                continue
            children = node.children
            if children is None:
                active[i] = None  # this suffix is the leaf's only occurrence: it grows inside the leaf
                continue
            child = children.get(token)
            if child is None:
                child = children[token] = _Node(token, seq_id, first + i)
                if node is not root:
                    _append_child(node, child)
            else:
                if child.prev is None and child.next is None:
                    child.count += 1  # root children and only children: no order to keep
                else:
                    _increment(node, child)
                if child.children is None:
                    self._split(child, end - first - i)
            active[i] = child
        if len(active) >= self.max_depth:
            del active[0]  # that suffix reached depth D

    def _split(self, leaf: _Node, depth: int) -> None:
        """A leaf got its second occurrence: store its first occurrence's next token as its first child."""
        seq = self._seqs[leaf.seq]
        tokens = seq.tokens
        leaf.children = {}
        follow = leaf.start + depth
        target, target_depth = leaf, depth
        if depth < self.max_depth and follow < len(tokens):
            child = _Node(tokens[follow], leaf.seq, leaf.start)
            leaf.children[child.token] = child
            _append_child(leaf, child)
            target, target_depth = child, depth + 1
        # If that first occurrence is a suffix still growing, it now ends at a stored node.
        i = leaf.start - (len(tokens) - len(seq.active))
        if 0 <= i < len(seq.active) and len(tokens) - leaf.start == target_depth:
            seq.active[i] = target

    def remove(self, seq_id: int) -> None:
        """Forget a sequence: every count it contributed goes, nodes nobody else occurs in go with it."""
        seq = self._seqs.pop(seq_id)
        tokens, root, depth_limit = seq.tokens, self._root, self.max_depth
        for start in range(len(tokens)):
            root.count -= 1
            node, depth = root, 0
            while start + depth < len(tokens) and depth < depth_limit and node.children is not None:
                child = node.children[tokens[start + depth]]
                if child.count == 1:
                    _remove_child(node, child)
                    break
                if child.prev is None and child.next is None:
                    child.count -= 1
                else:
                    _decrement(node, child)
                node, depth = child, depth + 1

    # -- drafting -------------------------------------------------------------------------------------

    def speculate(
        self,
        context: list[int],
        max_spec_tokens: int,
        max_spec_factor: float,
        max_spec_offset: float,
        min_token_prob: float,
        tail_of: int | None = None,
    ) -> SuffixDraft:
        """The best chain over match lengths 1 .. len(context) - 1 (ArcticInference's ``speculate``).

        ``tail_of``: a sequence of this tree that ``context`` ends like (its last tokens are the context's):
        the matches it covers are read from that sequence's suffixes instead of walked from the root.
        """
        factor, offset, min_prob = _f32(max_spec_factor), _f32(max_spec_offset), _f32(min_token_prob)
        best = SuffixDraft()
        size = len(context)
        seq = self._seqs.get(tail_of) if tail_of is not None else None
        covered = min(size - 1, len(seq.tokens)) if seq is not None else 0
        for match_len in range(1, size):
            if match_len <= covered:
                node = seq.active[len(seq.active) - match_len]
                if node is None:
                    # Inside a leaf: this suffix, and every longer one the sequence covers, occurs only here,
                    # at the end, with nothing after it; longer ones reaching past the sequence occur nowhere.
                    if best.score <= 0.0:
                        best = SuffixDraft(match_len=covered)
                    break
                found = (node, match_len, 0)
            else:
                found = self._match(context, size - match_len)
                if found is None:
                    break
            limit = min(max_spec_tokens, int(_f32(_f32(match_len * factor) + offset) + 1e-6))
            draft = self._draft(*found, max(limit, 0), min_prob)
            if draft.score >= best.score:
                best = draft
                best.match_len = match_len
        return best

    def _match(self, context: list[int], begin: int) -> tuple[_Node, int, int] | None:
        """Where ``context[begin:]`` ends: (node, its depth, tokens matched past it inside a leaf)."""
        node, depth, inside = self._root, 0, 0
        for k in range(begin, len(context)):
            token = context[k]
            children = node.children
            if children is None:
                tokens = self._seqs[node.seq].tokens
                at = node.start + depth + inside
                if depth + inside >= self.max_depth or at >= len(tokens) or tokens[at] != token:
                    return None
                inside += 1
            else:
                node = children.get(token)
                if node is None:
                    return None
                depth += 1
        return node, depth, inside

    def _draft(self, node: _Node, depth: int, inside: int, max_tokens: int, min_prob: float) -> SuffixDraft:
        draft = SuffixDraft()
        out, probs = draft.token_ids, draft.probs
        prob, score, whole = 1.0, 0.0, True  # whole: every prob so far was 1, the score is an exact integer
        depth_limit = self.max_depth
        while len(out) < max_tokens and prob >= min_prob:
            if node.children is None:
                # Inside a leaf: the rest of its one occurrence, all with the current probability.
                tokens = self._seqs[node.seq].tokens
                at = node.start + depth + inside
                run = min(max_tokens - len(out), depth_limit - depth - inside, len(tokens) - at)
                if run <= 0:
                    break
                out.extend(tokens[at : at + run])
                inside += run
                for _ in range(run):
                    probs.append(prob)
                    score = score + 1.0 if whole else _f32(score + prob)
                continue
            child = node.head
            if child is None:
                break
            if child.count != node.count:
                prob = _f32(prob * _f32(child.count / node.count))
                whole = False
                if prob < min_prob:
                    break
            node, depth = child, depth + 1
            out.append(child.token)
            probs.append(prob)
            score = score + 1.0 if whole else _f32(score + prob)
        draft.score = score
        return draft


# -- children order (ArcticInference's sibling list: non-increasing count, ties in its move order) ---------


def _append_child(parent: _Node, child: _Node) -> None:
    tail = parent.tail
    if tail is None:
        parent.head = parent.tail = child
        return
    if tail is parent.head:  # an only child's count changes without bookkeeping: its group starts now
        parent.groups = {tail.count: tail}
    tail.next, child.prev, parent.tail = child, tail, child
    if tail.count != child.count:
        parent.groups[child.count] = child


def _unlink(parent: _Node, node: _Node) -> None:
    before, after = node.prev, node.next
    if before is None:
        parent.head = after
    else:
        before.next = after
    if after is None:
        parent.tail = before
    else:
        after.prev = before
    node.prev = node.next = None


def _link_before(parent: _Node, node: _Node, other: _Node) -> None:
    before = other.prev
    node.prev, node.next, other.prev = before, other, node
    if before is None:
        parent.head = node
    else:
        before.next = node


def _leave_group(groups: dict[int, _Node], node: _Node) -> None:
    """``node`` stops being the first child of its count: the next one with that count takes over."""
    if groups.get(node.count) is node:
        after = node.next
        if after is not None and after.count == node.count:
            groups[node.count] = after
        else:
            del groups[node.count]


def _increment(parent: _Node, node: _Node) -> None:
    count, before, groups = node.count, node.prev, parent.groups
    if before is None or before.count > count + 1:
        _leave_group(groups, node)
        node.count = count + 1
        groups[count + 1] = node
        return
    # Moves in front of the first child with the predecessor's count (count or count + 1).
    other = groups[before.count]
    _leave_group(groups, node)
    _unlink(parent, node)
    node.count = count + 1
    _link_before(parent, node, other)
    if node.prev is None or node.prev.count != count + 1:
        groups[count + 1] = node


def _decrement(parent: _Node, node: _Node) -> None:
    count, after, groups = node.count, node.next, parent.groups
    if after is None or after.count < count:
        _leave_group(groups, node)
        node.count = count - 1
        groups[count - 1] = node
        return
    # Moves behind the last child of its count, as the first child with count - 1.
    behind = after
    while behind is not None and behind.count == count:
        behind = behind.next
    _leave_group(groups, node)
    _unlink(parent, node)
    node.count = count - 1
    if behind is None:
        last = parent.tail
        last.next, node.prev, parent.tail = node, last, node
    else:
        _link_before(parent, node, behind)
    groups[count - 1] = node


def _remove_child(parent: _Node, child: _Node) -> None:
    if child.prev is None and child.next is None:
        parent.head = parent.tail = None
    else:
        _leave_group(parent.groups, child)
        _unlink(parent, child)
    del parent.children[child.token]


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
