"""Several lookup drafters' chains merged into one tree: the trie is right, the outputs are the verifier's own
(greedy and at T = 1), and the tree beats either chain alone on the rounds where they disagree."""

import numpy as np
import pytest
import torch
from distribution import chi2_pvalue, exact_first_tokens
from test_fallback_drafter import decodes_as_the_verifier
from test_lookup_drafters import SAMPLER, e2e_prompts, lookup_engine, tiny_verifier

from specbench.decoding.drafting import BatchState
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.protocol import Drafter, Proposal
from specbench.drafters.fallback import FallbackDrafter
from specbench.drafters.lookup_tree import LookupTreeDrafter, is_chain, merge_chains
from specbench.drafters.prompt_lookup import PromptLookupDrafter
from specbench.drafters.suffix import SuffixDrafter
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model


def _paths(tokens, parents):
    """Every root-to-leaf token path of a (tokens, parents) tree."""
    children = {j + 1 for j in range(len(tokens))} - {p for p in parents}
    out = []
    for leaf in children:
        path, column = [], leaf
        while column > 0:
            path.append(tokens[column - 1])
            column = parents[column - 1]
        out.append(path[::-1])
    return sorted(out)


def test_the_trie_holds_every_chain_once_with_shared_prefixes_merged():
    chains = [[5, 6, 7, 8], [5, 6, 9], [1, 2], [5, 6, 7, 8]]
    tokens, parents = merge_chains(chains)
    assert tokens == [5, 6, 7, 8, 9, 1, 2]
    assert parents == [0, 1, 2, 3, 2, 0, 6]
    assert _paths(tokens, parents) == sorted([[5, 6, 7, 8], [5, 6, 9], [1, 2]])
    assert all(parent <= j for j, parent in enumerate(parents))  # a parent comes before its child


@pytest.mark.parametrize("seed", range(20))
def test_random_chains_merge_into_a_tree_whose_paths_are_the_chains(seed):
    rng = np.random.default_rng(seed)
    chains = [list(rng.integers(0, 3, size=rng.integers(0, 6))) for _ in range(rng.integers(1, 4))]
    tokens, parents = merge_chains(chains)
    nonempty = [c for c in chains if c]
    # every chain is a path from the root; every leaf ends some chain; no two siblings share a token
    for chain in nonempty:
        assert any(path[: len(chain)] == chain for path in _paths(tokens, parents))
    assert all(any(c[: len(path)] == path for c in nonempty) for path in _paths(tokens, parents))
    siblings = {(parent, token) for parent, token in zip(parents, tokens)}
    assert len(siblings) == len(tokens)


def test_max_nodes_ends_the_later_chains_and_one_chain_is_a_chain():
    tokens, parents = merge_chains([[1, 2, 3], [4, 5, 6]], max_nodes=4)
    assert tokens == [1, 2, 3, 4] and parents == [0, 1, 2, 0]
    assert is_chain(merge_chains([[1, 2, 3], [1, 2]])[1])
    assert not is_chain(parents)


class _Fixed(Drafter):
    """A deterministic drafter proposing fixed chains per row (for the merge through ``propose``)."""

    deterministic = True

    def __init__(self, chains, name):
        self.chains, self.name = chains, name

    def propose(self, state, caps, sampler, want_hidden=False):
        rows = [chain[:cap] for chain, cap in zip(self.chains[: state.size], caps.tolist())]
        width = max(len(r) for r in rows)
        tokens = torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])
        return Proposal(tokens, torch.tensor([len(r) for r in rows]))


def test_propose_gives_a_chain_when_the_lookups_agree_and_a_tree_when_they_do_not():
    state = BatchState.create([[3, 4, 5], [3, 4]], 10, 30, [EOS_ID], PAD_ID, "cpu")
    agree = LookupTreeDrafter([_Fixed([[7, 8], [9]], "a"), _Fixed([[7, 8, 1], []], "b")])
    chain = agree.propose(state, torch.tensor([10, 10]), SAMPLER)
    assert chain.parents is None and chain.tokens.tolist() == [[7, 8, 1], [9, PAD_ID, PAD_ID]]
    assert chain.lengths.tolist() == [3, 1]
    differ = LookupTreeDrafter([_Fixed([[7, 8], [9]], "a"), _Fixed([[7, 2], [6, 6]], "b")])
    tree = differ.propose(state, torch.tensor([10, 2]), SAMPLER)
    assert tree.tokens.tolist() == [[7, 8, 2], [9, 6, 6]] and tree.parents.tolist() == [[0, 1, 1], [0, 0, 2]]
    assert differ.tree_rounds == 1 and agree.chain_rounds == 1


def _tree_fallback(model_gamma=1):
    lookup = LookupTreeDrafter([SuffixDrafter(backend="python"), PromptLookupDrafter(num_output_tokens=6)])
    model = ModelDrafter(tiny_random_model(seed=6).eval(), 320)
    return FallbackDrafter(lookup, model, 320, 2, model_gamma)


@pytest.mark.parametrize("kind", ["attention", "local"])
def test_greedy_output_is_the_verifiers_own_with_trees_chains_and_the_model(kind):
    drafter, _ = decodes_as_the_verifier(kind, _tree_fallback)
    assert drafter.lookup.tree_rounds > 0  # the two lookups disagreed on some rounds: trees were verified


def test_sampling_with_trees_is_the_verifiers_distribution():
    """Two lookups proposing different chains through the verifier's likeliest first tokens: every round is a
    tree, and the first two tokens still follow the verifier's distribution."""
    model = tiny_verifier("local")
    prompt = list(e2e_prompts("local")[2])
    p1, joint = exact_first_tokens(model, prompt)
    first, second = np.argsort(-p1)[:2].tolist()
    after_first = int(np.argmax(joint[first]))
    rows = 500
    chains = [_Fixed([[first, after_first]] * rows, "a"), _Fixed([[second, first]] * rows, "b")]
    lookup = LookupTreeDrafter(chains)
    drafter = FallbackDrafter(lookup, ModelDrafter(tiny_random_model(seed=6).eval(), 320), 320, 1, 2)
    engine = lookup_engine("local", drafter, gamma=3, eos=(), max_new_tokens=3, temperature=1.0, seed=5)
    outs = []
    for _ in range(6):
        outs += [r.output_ids[:2] for r in engine.generate([prompt] * rows)]
    assert lookup.tree_rounds >= 6 and lookup.chain_rounds == 0
    outs = np.array(outs)
    vocab = model.config.vocab_size
    assert chi2_pvalue(np.bincount(outs[:, 0], minlength=vocab), p1) > 1e-3
    pairs = np.bincount(outs[:, 0] * vocab + outs[:, 1], minlength=vocab**2)
    assert chi2_pvalue(pairs, joint.reshape(-1)) > 1e-3


def test_bad_lookups_are_refused():
    model = ModelDrafter(tiny_random_model(seed=6).eval(), 320)
    with pytest.raises(ValueError, match="model-free drafter proposing chains"):
        LookupTreeDrafter([SuffixDrafter(backend="python"), model])
    with pytest.raises(ValueError, match="at least one"):
        LookupTreeDrafter([])
    with pytest.raises(ValueError, match="max_nodes"):
        LookupTreeDrafter([SuffixDrafter(backend="python")], max_nodes=0)
