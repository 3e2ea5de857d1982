"""A suffix tree in Python that counts every substring of its sequences up to a depth and drafts from them
the way ArcticInference's C++ ``SuffixTree`` does (the same counts, float32 scores and order among
children of equal count), for :class:`~specbench.drafters.suffix.SuffixDrafter`."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Protocol

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
