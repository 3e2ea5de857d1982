"""A lookup drafter with a model drafter as fallback: per row and round, the lookup's drafts when it has a
long enough match, else a few drafts of the model (ArcticInference runs suffix decoding this way in front
of its EAGLE / MTP drafters).

The two drafters are complementary: a lookup drafter proposes long, cheap, often-accepted chains where the
output repeats its context (code edits, summaries, RAG answers) and nothing elsewhere; a small EAGLE-3 head
proposes one or two tokens anywhere, at a cost per token. Both keep their own state every round (both see
every ``prefill`` / ``commit`` / ``select_rows``), so either can draft the next round. A round where no row
falls back does not run the model drafter at all: its pending verifier features wait for the next round it
drafts in (:class:`~specbench.drafters.eagle3.Eagle3Drafter` processes them in one forward then).

The lookup's drafts are deterministic; the proposal gives them a one-hot q, which is what the verification
rules assume for a deterministic drafter, so every rule stays exact with rows of both kinds in one batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from specbench.decoding.protocol import Drafter, Proposal
from specbench.decoding.tree import NO_PARENT, tree_structure


class FallbackDrafter(Drafter):
    """``lookup`` (deterministic) first; rows where it drafts fewer than ``min_lookup_tokens`` tokens take up
    to ``model_gamma`` drafts of ``model`` instead."""

    def __init__(
        self,
        lookup: Drafter,
        model: Drafter,
        vocab_size: int,
        min_lookup_tokens: int = 2,
        model_gamma: int = 1,
        name: str = "lookup+model",
    ):
        if not lookup.deterministic:
            raise ValueError(
                f"the lookup drafter {lookup.name!r} must be deterministic (a model-free drafter)"
            )
        if min_lookup_tokens < 1 or model_gamma < 1:
            raise ValueError(
                f"min_lookup_tokens and model_gamma must be >= 1, got {min_lookup_tokens} and {model_gamma}"
            )
        self.lookup, self.model = lookup, model
        self.vocab_size = int(vocab_size)
        self.min_lookup_tokens, self.model_gamma = int(min_lookup_tokens), int(model_gamma)
        self.name = name
        self.needs = lookup.needs.union(model.needs)
        self.deterministic = False
        self.proposes_trees = lookup.proposes_trees or model.proposes_trees
        self.lookup_rows = self.model_rows = 0  # row-rounds each drafter drafted in (since construction)

    @property
    def trimmed_by_schedule(self) -> bool:
        """schedule=cost_aware trims its chains by match length (model rows: bucket 0); trees it cannot
        trim."""
        return self.lookup.trimmed_by_schedule and not self.proposes_trees

    def memory_state(self) -> object:
        return self.lookup.memory_state(), self.model.memory_state()

    def restore_memory(self, state: object) -> None:
        lookup, model = state
        self.lookup.restore_memory(lookup)
        self.model.restore_memory(model)

    def reset(self, batch_size: int) -> None:
        self.lookup.reset(batch_size)
        self.model.reset(batch_size)

    def prefill(self, state, view) -> None:
        self.lookup.prefill(state, view)
        self.model.prefill(state, view)

    def propose(self, state, caps: torch.Tensor, sampler, want_hidden: bool = False) -> Proposal:
        looked = self.lookup.propose(state, caps, sampler)
        depth = _depths(looked)
        use_lookup = depth >= torch.minimum(caps, torch.full_like(caps, self.min_lookup_tokens))
        use_lookup &= depth > 0
        self.lookup_rows += int(use_lookup.sum())
        model_caps = torch.where(use_lookup, torch.zeros_like(caps), caps.clamp(max=self.model_gamma))
        if bool((model_caps > 0).any()):
            drafted = self.model.propose(state, model_caps, sampler)
            self.model_rows += int((drafted.lengths > 0).sum())
        else:
            drafted = Proposal.empty(state.size, state.device)
        width = max(looked.tokens.shape[1], drafted.tokens.shape[1])
        tokens = torch.where(
            use_lookup.unsqueeze(1),
            _pad(looked.tokens, width, state.pad_id),
            _pad(drafted.tokens, width, state.pad_id),
        )
        lengths = torch.where(use_lookup, looked.lengths, drafted.lengths)
        if looked.parents is not None or drafted.parents is not None:  # chains become trees of one path
            parents = torch.where(
                use_lookup.unsqueeze(1), _tree_parents(looked, width), _tree_parents(drafted, width)
            )
            q = None
            if drafted.q is not None:  # model rows keep the q they drew from; lookup rows are one-hot (zeros)
                model_q = F.pad(drafted.q, (0, 0, 0, width - drafted.q.shape[1]))
                q = torch.where(use_lookup.view(-1, 1, 1), torch.zeros_like(model_q), model_q)
            return Proposal(tokens=tokens, lengths=lengths, q=q, forwards=drafted.forwards, parents=parents)
        one_hot = F.one_hot(tokens, self.vocab_size).float()
        if drafted.q is not None:
            model_q = torch.cat([drafted.q, one_hot[:, drafted.q.shape[1] :]], dim=1)
            q = torch.where(use_lookup.view(-1, 1, 1), one_hot, model_q)
        else:
            q = one_hot
        matches = None
        if looked.match_lengths is not None:  # a lookup row's match (>= 1); a model row's 0 (no match)
            matches = torch.where(use_lookup, looked.match_lengths.clamp(min=1), torch.zeros_like(lengths))
        return Proposal(tokens=tokens, lengths=lengths, q=q, forwards=drafted.forwards, match_lengths=matches)

    def commit(self, state, view, accepted: torch.Tensor) -> None:
        self.lookup.commit(state, view, accepted)
        self.model.commit(state, view, accepted)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.lookup.select_rows(rows)
        self.model.select_rows(rows)

    def describe(self) -> dict:
        return {
            "drafter": self.name,
            "lookup": self.lookup.describe(),
            "model": self.model.describe(),
            "min_lookup_tokens": self.min_lookup_tokens,
            "model_gamma": self.model_gamma,
        }


def _pad(tokens: torch.Tensor, width: int, pad_id: int) -> torch.Tensor:
    return F.pad(tokens, (0, width - tokens.shape[1]), value=pad_id)


def _depths(proposal: Proposal) -> torch.Tensor:
    """(B,) drafts on each row's longest path: its length for a chain, its depth for a tree."""
    if proposal.parents is None or proposal.tokens.shape[1] == 0:
        return proposal.lengths
    return tree_structure(proposal.parents)[1].max(dim=1).values


def _tree_parents(proposal: Proposal, width: int) -> torch.Tensor:
    """(B, width) the proposal's parents, a chain's as the tree of one path (padding: NO_PARENT)."""
    if proposal.parents is not None:
        return F.pad(proposal.parents, (0, width - proposal.parents.shape[1]), value=NO_PARENT)
    columns = torch.arange(width, device=proposal.tokens.device).unsqueeze(0)
    return torch.where(columns < proposal.lengths.unsqueeze(1), columns, torch.full_like(columns, NO_PARENT))


def suffix_then_eagle3(
    path: str,
    verifier: Any,
    vocab_size: int,
    min_lookup_tokens: int = 2,
    model_gamma: int = 1,
    suffix: dict | None = None,
    taps=None,
    tree_width: int = 1,
    prompt_lookup: dict | None = None,
    max_tree_nodes: int | None = None,
) -> FallbackDrafter:
    """``model/drafter=suffix-eagle3-smollm2``: the suffix drafter, and the EAGLE-3 head at ``path`` where the
    suffix drafter has fewer than ``min_lookup_tokens`` tokens to propose (a tree of ``tree_width`` tokens per
    depth when ``tree_width`` > 1). ``prompt_lookup`` (the :class:`PromptLookupDrafter`'s arguments, ``{}``
    for its defaults): its chain and the suffix drafter's merged into one tree of at most ``max_tree_nodes``
    drafts (:class:`~specbench.drafters.lookup_tree.LookupTreeDrafter`), the head drafting where neither has
    ``min_lookup_tokens`` tokens."""
    from specbench.drafters.eagle3.format import eagle3_drafter
    from specbench.drafters.suffix import SuffixDrafter

    lookup: Drafter = SuffixDrafter(**(suffix or {}))
    name = "suffix+eagle3"
    if prompt_lookup is not None:
        from specbench.drafters.lookup_tree import LookupTreeDrafter
        from specbench.drafters.prompt_lookup import PromptLookupDrafter

        lookup = LookupTreeDrafter([lookup, PromptLookupDrafter(**prompt_lookup)], max_tree_nodes)
        name = "suffix+pl+eagle3"
    return FallbackDrafter(
        lookup,
        eagle3_drafter(path, verifier, vocab_size, taps, tree_width=tree_width),
        vocab_size,
        min_lookup_tokens,
        model_gamma,
        name=name,
    )
