"""Tree drafts: several candidate continuations verified in one verifier forward (methods.md §2.7).

A tree proposal is a :class:`~specbench.decoding.protocol.Proposal` with ``parents``: ``parents[b, j]`` is the
verifier-input column of draft ``j``'s parent, where column 0 is the row's last committed token and draft
``j`` sits in column ``j + 1``; a parent always comes before its child (``parents[b, j] <= j``), and
``-1`` marks a padding node. A chain is the tree with ``parents[b, j] = j``.

The verifier runs once over ``[last token, drafts]`` with a mask under which every node attends to the
cache, its ancestors and itself, at position ``cached + depth``; its logits at a node are then what a chain
ending in that node would give. Verification walks down from the root (:func:`verify_tree`):

- greedy: go to the child whose token is the verifier's argmax, stop where there is none;
- sampling: try the children in order; child ``c`` is accepted with probability ``r(c)`` where ``r`` is
  the verifier's distribution with the children tried before removed and renormalised, and if none is
  accepted the correction is drawn from what remains of ``r``. Each step draws exactly from the
  verifier's distribution (the children are fixed before the verifier's randomness is used), so the
  rule is lossless for any choice of children; it is the ``sd`` rule with one-hot drafts, tried in turn.
  A first child drawn from the drafter's q gets the standard ``min(1, p/q)`` test instead, and the others
  are tried against its residual ``norm(max(p − q, 0))``.

Only the exact ``sd`` rule verifies trees: the other rules' math is defined for one draft per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.decoding.warping import sample

NO_PARENT = -1


def check_parents(parents: torch.Tensor, tokens: torch.Tensor | None = None) -> None:
    """Refuse a parents tensor that is not a tree in topological order (or not one parent per draft)."""
    if tokens is not None and parents.shape != tokens.shape:
        raise ValueError(f"tree drafts need one parent per draft: parents {tuple(parents.shape)}, drafts "
                         f"{tuple(tokens.shape)}")  # fmt: skip
    width = parents.shape[1]
    own = torch.arange(1, width + 1, device=parents.device).unsqueeze(0)
    if bool(((parents >= own) | (parents < NO_PARENT)).any()):
        raise ValueError(
            "tree drafts need parents[b, j] in [0, j] (the parent's verifier column, before the node) "
            f"or -1 for padding; got {parents.tolist()}"
        )


def tree_structure(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For the verifier input ``[last token, drafts]`` (W = G + 1 columns): ``ancestors`` (B, W, W) bool,
    ``ancestors[b, i, j]`` when column ``j`` is column ``i`` or one of its ancestors, and ``depth`` (B, W)
    (0 for the root). A padding node sees the root and itself, at depth 0 (it is never attended to)."""
    batch, width = parents.shape[0], parents.shape[1] + 1
    eye = torch.eye(width, dtype=torch.bool, device=parents.device)
    ancestors = eye.unsqueeze(0).repeat(batch, 1, 1)
    depth = torch.zeros(batch, width, dtype=torch.long, device=parents.device)
    rows = torch.arange(batch, device=parents.device)
    for column in range(1, width):
        parent = parents[:, column - 1]
        real = parent >= 0
        safe = parent.clamp(min=0)
        inherited = torch.where(real.unsqueeze(1), ancestors[rows, safe], eye[0].unsqueeze(0))
        ancestors[:, column] = inherited | eye[column]
        depth[:, column] = torch.where(real, depth[rows, safe] + 1, torch.zeros_like(safe))
    return ancestors, depth


def top_leaves(logits: torch.Tensor, drafted: torch.Tensor, drafting: torch.Tensor, count: int):
    """The ``count`` most likely tokens under ``logits`` (B, V) other than the ``drafted`` one (B,), and which
    of them are real: finite logits (a reduced draft vocabulary gives the rest −inf) in a ``drafting`` row."""
    top = logits.topk(count + 1, dim=-1)
    not_drafted = top.indices != drafted.unsqueeze(1)
    order = torch.sort((~not_drafted).long(), dim=1, stable=True).indices[:, :count]
    ids = torch.gather(top.indices, 1, order)
    real = torch.gather(torch.isfinite(top.values) & not_drafted, 1, order) & drafting.unsqueeze(1)
    return ids, real


def chain_with_leaves(chain, lengths, leaves, pad_id: int, forwards: int, q: torch.Tensor | None = None):
    """A tree :class:`~specbench.decoding.protocol.Proposal` from a drafted chain (B, D) of ``lengths`` (B,)
    and, per depth ``i``, its leaves ``(ids, real)`` (B, k) from :func:`top_leaves`. Columns: the chain (draft
    ``i`` under draft ``i − 1``), then each depth's leaves, siblings of chain draft ``i`` under the same
    parent (verifier column ``i``). ``q`` (B, D, V): the distributions the chain was drawn from; the leaves
    get zero rows (verified one-hot)."""
    from specbench.decoding.protocol import Proposal

    columns = torch.arange(chain.shape[1], device=chain.device).unsqueeze(0)
    in_chain = columns < lengths.unsqueeze(1)
    parents = [torch.where(in_chain, columns, torch.full_like(columns, NO_PARENT))]
    tokens = [chain]
    for depth, (ids, real) in enumerate(leaves):
        parents.append(torch.where(real, torch.full_like(ids, depth), torch.full_like(ids, NO_PARENT)))
        tokens.append(torch.where(real, ids, torch.full_like(ids, pad_id)))
    parents = torch.cat(parents, dim=1)
    if q is not None:
        q = torch.cat([q, q.new_zeros(q.shape[0], parents.shape[1] - q.shape[1], q.shape[2])], dim=1)
    return Proposal(
        tokens=torch.cat(tokens, dim=1),
        lengths=(parents >= 0).sum(dim=1),
        q=q,
        forwards=forwards,
        parents=parents,
    )


@dataclass
class TreeVerdict:
    accepted: torch.Tensor  # (B,) accepted drafts on the path
    next_token: torch.Tensor  # (B,) correction or bonus token after the path
    path: list[list[int]]  # per row: the verifier columns of the accepted drafts, root first (root excluded)

    def column_order(self, width: int, device: torch.device) -> torch.Tensor:
        """(B, width) a permutation of the verifier columns: the root, the path, then every other column
        in its order. Gathering a round's columns with it makes a tree round look like a chain round."""
        orders = []
        for path in self.path:
            on_path = [0, *path]
            rest = [c for c in range(width) if c not in set(on_path)]
            orders.append(on_path + rest)
        return torch.tensor(orders, dtype=torch.long, device=device)


def verify_tree(
    p: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None = None,
    q: torch.Tensor | None = None,
) -> TreeVerdict:
    """Walk each row's tree from the root. ``p`` (B, G+1, V): the verifier's (warped) distribution at each
    verifier column (column ``c`` predicts the token after node ``c``); ``tokens``/``parents`` (B, G).
    ``q`` (B, G, V), optional: a node whose row is a distribution (not all zeros) was sampled from it; when
    it is the first child tried at its parent it gets the standard test ``min(1, p/q)`` and the residual
    ``norm(max(p − q, 0))``, against which the later children are tried one-hot."""
    batch = p.shape[0]
    children = _children(parents)
    token_rows = tokens.tolist()
    accepted, next_tokens, paths = [], [], []
    for row in range(batch):
        node, path, token = 0, [], None
        while True:
            kids = children[row].get(node, [])
            if greedy:
                target = int(p[row, node].argmax())
                chosen = next((c for c in kids if token_rows[row][c - 1] == target), None)
                if chosen is None:
                    token = target
                    break
            else:
                sampled = None
                if q is not None and kids and bool(q[row, kids[0] - 1].sum() > 0):
                    sampled = q[row, kids[0] - 1]
                chosen, remaining = _try_children(p[row, node], kids, token_rows[row], generator, sampled)
                if chosen is None:
                    token = int(sample(remaining.unsqueeze(0), generator)[0])
                    break
            path.append(chosen)
            node = chosen
        accepted.append(len(path))
        next_tokens.append(token)
        paths.append(path)
    device = p.device
    return TreeVerdict(
        accepted=torch.tensor(accepted, dtype=torch.long, device=device),
        next_token=torch.tensor(next_tokens, dtype=torch.long, device=device),
        path=paths,
    )


def _children(parents: torch.Tensor) -> list[dict[int, list[int]]]:
    out = []
    for row in parents.tolist():
        kids: dict[int, list[int]] = {}
        for j, parent in enumerate(row):
            if parent >= 0:
                kids.setdefault(parent, []).append(j + 1)
        out.append(kids)
    return out


def _try_children(dist: torch.Tensor, kids: list[int], tokens: list[int], generator, sampled=None):
    """Sequential verification of the children at one node: (accepted column or None, what is left of the
    distribution to draw the correction from). ``sampled``: the q the first child was drawn from."""
    remaining = dist.double().clone()
    if sampled is not None:
        first, token = kids[0], tokens[kids[0] - 1]
        q = sampled.double()
        chance = min(1.0, float(remaining[token]) / max(float(q[token]), 1e-300))
        u = float(torch.rand((), generator=generator, device=dist.device, dtype=torch.float64))
        if u < chance:
            return first, remaining
        residual = (remaining - q).clamp(min=0.0)
        remaining = residual if float(residual.sum()) > 0 else remaining
        kids = kids[1:]
    for column in kids:
        token = tokens[column - 1]
        total = float(remaining.sum())
        if total <= 0:
            break
        chance = float(remaining[token]) / total
        u = float(torch.rand((), generator=generator, device=dist.device, dtype=torch.float64))
        if u < chance:
            return column, remaining
        remaining[token] = 0.0
    if float(remaining.sum()) <= 0:  # every token with mass was a child and rejected: cannot happen exactly
        remaining = dist.double().clone()
    return None, (remaining / remaining.sum()).to(dist.dtype)
