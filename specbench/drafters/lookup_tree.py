"""Several model-free drafters' chains for a row, merged into one tree of drafts and verified in one forward.

Prompt lookup and suffix decoding look in different places (the leftmost n-gram match in the row's own
context; the most frequent continuation in the row's context and the run's earlier outputs), and where they
disagree each is right on different rounds. Asking both costs two lookups of microseconds; verifying both
chains costs more verifier rows, which a CPU or GPU batch-1 forward takes at almost no extra time in bf16.
Chains are merged as a trie (shared prefixes become one path), the first drafter's chain first, so a round
where they agree is verified as the chain it is (no tree attention, no cache reordering).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.protocol import Drafter, Proposal, VerifierView
from specbench.decoding.tree import NO_PARENT


def merge_chains(
    chains: Sequence[Sequence[int]], max_nodes: int | None = None
) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the trie of ``chains``, in the order of the :class:`Proposal` tree convention:
    node ``j`` sits in verifier column ``j + 1`` and ``parents[j]`` is its parent's column (0: the root).
    A chain's node that would exceed ``max_nodes`` ends that chain."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}
    for chain in chains:
        column = 0
        for token in chain:
            found = child.get((column, token))
            if found is None:
                if max_nodes is not None and len(tokens) >= max_nodes:
                    break
                tokens.append(int(token))
                parents.append(column)
                found = child[(column, token)] = len(tokens)
            column = found
    return tokens, parents


def is_chain(parents: Sequence[int]) -> bool:
    return all(parent == j for j, parent in enumerate(parents))


class LookupTreeDrafter(Drafter):
    """The chains of ``lookups`` (deterministic drafters, in priority order) merged per row into one tree of
    at most ``max_nodes`` drafts (None: every chain whole). A round in which every row's trie is a chain is
    proposed as a chain."""

    deterministic = True
    proposes_trees = True

    def __init__(self, lookups: Sequence[Drafter], max_nodes: int | None = None, name: str | None = None):
        if not lookups:
            raise ValueError("a lookup tree needs at least one lookup drafter")
        for lookup in lookups:
            if not lookup.deterministic or lookup.proposes_trees:
                raise ValueError(
                    f"lookup tree: {lookup.name!r} must be a model-free drafter proposing chains "
                    "(deterministic, proposes_trees False)"
                )
        if max_nodes is not None and max_nodes < 1:
            raise ValueError(f"lookup tree: max_nodes must be >= 1 or null, got {max_nodes}")
        self.lookups = list(lookups)
        self.max_nodes = max_nodes
        self.name = name or "+".join(lookup.name for lookup in self.lookups)
        needs = self.lookups[0].needs
        for lookup in self.lookups[1:]:
            needs = needs.union(lookup.needs)
        self.needs = needs
        self.tree_rounds = self.chain_rounds = 0  # rounds proposed as a tree / a chain, since construction

    @property
    def trimmed_by_schedule(self) -> bool:
        return False  # a tree cannot be cut to lengths by match length

    def memory_state(self) -> object:
        return [lookup.memory_state() for lookup in self.lookups]

    def restore_memory(self, state: object) -> None:
        for lookup, saved in zip(self.lookups, state):
            lookup.restore_memory(saved)

    def save_memory(self):
        written = [lookup.save_memory() for lookup in self.lookups]
        return next((path for path in written if path is not None), None)

    def reset(self, batch_size: int) -> None:
        for lookup in self.lookups:
            lookup.reset(batch_size)

    def prefill(self, state: BatchState, view: VerifierView | None) -> None:
        for lookup in self.lookups:
            lookup.prefill(state, view)

    def commit(self, state: BatchState, view: VerifierView, accepted: torch.Tensor) -> None:
        for lookup in self.lookups:
            lookup.commit(state, view, accepted)

    def select_rows(self, rows: torch.Tensor) -> None:
        for lookup in self.lookups:
            lookup.select_rows(rows)

    def propose(
        self, state: BatchState, caps: torch.Tensor, sampler: DraftSampler, want_hidden: bool = False
    ) -> Proposal:
        chains_by_lookup = [_chains(lookup.propose(state, caps, sampler)) for lookup in self.lookups]
        merged = [merge_chains(chains, self.max_nodes) for chains in zip(*chains_by_lookup)]
        if all(is_chain(parents) for _, parents in merged):
            self.chain_rounds += 1
            return _proposal([tokens for tokens, _ in merged], None, state)
        self.tree_rounds += 1
        return _proposal([tokens for tokens, _ in merged], [parents for _, parents in merged], state)

    def describe(self) -> dict:
        return {
            "drafter": self.name,
            "lookups": [lookup.describe() for lookup in self.lookups],
            "max_nodes": self.max_nodes,
        }


def _chains(proposal: Proposal) -> list[list[int]]:
    return [row[:n] for row, n in zip(proposal.tokens.tolist(), proposal.lengths.tolist())]


def _proposal(tokens: list[list[int]], parents: list[list[int]] | None, state: BatchState) -> Proposal:
    width = max((len(row) for row in tokens), default=0)
    device = state.device
    padded = [row + [state.pad_id] * (width - len(row)) for row in tokens]
    lengths = torch.tensor([len(row) for row in tokens], dtype=torch.long, device=device)
    out = torch.tensor(padded, dtype=torch.long, device=device).reshape(len(tokens), width)
    if parents is None:
        return Proposal(out, lengths)
    tree = [row + [NO_PARENT] * (width - len(row)) for row in parents]
    tree_parents = torch.tensor(tree, dtype=torch.long, device=device).reshape(len(tokens), width)
    return Proposal(out, lengths, parents=tree_parents)
