"""Tree drafts (specbench/decoding/tree.py; the EAGLE-3 head's ``tree_width``).

The tree forward is checked node by node against a chain forward of the node's own path; the walk
against hand-built trees (greedy) and the exact law of what it emits (sampling, chi-square); the engine
with a tree-drafting head against the verifier's own greedy output (batch 1 and 4) and, at T = 1,
against the verifier's exact joint law of the first two tokens, which leaves accepted with their bonus
token reach.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_eagle3
import torch
from distribution import chi2_pvalue, exact_first_tokens
from test_eagle3 import VOCAB, greedy_reference

from specbench.decoding.cache import CachedModel
from specbench.decoding.engine import GenerationSettings, SpeculativeEngine
from specbench.decoding.rules import LenientRule
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.tree import check_parents, tree_structure, verify_tree
from specbench.drafters.eagle3 import Eagle3Drafter
from specbench.models.tiny import EOS_ID, PAD_ID

# The tiny verifier, its synthetic rows and the head trained on them: test_eagle3's fixtures.
verifier, synth_dir, data, trained_head = (
    test_eagle3.verifier, test_eagle3.synth_dir, test_eagle3.data, test_eagle3.trained_head
)


def test_tree_structure_gives_each_node_its_ancestors_and_depth():
    # columns: 0 root; 1 <- 0; 2 <- 1; 3 <- 0; 4 padding; 5 <- 3
    parents = torch.tensor([[0, 1, 0, -1, 3]])
    ancestors, depth = tree_structure(parents)
    assert depth.tolist() == [[0, 1, 2, 1, 0, 2]]
    rows = [set(torch.nonzero(a).squeeze(1).tolist()) for a in ancestors[0]]
    assert rows == [{0}, {0, 1}, {0, 1, 2}, {0, 3}, {0, 4}, {0, 3, 5}]
    check_parents(parents)
    with pytest.raises(ValueError, match="parent"):
        check_parents(torch.tensor([[0, 2]]))  # draft 1 (column 2) under itself
    with pytest.raises(ValueError, match="one parent per draft"):
        check_parents(parents, torch.zeros(1, 4, dtype=torch.long))


def test_tree_forward_gives_every_node_the_logits_of_its_own_chain(verifier):
    torch.manual_seed(0)
    prompt = torch.randint(3, VOCAB, (2, 11))
    tree = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    parents = torch.tensor([[0, 1, 0, 3, 1, -1], [0, 0, 0, 1, 2, 5]])
    cached = CachedModel(verifier.model, VOCAB)
    cached.reset(2)
    cached.forward(prompt[:, :-1])
    inputs = torch.cat([prompt[:, -1:], tree], dim=1)
    out = cached.forward(inputs, torch.cat([torch.ones(2, 1, dtype=torch.bool), parents >= 0], 1),
                         tree_parents=parents)  # fmt: skip
    ancestors, _ = tree_structure(parents)
    for b in range(2):
        for column in range(inputs.shape[1]):
            if column and parents[b, column - 1] < 0:
                continue
            path = torch.nonzero(ancestors[b, column]).squeeze(1)
            chain = torch.cat([prompt[b], inputs[b, path[1:]]])
            reference = verifier.model(chain.unsqueeze(0)).logits[0, -1, :VOCAB]
            assert torch.allclose(out.logits[b, column], reference, atol=1e-4), (b, column)


def test_reordered_path_leaves_a_cache_equal_to_the_chains(verifier):
    torch.manual_seed(1)
    prompt = torch.randint(3, VOCAB, (1, 9))
    tree = torch.tensor([[20, 21, 22, 23]])
    parents = torch.tensor([[0, 0, 2, 1]])  # path kept: columns 0, 2, 3 (tokens last, 21, 22)
    cached = CachedModel(verifier.model, VOCAB)
    cached.reset(1)
    cached.forward(prompt[:, :-1])
    cached.forward(torch.cat([prompt[:, -1:], tree], 1), tree_parents=parents)
    cached.reorder_last(torch.tensor([[0, 2, 3, 1, 4]]))
    cached.keep(torch.tensor([prompt.shape[1] + 2]))
    after = cached.forward(torch.tensor([[30]])).logits[0, -1]
    chain = torch.cat([prompt[0], torch.tensor([21, 22, 30])])
    assert torch.allclose(after, verifier.model(chain.unsqueeze(0)).logits[0, -1, :VOCAB], atol=1e-4)


def test_greedy_walk_follows_the_argmax_through_chain_and_leaves():
    vocab = 6
    p = torch.zeros(1, 5, vocab)
    # argmax per column: root -> 3, column 1 (token 2) -> 4, column 2 (token 3) -> 5, column 3 -> 1, column 4
    # -> 0
    for column, best in enumerate([3, 4, 5, 1, 0]):
        p[0, column, best] = 1.0
    tokens = torch.tensor([[2, 3, 5, 1]])
    parents = torch.tensor([[0, 0, 2, 0]])  # 2 and 3 and 1 under the root, 5 under the 3
    verdict = verify_tree(p, tokens, parents, greedy=True)
    assert verdict.path == [[2, 3]] and verdict.accepted.tolist() == [2]
    assert verdict.next_token.tolist() == [1]  # the argmax at column 3 (the accepted 5)
    assert verdict.column_order(5, torch.device("cpu")).tolist() == [[0, 2, 3, 1, 4]]


def test_sampled_walk_emits_the_verifiers_law_at_every_step():
    """Children tried in turn with the renormalised residual: the first token has p_root's law (whether a
    child was accepted or not) and the second, after an accepted child, that child's law."""
    torch.manual_seed(0)
    vocab = 5
    p = torch.softmax(torch.randn(1, 5, vocab) * 1.5, dim=-1)
    p[0, 0] = torch.tensor([0.1, 0.3, 0.05, 0.35, 0.2])
    tokens = torch.tensor([[1, 3, 3, 0]])  # duplicate child 3: the second copy can never be accepted
    parents = torch.tensor([[0, 0, 0, 1]])
    generator = torch.Generator().manual_seed(0)
    first, second = np.zeros(vocab), np.zeros(vocab)
    for _ in range(6000):
        verdict = verify_tree(p, tokens, parents, greedy=False, generator=generator)
        path = verdict.path[0]
        emitted = [int(tokens[0, c - 1]) for c in path] + [int(verdict.next_token)]
        first[emitted[0]] += 1
        if path[:1] == [1]:  # child token 1 accepted: the next emitted token follows column 1's law
            second[emitted[1]] += 1
    assert chi2_pvalue(first, p[0, 0].double().numpy()) > 1e-3
    assert second.sum() > 500 and chi2_pvalue(second, p[0, 1].double().numpy()) > 1e-3


def tree_engine(
    verifier, head, width, gamma=3, max_new=20, temperature=0.0, seed=0, rule=None, eos=(EOS_ID,)
):
    return SpeculativeEngine(
        verifier.model,
        Eagle3Drafter(head, tree_width=width),
        rule=rule,
        schedule=DraftSchedule("constant", gamma),
        settings=GenerationSettings(max_new_tokens=max_new, temperature=temperature, seed=seed),
        vocab_size=VOCAB,
        eos_token_ids=list(eos),
        pad_token_id=PAD_ID,
    )


@pytest.mark.parametrize(("batch_size", "width", "gamma"), [(1, 3, 2), (4, 3, 2), (4, 4, 1), (1, 2, 4)])
def test_greedy_tree_decoding_equals_the_verifiers_greedy_output(
    verifier, data, trained_head, batch_size, width, gamma
):
    rows = [data["train"][i] for i in range(4)] + [data["validation"][0]]
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    prompts[2] = prompts[2][:9]
    prompts.insert(1, [66])  # one token: the head drafts from round 2 on
    engine = tree_engine(verifier, trained_head, width, gamma=gamma)
    results = []
    for first in range(0, len(prompts), batch_size):
        results += engine.generate(prompts[first : first + batch_size])
    for prompt, result in zip(prompts, results):
        assert result.output_ids == greedy_reference(verifier, prompt, 20)
    emitted = sum(len(r.output_ids) for r in results)
    rounds = sum(len(r.rounds) for r in results)
    assert emitted >= rounds + 15  # drafts (leaves included) accepted in many rounds


def test_leaves_add_accepted_tokens_over_the_chain(verifier, data, trained_head):
    """Where the head's first choice misses, its 2nd and 3rd choices (the leaves) are often the verifier's."""
    head = trained_head
    prompts = [data["train"][i]["input_ids"][: data["train"][i]["prompt_len"]] for i in range(4)]
    emitted = {}
    for width in (1, 3):
        results = tree_engine(verifier, head, width, gamma=2).generate(prompts)
        emitted[width] = sum(len(r.output_ids) for r in results) / sum(len(r.rounds) for r in results)
        for prompt, result in zip(prompts, results):
            assert result.output_ids == greedy_reference(verifier, prompt, 20)
    assert emitted[3] > emitted[1]


@pytest.mark.parametrize("batch", [1, 4])
def test_tree_sampling_has_the_verifiers_joint_law_of_two_tokens(verifier, data, trained_head, batch):
    prompt = list(data["validation"][0]["input_ids"][: data["validation"][0]["prompt_len"]])
    others = [list(data["train"][i]["input_ids"][: data["train"][i]["prompt_len"]]) for i in range(3)]
    rows = 3000
    prompts = [prompt if i % batch == 0 else others[i % 3] for i in range(rows)]
    engine = tree_engine(verifier, trained_head, 3, gamma=2, max_new=3, temperature=1.0, seed=4, eos=())
    outs, leaf_rounds = [], 0
    for start in range(0, rows, 500):
        chunk = prompts[start : start + 500]
        for result, asked in zip(engine.generate(chunk), chunk):
            if asked is prompt:
                outs.append(result.output_ids[:2])
                leaf_rounds += int(result.rounds[0].accepted >= 1)
    assert leaf_rounds > 100
    outs = np.array(outs)
    p1, joint = exact_first_tokens(verifier.model, prompt)
    p1, joint = p1[:VOCAB], joint[:VOCAB, :VOCAB]
    assert chi2_pvalue(np.bincount(outs[:, 0], minlength=VOCAB), p1) > 1e-3
    assert (
        chi2_pvalue(np.bincount(outs[:, 0] * VOCAB + outs[:, 1], minlength=VOCAB**2), joint.reshape(-1))
        > 1e-3
    )


def test_only_the_exact_rule_verifies_trees_and_the_width_is_checked(verifier, trained_head):
    with pytest.raises(ValueError, match="only the exact 'sd' rule"):
        tree_engine(verifier, trained_head, 3, rule=LenientRule(0.5))
    with pytest.raises(ValueError, match="tree_width"):
        Eagle3Drafter(trained_head, tree_width=0)
    assert tree_engine(verifier, trained_head, 1, rule=LenientRule(0.5)).drafter.proposes_trees is False


@pytest.mark.parametrize("batch_size", [1, 4])
def test_suffix_drafter_with_a_tree_drafting_head_as_fallback_stays_lossless(
    verifier, data, trained_head, batch_size
):
    from specbench.drafters.fallback import FallbackDrafter
    from specbench.drafters.suffix import SuffixDrafter

    drafter = FallbackDrafter(SuffixDrafter(), Eagle3Drafter(trained_head, tree_width=3), VOCAB, 2, 2)
    assert drafter.proposes_trees
    engine = SpeculativeEngine(
        verifier.model, drafter, schedule=DraftSchedule("constant", 6),
        settings=GenerationSettings(max_new_tokens=30), vocab_size=VOCAB, eos_token_ids=[EOS_ID],
        pad_token_id=PAD_ID,
    )  # fmt: skip
    rows = [data["train"][i] for i in range(6)] + [data["validation"][0], data["validation"][1]]
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    results = []
    for first in range(0, len(prompts), batch_size):
        results += engine.generate(prompts[first : first + batch_size])
    for prompt, result in zip(prompts, results):
        assert result.output_ids == greedy_reference(verifier, prompt, 30)
    assert drafter.lookup_rows > 5 and drafter.model_rows > 5


class _Recording:
    """Mixin: keep every proposal's drafts."""

    def propose(self, state, caps, sampler, want_hidden=False):
        proposal = super().propose(state, caps, sampler, want_hidden)
        self.proposed.append(proposal.tokens.tolist())
        return proposal


def _model_tree_drafter(verifier, width, fresh=False):
    from specbench.decoding.model_drafter import ModelDrafter
    from specbench.models.early_exit import early_exit_drafter

    class Recorded(_Recording, ModelDrafter):
        proposed: list

    class FreshCache(Recorded):
        """Rebuilds its cache from the committed tokens before every round: the reference a drafter that
        keeps its cache across rounds must match."""

        def propose(self, state, caps, sampler, want_hidden=False):
            self.cached.reset(state.size)
            self._forward(state.tokens[:, :-1], state.token_valid[:, :-1])
            return super().propose(state, caps, sampler, want_hidden)

    drafter = (FreshCache if fresh else Recorded)(
        early_exit_drafter(verifier.model, 3), VOCAB, tree_width=width
    )
    drafter.proposed = []
    return drafter


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_model_drafter_drafting_trees_stays_lossless_and_keeps_a_true_cache(verifier, data, batch_size):
    """Greedy outputs equal the verifier's; and after a round whose path left the chain for a leaf, the
    drafter's cache holds the committed tokens, not its own chain's drafts: its drafts every round are those
    of a drafter that rebuilds its cache from scratch."""
    prompts = [data["train"][i]["input_ids"][: data["train"][i]["prompt_len"]] for i in range(4)]
    runs = {}
    for name, fresh in (("kept", False), ("fresh", True)):
        drafter = _model_tree_drafter(verifier, 3, fresh)
        engine = SpeculativeEngine(
            verifier.model, drafter, schedule=DraftSchedule("constant", 3),
            settings=GenerationSettings(max_new_tokens=20), vocab_size=VOCAB, eos_token_ids=[EOS_ID],
            pad_token_id=PAD_ID,
        )  # fmt: skip
        results = []
        for first in range(0, len(prompts), batch_size):
            results += engine.generate(prompts[first : first + batch_size])
        for prompt, result in zip(prompts, results):
            assert result.output_ids == greedy_reference(verifier, prompt, 20)
        runs[name] = (drafter.proposed, results)
    assert runs["kept"][0] == runs["fresh"][0]
    leaf_paths = 0
    for result in runs["kept"][1]:
        leaf_paths += sum(1 for r in result.rounds if r.accepted >= 1)
    assert leaf_paths >= 5


def test_a_sampled_first_child_is_verified_with_its_q_and_the_leaves_against_the_residual():
    """The chain's child was drawn from q: accepted with min(1, p/q), then the leaves one-hot against
    norm(max(p − q, 0)). The emitted token has p's law, and the sampled child is accepted with probability
    Σ min(p, q) (more than the p(x) a one-hot test would give it)."""
    vocab = 5
    p = torch.zeros(1, 4, vocab)
    p[0, 0] = torch.tensor([0.1, 0.3, 0.05, 0.35, 0.2])
    p[0, 1:] = 0.2
    q_draft = torch.tensor([0.05, 0.5, 0.05, 0.3, 0.1])
    generator = torch.Generator().manual_seed(1)
    counts, chain_accepted, runs = np.zeros(vocab), 0, 9000
    for _ in range(runs):
        x = int(torch.multinomial(q_draft, 1, generator=generator))
        leaves = [t for t in torch.argsort(q_draft, descending=True).tolist() if t != x][:2]
        tokens = torch.tensor([[x, *leaves]])
        q = torch.zeros(1, 3, vocab)
        q[0, 0] = q_draft
        verdict = verify_tree(p, tokens, torch.tensor([[0, 0, 0]]), greedy=False, generator=generator, q=q)
        emitted = int(tokens[0, verdict.path[0][0] - 1]) if verdict.path[0] else int(verdict.next_token)
        counts[emitted] += 1
        chain_accepted += verdict.path[0][:1] == [1]
    assert chi2_pvalue(counts, p[0, 0].double().numpy()) > 1e-3
    expected = float(torch.minimum(p[0, 0], q_draft).sum())  # 0.75, against Σ q p = 0.29 one-hot
    assert abs(chain_accepted / runs - expected) < 0.02
