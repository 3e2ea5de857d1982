"""Draft vocabularies (specbench/models/draft_vocab.py): SpecForge's most_common + padding rule, the
d2t / t2d maps and their round trips, and q = 0 outside the draft vocabulary (so the ``sd`` rule stays
exact: closed form of the emitted-token distribution)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from specbench.decoding.rules import VerificationRule
from specbench.decoding.warping import Warping
from specbench.models.draft_vocab import DraftVocab, count_response_tokens


def test_most_frequent_response_tokens_with_ties_broken_by_id():
    rows = [([5, 7, 5, 2, 9, 7, 5], [0, 1, 1, 1, 1, 1, 1]), ([7, 3, 3], [1, 0, 0])]
    counts = count_response_tokens(rows)
    assert counts == Counter({7: 3, 5: 2, 2: 1, 9: 1})  # the prompt tokens (5 at 0, 3, 3) are not counted
    vocab = DraftVocab.from_counts(counts, 3, vocab_size=12)
    assert vocab.draft_ids.tolist() == [2, 5, 7]  # 2 and 9 tie at 1: the lower id wins
    assert vocab.d2t.tolist() == [2, 4, 5]  # target = draft + d2t[draft]
    assert vocab.t2d.nonzero().flatten().tolist() == [2, 5, 7]
    assert DraftVocab.from_rows(rows, 3, 12) == vocab


def test_too_few_distinct_tokens_are_padded_with_the_lowest_unused_ids():
    vocab = DraftVocab.from_counts(Counter({1: 4, 10: 5}), 5, vocab_size=20)
    assert vocab.draft_ids.tolist() == [0, 1, 2, 3, 10]
    assert DraftVocab.from_counts(Counter(), 3, 20).draft_ids.tolist() == [0, 1, 2]


def test_maps_round_trip_and_rebuild_from_d2t_and_t2d():
    vocab = DraftVocab([0, 3, 4, 9, 15], vocab_size=16)
    draft = torch.arange(vocab.size)
    assert torch.equal(vocab.to_draft(vocab.to_target(draft)), draft)
    targets = torch.arange(16)
    inside = vocab.to_draft(targets) >= 0
    assert torch.equal(inside, vocab.t2d)
    assert torch.equal(vocab.to_target(vocab.to_draft(targets[inside])), targets[inside])
    assert (vocab.to_draft(targets[~inside]) == -1).all()
    assert DraftVocab.from_mappings(vocab.d2t, 16, vocab.t2d) == vocab
    wrong = vocab.t2d.clone()
    wrong[1] = True
    with pytest.raises(ValueError, match="t2d mask does not match"):
        DraftVocab.from_mappings(vocab.d2t, 16, wrong)
    assert DraftVocab.full(16).d2t.abs().sum() == 0 and DraftVocab.full(16).t2d.all()


def test_restrict_then_expand_keeps_draft_entries_and_zeroes_the_rest():
    vocab = DraftVocab([1, 2, 6], vocab_size=8)
    target_logits = torch.randn(2, 8)
    draft_logits = vocab.restrict(target_logits)
    assert torch.equal(draft_logits, target_logits[:, [1, 2, 6]])
    full = vocab.expand_logits(draft_logits)
    assert torch.equal(full[:, [1, 2, 6]], draft_logits) and torch.isinf(full[:, [0, 3, 4, 5, 7]]).all()
    probs = vocab.expand_probs(draft_logits.softmax(-1))
    assert torch.allclose(probs.sum(-1), torch.ones(2)) and (probs[:, [0, 3, 4, 5, 7]] == 0).all()


@pytest.mark.parametrize(
    "warping", [Warping(0.0), Warping(1.0), Warping(0.7, top_k=2), Warping(1.3, top_p=0.8)]
)
def test_q_is_exactly_zero_outside_the_draft_vocabulary_under_every_warping(warping):
    vocab = DraftVocab([0, 4, 5, 11], vocab_size=12)
    q = warping.probs(vocab.expand_logits(torch.randn(5, vocab.size)))
    assert (q[:, ~vocab.t2d] == 0).all()
    assert torch.allclose(q.sum(-1), torch.ones(5))


def test_sd_rule_emits_exactly_p_from_a_reduced_vocabulary_proposal():
    """Emitted-token law of one drafted position: q(x)·a(x) + (1 − Σ q·a)·residual = p, with q = 0 on
    the tokens the draft vocabulary lacks (closed form, no sampling)."""
    torch.manual_seed(0)
    vocab = DraftVocab([1, 2, 5, 7], vocab_size=9)
    rule = VerificationRule()
    p = torch.randn(3, 9).softmax(-1)
    q = Warping(1.0).probs(vocab.expand_logits(torch.randn(3, vocab.size)))
    accept = rule.acceptance(p, q)
    emitted = q * accept + (1 - (q * accept).sum(-1, keepdim=True)) * rule.residual(p, q)
    torch.testing.assert_close(emitted, p)


@pytest.mark.parametrize("size", [0, 13])
def test_bad_sizes_and_ids_name_the_problem(size):
    with pytest.raises(ValueError, match=r"draft_vocab_size must be in \[1, 12\]"):
        DraftVocab.from_counts(Counter({1: 1}), size, 12)
    with pytest.raises(ValueError, match="outside the verifier vocabulary"):
        DraftVocab.from_counts(Counter({40: 1}), 3, 12)
    with pytest.raises(ValueError, match="strictly increasing"):
        DraftVocab([3, 3, 4], 12)
