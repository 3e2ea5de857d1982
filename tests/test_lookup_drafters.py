"""Model-free drafters (prompt-lookup, ngram, suffix) driven through the Drafter interface with a real
BatchState, against HF's PromptLookupCandidateGenerator, brute-force statements of vLLM's ngram rule and of
SuffixDecoding's counting, and ArcticInference's C++ suffix tree where it is installed."""

from __future__ import annotations

import functools
import random
from collections import Counter

import numpy as np
import pytest
import torch
from distribution import chi2_pvalue, exact_first_tokens
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from specbench.decoding import GenerationSettings, SpeculativeEngine
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping
from specbench.drafters.ngram import NgramDrafter
from specbench.drafters.prompt_lookup import PromptLookupDrafter
from specbench.drafters.suffix import SuffixDrafter, arctic_available
from specbench.drafters.suffix_tree import PySuffixTree, _f32
from specbench.drafters.token_history import FirstOccurrenceIndex
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model

EOS, PAD = 9, 99
SAMPLER = DraftSampler(Warping(), torch.Generator().manual_seed(0), DraftSchedule())


def token_sequence(rng: random.Random, length: int, vocab: int, repeat: float) -> list[int]:
    """Random tokens where, with probability ``repeat`` per step, a span of earlier text is copied."""
    out: list[int] = []
    while len(out) < length:
        if out and rng.random() < repeat:
            start = rng.randrange(len(out))
            out.extend(out[start : start + rng.randint(1, 12)])
        else:
            out.append(rng.randrange(vocab))
    return out[:length]


def drive(
    drafter,
    rows: list[list[int]],
    prompt_lens: list[int],
    rng: random.Random,
    check,
    caps_of=None,
    drop_at: int | None = None,
):
    """Feed ``rows`` to ``drafter`` as the engine would: prompts, then each round a few tokens per row
    (every row gains at least one). Before every round ``check(drafter, proposal, histories, caps)``.
    At round ``drop_at`` the second row leaves the batch (select_rows)."""
    state = BatchState.create([r[:n] for r, n in zip(rows, prompt_lens)], 5, 10_000, [EOS], PAD, "cpu")
    drafter.reset(state.size)
    drafter.prefill(state, None)
    done = list(prompt_lens)
    alive = list(range(len(rows)))
    round_index = 0
    while any(done[i] < len(rows[i]) for i in alive):
        caps = caps_of(len(alive), rng) if caps_of else torch.full((len(alive),), 10, dtype=torch.long)
        proposal = drafter.propose(state, caps, SAMPLER)
        check(drafter, proposal, [rows[i][: done[i]] for i in alive], caps)
        new = []
        for i in alive:
            take = min(rng.randint(1, 6), len(rows[i]) - done[i])
            new.append(rows[i][done[i] : done[i] + max(take, 0)])
            done[i] += max(take, 0)
        if all(not n for n in new):
            break
        state.append([n if n else [] for n in new])
        drafter.commit(state, None, torch.zeros(len(alive), dtype=torch.long))
        round_index += 1
        if drop_at is not None and round_index == drop_at and len(alive) > 1:
            keep = torch.tensor([j for j in range(len(alive)) if j != 1])
            state.select(keep)
            drafter.select_rows(keep)
            alive = [alive[j] for j in keep.tolist()]
    return state


def proposal_rows(proposal) -> list[list[int]]:
    return [proposal.tokens[b, : int(n)].tolist() for b, n in enumerate(proposal.lengths)]


# -- prompt-lookup: HF's PromptLookupCandidateGenerator is the oracle --------------------------------------


def hf_candidates(history: list[int], ngram: int, k: int, max_length: int = 1_000_000) -> list[int]:
    generator = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor([EOS]),
        num_output_tokens=k,
        max_matching_ngram_size=ngram,
        max_length=max_length,
    )
    ids = torch.tensor([history])
    candidates, _ = generator.get_candidates(ids)
    return candidates[0, len(history) :].tolist()


@pytest.mark.parametrize("ngram,k", [(2, 10), (1, 4), (3, 10), (4, 2)])
@pytest.mark.parametrize("batch", [1, 4])
def test_prompt_lookup_equals_hf_on_random_and_repetitive_text(ngram, k, batch):
    rng = random.Random(ngram * 100 + k + batch)
    drafter = PromptLookupDrafter(max_matching_ngram_size=ngram, num_output_tokens=k)
    checked = Counter()

    def check(drafter, proposal, histories, caps):
        assert proposal.q is None and proposal.forwards == 0
        for history, got in zip(histories, proposal_rows(proposal)):
            expected = hf_candidates(history, ngram, k)
            assert got == expected, (history, got, expected)
            checked["non-empty" if expected else "empty"] += 1

    for trial in range(6):
        vocab = [3, 6, 12, 40][trial % 4]
        rows = [token_sequence(rng, rng.randint(20, 120), vocab, rng.random()) for _ in range(batch)]
        drive(drafter, rows, [rng.randint(1, 15) for _ in rows], rng, check)
    assert checked["non-empty"] > 30 and checked["empty"] > 0


def test_prompt_lookup_hf_eos_handling_and_max_length():
    drafter = PromptLookupDrafter()
    cases = [
        [1, 2, 3, 9, 4, 5, 1, 2],  # the continuation "3 9 4" is cut before the EOS: [3]
        [1, 2, 9, 4, 7, 1, 2],  # continuation starts with EOS: nothing, and no fallback to the 1-gram match
        [5, 9, 5, 6, 5],  # 2-gram "6 5" unseen; 1-gram "5" first at 0, continuation starts with EOS: nothing
    ]
    for history in cases:
        state = BatchState.create([history], 5, 100, [EOS], PAD, "cpu")
        drafter.prefill(state, None)
        got = proposal_rows(drafter.propose(state, torch.tensor([10]), SAMPLER))[0]
        assert got == hf_candidates(history, 2, 10)
    assert proposal_rows(drafter.propose(state, torch.tensor([10]), SAMPLER))[0] == []
    # HF's absolute max_length: no candidates when one token is left.
    history = [1, 2, 3, 1, 2]
    for max_length in (6, 7, 50):
        capped = PromptLookupDrafter(max_length=max_length)
        state = BatchState.create([history], 5, 100, [EOS], PAD, "cpu")
        capped.prefill(state, None)
        got = proposal_rows(capped.propose(state, torch.tensor([10]), SAMPLER))[0]
        assert got == hf_candidates(history, 2, 10, max_length=max_length)
    assert got == [3, 1, 2]


def test_prompt_lookup_spec_bench_rule():
    """Spec-Bench's PLD: leftmost occurrence with a full continuation that starts before the last n-gram."""

    def reference(tokens, max_n=3, k=10):
        length = len(tokens)
        for n in range(max_n, 0, -1):
            for start in range(length - n + 1):
                follow = start + n
                if tokens[start:follow] == tokens[-n:] and follow + k <= length and follow < length - n:
                    return tokens[follow : follow + k]
        return []

    rng = random.Random(7)
    drafter = PromptLookupDrafter.spec_bench()
    seen = Counter()

    def check(drafter, proposal, histories, caps):
        for history, got in zip(histories, proposal_rows(proposal)):
            expected = reference(history)
            expected = expected[: expected.index(EOS) + 1] if EOS in expected else expected
            assert got == expected
            seen[bool(expected)] += 1

    for _ in range(4):
        rows = [token_sequence(rng, rng.randint(30, 150), 8, 0.5) for _ in range(3)]
        drive(drafter, rows, [5, 12, 3], rng, check)
    assert seen[True] > 10


# -- ngram: vLLM's rule --------------------------------------------------------------------------------------


def vllm_reference(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Longest n in [min_n, max_n] whose n-gram also ends before the last token; its leftmost occurrence."""
    for n in range(max_n, min_n - 1, -1):
        for start in range(len(tokens) - n):
            if tokens[start : start + n] == tokens[len(tokens) - n :]:
                return tokens[start + n : start + n + k]
    return []


def test_ngram_matches_vllm_examples():
    examples = [  # (tokens, min, max, k, expected) from vLLM's own tests of its ngram proposer
        ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),
        ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
        ([1, 2, 3, 4, 1, 2, 3], 1, 1, 3, [4, 1, 2]),
        ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),
        ([1, 2, 3, 4, 1, 2, 3], 3, 4, 2, [4, 1]),
        ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),
        ([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2, [1, 2]),
        ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),
    ]
    for tokens, lo, hi, k, expected in examples:
        drafter = NgramDrafter(prompt_lookup_min=lo, prompt_lookup_max=hi, num_speculative_tokens=k)
        state = BatchState.create([tokens], 5, 100, [], PAD, "cpu")
        drafter.prefill(state, None)
        assert proposal_rows(drafter.propose(state, torch.tensor([10]), SAMPLER))[0] == expected
        assert vllm_reference(tokens, lo, hi, k) == expected


def test_ngram_defaults_follow_vllm():
    assert (NgramDrafter().prompt_lookup_min, NgramDrafter().prompt_lookup_max) == (5, 5)
    assert (
        NgramDrafter(prompt_lookup_max=3).prompt_lookup_min,
        NgramDrafter(prompt_lookup_min=2).prompt_lookup_max,
    ) == (3, 2)
    with pytest.raises(ValueError, match="prompt_lookup_min <= prompt_lookup_max"):
        NgramDrafter(prompt_lookup_min=4, prompt_lookup_max=2)


@pytest.mark.parametrize("lo,hi,k", [(1, 3, 5), (2, 5, 10), (5, 5, 4), (1, 1, 1)])
@pytest.mark.parametrize("batch", [1, 4])
def test_ngram_equals_brute_force(lo, hi, k, batch):
    rng = random.Random(lo * 31 + hi * 7 + k + batch)
    drafter = NgramDrafter(prompt_lookup_min=lo, prompt_lookup_max=hi, num_speculative_tokens=k)
    seen = Counter()

    def check(drafter, proposal, histories, caps):
        for history, got, cap in zip(histories, proposal_rows(proposal), caps.tolist()):
            expected = vllm_reference(history, lo, hi, min(k, cap))
            expected = expected[: expected.index(EOS) + 1] if EOS in expected else expected
            assert got == expected
            seen[bool(expected)] += 1

    def caps_of(size, rng):
        return torch.tensor([rng.choice([0, 1, 3, 10]) for _ in range(size)])

    for trial in range(5):
        rows = [
            token_sequence(rng, rng.randint(20, 140), [2, 5, 10, 30, 10][trial], rng.random())
            for _ in range(batch)
        ]
        drive(drafter, rows, [rng.randint(1, 10) for _ in rows], rng, check, caps_of=caps_of, drop_at=3)
    assert seen[True] > 20


# -- the interface contract, every drafter ------------------------------------------------------------------


def all_drafters():
    return [
        PromptLookupDrafter(),
        PromptLookupDrafter.spec_bench(),
        NgramDrafter(prompt_lookup_min=1, prompt_lookup_max=3, num_speculative_tokens=6),
        SuffixDrafter(backend="python"),
    ]


@pytest.mark.parametrize("drafter", all_drafters(), ids=lambda d: f"{d.name}-{getattr(d, 'match_rule', '')}")
def test_caps_eos_and_rows_leaving(drafter):
    """Drafts never exceed caps (0 → nothing), never continue past an EOS, and each row keeps its own
    history when rows of different lengths are dropped from the batch."""
    rng = random.Random(3)
    rows = [token_sequence(rng, n, 6, 0.9) for n in (60, 150, 40, 100)]
    for row in rows:  # EOS tokens inside the text, so that continuations contain them
        for at in rng.sample(range(len(row) // 2), 3):
            row[at] = EOS
    reference = {}
    seen = Counter()

    def check(drafter_, proposal, histories, caps):
        assert proposal.q is None and proposal.tokens.shape[0] == len(histories)
        for history, got, cap in zip(histories, proposal_rows(proposal), caps.tolist()):
            assert len(got) <= cap
            assert EOS not in got[:-1]
            if getattr(drafter_, "match_rule", None) == "hf":
                assert EOS not in got  # HF drops the EOS itself
            if cap == 0:
                assert got == []
            # The same row alone in a fresh drafter proposes the same (rows do not leak into each other,
            # except through the suffix drafter's global cache, which this fresh drafter does not share).
            if drafter_.name != "suffix":
                fresh = reference.setdefault(drafter_.name, type(drafter_)(**_params(drafter_)))
                state = BatchState.create([history], 5, 100, [EOS], PAD, "cpu")
                fresh.prefill(state, None)
                assert proposal_rows(fresh.propose(state, torch.tensor([cap]), SAMPLER))[0] == got
            seen["eos-cut" if got and got[-1] == EOS else "plain"] += bool(got)

    def caps_of(size, rng):
        return torch.tensor([rng.choice([0, 2, 10, 24]) for _ in range(size)])

    drive(drafter, rows, [5, 30, 2, 11], rng, check, caps_of=caps_of, drop_at=2)
    assert seen["plain"] > 5
    if drafter.name != "prompt-lookup" or drafter.match_rule != "hf":
        assert seen["eos-cut"] > 0  # HF's rule drops the EOS itself instead


def _params(drafter) -> dict:
    if isinstance(drafter, PromptLookupDrafter):
        return {
            "max_matching_ngram_size": drafter.max_matching_ngram_size,
            "num_output_tokens": drafter.num_output_tokens,
            "match_rule": drafter.match_rule,
        }
    return {
        "prompt_lookup_min": drafter.prompt_lookup_min,
        "prompt_lookup_max": drafter.prompt_lookup_max,
        "num_speculative_tokens": drafter.num_speculative_tokens,
    }


def test_history_out_of_step_is_a_clear_error():
    drafter = NgramDrafter()
    state = BatchState.create([[1, 2, 3], [4, 5]], 5, 100, [EOS], PAD, "cpu")
    drafter.reset(3)
    with pytest.raises(ValueError, match="holds 3 rows but the batch has 2"):
        drafter.propose(state, torch.tensor([3, 3]), SAMPLER)


def test_incremental_index_equals_rebuild():
    rng = random.Random(11)
    tokens = token_sequence(rng, 500, 7, 0.6)
    incremental = FirstOccurrenceIndex(2, 5)
    at = 0
    while at < len(tokens):
        step = rng.randint(1, 9)
        incremental.extend(tokens[at : at + step])
        at += step
    rebuilt = FirstOccurrenceIndex(2, 5)
    rebuilt.extend(tokens)
    assert incremental._tables == rebuilt._tables and incremental.tokens == tokens
    # And the drafters: after many rounds, a fresh drafter prefilled with everything proposes the same.
    for make in (
        lambda: PromptLookupDrafter(),
        lambda: NgramDrafter(1, 4, 8),
        lambda: SuffixDrafter(max_cached_requests=0, backend="python"),
    ):
        drafter = make()
        rows = [token_sequence(rng, n, 5, 0.6) for n in (120, 70, 200)]
        state = drive(drafter, rows, [3, 10, 1], rng, lambda *a: None)
        fresh = make()
        fresh.prefill(state, None)
        caps = torch.tensor([24, 24, 24])
        assert proposal_rows(fresh.propose(state, caps, SAMPLER)) == proposal_rows(
            drafter.propose(state, caps, SAMPLER)
        )


# -- suffix: counting semantics, caching, the C++ reference --------------------------------------------------


def count(sequences: list[list[int]], pattern: list[int], depth: int) -> int:
    if len(pattern) > depth:
        return 0
    n = len(pattern)
    return sum(seq[s : s + n] == pattern for seq in sequences for s in range(len(seq) - n + 1))


def reference_suffix_draft(sequences, context, depth, max_tokens, factor=1.0, offset=0.0, min_prob=0.1):
    """SuffixDecoding's chain, by brute-force counting; None when a tie between equally frequent
    continuations decides the tokens (the tree's order among equal counts then decides, tested below)."""
    context = context[-depth:]
    best = (0.0, [], [])
    for m in range(1, len(context)):
        path = list(context[-m:])
        if count(sequences, path, depth) == 0:
            break
        limit = max(0, min(max_tokens, int(_f32(_f32(m * factor) + offset) + 1e-6)))
        prob, score, out, probs = 1.0, 0.0, [], []
        while len(out) < limit and prob >= min_prob and len(path) < depth:
            n = len(path)
            options = Counter(
                seq[s + n] for seq in sequences for s in range(len(seq) - n) if seq[s : s + n] == path
            )
            if not options:
                break
            (token, top), *rest = options.most_common()
            new_prob = _f32(prob * _f32(top / count(sequences, path, depth)))
            if new_prob < min_prob:
                break
            if rest and rest[0][1] == top:
                return None
            prob = new_prob
            out.append(token)
            probs.append(prob)
            path.append(token)
            score = _f32(score + prob)
        if score >= best[0]:
            best = (score, out, probs)
    return best


def test_suffix_tree_counts_like_brute_force():
    rng = random.Random(5)
    decided = 0
    for trial in range(40):
        depth = rng.choice([2, 3, 5, 24])
        sequences = [
            token_sequence(rng, rng.randint(5, 60), rng.choice([2, 4, 9]), rng.random()) for _ in range(3)
        ]
        tree = PySuffixTree(depth)
        for seq_id, seq in enumerate(sequences):
            for at in range(0, len(seq), 4):
                tree.extend(seq_id, seq[at : at + 4])
        for _ in range(8):
            source = rng.choice(sequences)
            end = rng.choice([len(source), rng.randint(1, len(source))])
            context = source[:end][-depth:] if rng.random() < 0.8 else token_sequence(rng, 6, 4, 0.3)
            args = (
                rng.choice([1, 4, 24]),
                rng.choice([1.0, 2.0]),
                rng.choice([0.0, 1.0]),
                rng.choice([0.0, 0.1, 0.4]),
            )
            expected = reference_suffix_draft(sequences, context, depth, *args)
            if expected is None:
                continue
            draft = tree.speculate(context[-depth:], *args)
            if end == len(source) and context == source[-depth:]:  # the context ends like that sequence
                hinted = tree.speculate(context[-depth:], *args, tail_of=sequences.index(source))
                assert (hinted.score, hinted.token_ids, hinted.probs) == expected
            assert (draft.score, draft.token_ids, draft.probs) == expected
            decided += 1
    assert decided > 150


def test_suffix_draft_length_adapts_to_the_match():
    tree = PySuffixTree(24)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    tree.extend(0, text)
    # "1 2 3" (m = 3) occurs twice (once at the end, without continuation): probs 1/2, at most 3 tokens.
    draft = tree.speculate(text, 10, 1.0, 0.0, 0.1)
    assert (draft.token_ids, draft.probs, draft.match_len) == ([4, 5, 6], [0.5, 0.5, 0.5], 3)
    assert tree.speculate(text, 10, 2.0, 0.0, 0.1).token_ids == [4, 5, 6, 7, 8, 1]
    assert tree.speculate(text, 2, 2.0, 0.0, 0.1).token_ids == [4, 5]
    assert tree.speculate(text, 10, 1.0, 0.0, 0.6).token_ids == []  # 0.5 < min_token_prob
    shallow = PySuffixTree(5)
    shallow.extend(0, text)
    # Depth 5 bounds match + draft: "2 3" + 3 tokens (score 1.5) beats "1 2 3" + 2 tokens (score 1.0).
    draft = shallow.speculate(text[-5:], 10, 2.0, 0.0, 0.1)
    assert (draft.token_ids, draft.match_len) == ([4, 5, 6], 2)


def test_suffix_global_cache_carries_earlier_outputs_and_round_trips(tmp_path):
    rng = random.Random(2)
    outputs = [
        [100 * (i + 1) + t for t in token_sequence(rng, 80, 30, 0.2)] for i in range(3)
    ]  # disjoint vocabularies
    drafter = SuffixDrafter(backend="python", max_cached_requests=2)
    for output in outputs:  # three requests, one after the other; the cache keeps the last two
        drive(drafter, [[50, 51] + output], [2], rng, lambda *a: None)
    assert drafter.cached_responses == outputs[1:]
    path = drafter.save_cache(tmp_path / "suffix-cache.json")
    loaded = SuffixDrafter(backend="python", cache_file=str(path))
    assert loaded.cached_responses == outputs[1:]
    # A new prompt that quotes an earlier output is continued from the global tree, identically.
    prompt = [60, 61] + outputs[2][10:20]
    for d in (drafter, loaded):
        state = BatchState.create([prompt], 5, 100, [EOS], PAD, "cpu")
        d.prefill(state, None)
        got = proposal_rows(d.propose(state, torch.tensor([24]), SAMPLER))[0]
        assert got[:5] == outputs[2][20:25]
        assert d.last_drafts[0].match_len == 10
    evicted_quote = [60, 61] + outputs[0][10:20]
    state = BatchState.create([evicted_quote], 5, 100, [EOS], PAD, "cpu")
    loaded.prefill(state, None)
    assert proposal_rows(loaded.propose(state, torch.tensor([24]), SAMPLER))[0] == []
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a specbench suffix cache"):
        SuffixDrafter(backend="python").load_cache(bad)


def test_suffix_prefers_local_tree_on_ties():
    drafter = SuffixDrafter(backend="python")
    drive(drafter, [[50, 1, 2, 8, 1, 2, 6]], [1], random.Random(0), lambda *a: None)  # an earlier output
    # Local tree (the prompt): "1 2" twice, once followed by "7 3" → [7, 3], score 0.5 + 0.5. Global tree:
    # "1 2" followed by 8 or 6 → [8, 1], score 1.0 too; the local draft wins the tie.
    state = BatchState.create([[1, 2, 7, 3, 1, 2]], 5, 100, [EOS], PAD, "cpu")
    drafter.prefill(state, None)
    assert proposal_rows(drafter.propose(state, torch.tensor([24]), SAMPLER))[0] == [7, 3]
    assert drafter.last_drafts[0].score == 1.0
    assert drafter.describe()["backend"] == "python"


@pytest.mark.skipif(not arctic_available(), reason="ArcticInference's suffix tree is not installed")
def test_python_suffix_tree_equals_arctic_inference():
    """Same drafts as ArcticInference's C++ tree, ties and float32 scores included, with removals."""
    from specbench.drafters.suffix import ArcticSuffixTree

    rng = random.Random(17)
    compared = 0
    for trial in range(120):
        depth = rng.choice([1, 2, 3, 5, 8, 24])
        ours, theirs = PySuffixTree(depth), ArcticSuffixTree(depth)
        sequences = {
            i: token_sequence(rng, rng.randint(1, 150), rng.choice([2, 3, 5, 20]), rng.random())
            for i in range(rng.randint(1, 4))
        }
        progress = dict.fromkeys(sequences, 0)
        while any(progress[i] < len(s) for i, s in sequences.items()):
            i = rng.choice([j for j, s in sequences.items() if progress[j] < len(s)])
            chunk = sequences[i][progress[i] : progress[i] + rng.randint(1, 4)]
            progress[i] += len(chunk)
            ours.extend(i, chunk)
            theirs.extend(i, chunk)
            if rng.random() < 0.3:
                context = sequences[i][: progress[i]][-depth:]
                args = (
                    rng.choice([1, 5, 24]),
                    rng.choice([0.5, 1.0, 2.0]),
                    rng.choice([0.0, 1.0]),
                    rng.choice([0.0, 0.1, 0.3]),
                )
                assert ours.speculate(context, *args, tail_of=i) == theirs.speculate(context, *args)
                assert ours.speculate(context, *args) == theirs.speculate(context, *args)
                compared += 1
        if len(sequences) > 1:
            gone = rng.choice(list(sequences))
            ours.remove(gone)
            theirs.remove(gone)
            for i in sequences:
                if i != gone:
                    context = sequences[i][-depth:]
                    assert ours.speculate(context, 24, 1.0, 0.0, 0.1) == theirs.speculate(
                        context, 24, 1.0, 0.0, 0.1
                    )
                    compared += 1
    assert compared > 500


# -- end to end through the engine (tiny verifiers) ----------------------------------------------------------


@functools.cache
def tiny_verifier(kind: str):
    """``attention``: the tiny random Llama. ``local``: the same with its attention outputs zeroed, so its
    next token depends on the last token only and its text repeats: lookups are accepted often (and its
    token 217 is followed by EOS)."""
    model = tiny_random_model("llama", seed=0)
    if kind == "local":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
    return model


def hf_generate(model, prompt, max_new, **lookup):
    """HF's greedy ``generate`` (with prompt lookup when ``lookup`` is given) and its number of forwards."""
    calls = []
    hook = model.register_forward_hook(lambda *args: calls.append(1))
    try:
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            **lookup,
        )
    finally:
        hook.remove()
    return out[0, len(prompt) :].tolist(), len(calls)


@functools.cache
def e2e_prompts(kind: str) -> tuple[tuple[int, ...], ...]:
    """Prompts of different lengths; the last ones quote the verifier's own greedy text, and one holds
    "217 EOS" so that proposals contain an EOS the local verifier accepts."""
    model = tiny_verifier(kind)
    base = [[65], [72, 101, 108], [1, 2, 3, 4, 5, 6], [200, 17, 99, 3, 45, 250, 11, 8, 77]]
    quoted = []
    for prompt in base[1:3]:
        text, _ = hf_generate(model, prompt, 24)
        quoted.append(prompt + text + text[:3])
    with_eos = [40, 217, EOS_ID, 41, 42, 40, 217]
    return tuple(tuple(p) for p in [base[0], base[3], *quoted, with_eos])


def lookup_engine(kind, drafter, gamma=10, eos=(EOS_ID,), **settings):
    return SpeculativeEngine(
        tiny_verifier(kind),
        drafter,
        None,
        DraftSchedule("constant", gamma),
        GenerationSettings(**{"max_new_tokens": 30, **settings}),
        eos_token_ids=eos,
        pad_token_id=PAD_ID,
    )


E2E_DRAFTERS = {
    "prompt-lookup": lambda: PromptLookupDrafter(),
    "prompt-lookup-spec-bench": lambda: PromptLookupDrafter.spec_bench(),
    "ngram": lambda: NgramDrafter(1, 3, 10),
    "suffix": lambda: SuffixDrafter(backend="python"),
}


@pytest.mark.parametrize("kind", ["attention", "local"])
@pytest.mark.parametrize("name", list(E2E_DRAFTERS))
def test_greedy_output_is_the_verifiers_own(kind, name):
    prompts = [list(p) for p in e2e_prompts(kind)]
    expected = [hf_generate(tiny_verifier(kind), p, 30)[0] for p in prompts]
    drafter = E2E_DRAFTERS[name]()
    batched = lookup_engine(kind, drafter).generate(prompts)  # rows of different lengths, some end at EOS
    alone = [lookup_engine(kind, E2E_DRAFTERS[name]()).generate([p])[0] for p in prompts]
    for want, row, single in zip(expected, batched, alone):
        assert row.output_ids == want and single.output_ids == want
        assert all(r.draft_forwards == 0 and r.drafted <= 10 for r in row.rounds)
    drafted = sum(r.drafted for res in batched for r in res.rounds)
    accepted = sum(r.accepted for res in batched for r in res.rounds)
    assert drafted > 20
    if (
        kind == "local"
    ):  # repeating text: most drafts accepted; the EOS prompt's proposal ends the row at once
        assert accepted > 40
        assert expected[-1] == [EOS_ID]


@pytest.mark.parametrize("kind", ["attention", "local"])
@pytest.mark.parametrize("ngram,k", [(2, 10), (3, 4)])
def test_prompt_lookup_equals_hf_generate_ids_and_forwards(kind, ngram, k):
    drafter = PromptLookupDrafter(max_matching_ngram_size=ngram, num_output_tokens=k)
    for prompt in e2e_prompts(kind):
        ids, forwards = hf_generate(
            tiny_verifier(kind), list(prompt), 30, prompt_lookup_num_tokens=k, max_matching_ngram_size=ngram
        )
        result = lookup_engine(kind, drafter, gamma=k).generate([list(prompt)])[0]
        assert result.output_ids == ids
        assert result.verifier_forwards == forwards  # HF's first forward is the prefill and round 1 at once


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", ["prompt-lookup", "suffix"])
def test_sampling_with_lookup_drafts_is_the_verifiers_distribution(batch, name):
    model = tiny_verifier("local")
    prompt = list(e2e_prompts("local")[2])
    others = [list(p) for p in e2e_prompts("local")[:2]] + [list(e2e_prompts("local")[3])]
    rows = 3000
    prompts = [prompt if i % batch == 0 else others[i % 3] for i in range(rows)]
    # No EOS: the first two tokens are always sampled, their exact law is the verifier's.
    engine = lookup_engine(
        "local", E2E_DRAFTERS[name](), gamma=3, eos=(), max_new_tokens=3, temperature=1.0, seed=5
    )
    outs, drafted, accepted = [], 0, 0
    for start in range(0, rows, 500):
        chunk = prompts[start : start + 500]
        for result, asked in zip(engine.generate(chunk), chunk):
            drafted += sum(r.drafted for r in result.rounds)
            accepted += sum(r.accepted for r in result.rounds)
            if asked is prompt:
                outs.append(result.output_ids[:2])
    assert drafted > 1000 and accepted > 50
    outs = np.array(outs)
    vocab = model.config.vocab_size
    p1, joint = exact_first_tokens(model, prompt)
    assert chi2_pvalue(np.bincount(outs[:, 0], minlength=vocab), p1) > 1e-3
    assert (
        chi2_pvalue(np.bincount(outs[:, 0] * vocab + outs[:, 1], minlength=vocab**2), joint.reshape(-1))
        > 1e-3
    )


@pytest.mark.skipif(not arctic_available(), reason="ArcticInference's suffix tree is not installed")
def test_suffix_drafter_backends_propose_the_same():
    rng = random.Random(23)
    rows = [token_sequence(rng, n, 8, 0.7) for n in (150, 90, 200)]
    python, arctic = SuffixDrafter(backend="python"), SuffixDrafter(backend="arctic")
    seen = []

    def check(drafter, proposal, histories, caps):
        if drafter is python:
            seen.append(proposal_rows(proposal))
        else:
            assert proposal_rows(proposal) == seen.pop(0)

    for _ in range(2):  # the second pass drafts from the first pass's outputs too (global tree)
        drive(python, rows, [10, 3, 30], random.Random(1), check, drop_at=4)
        drive(arctic, rows, [10, 3, 30], random.Random(1), check, drop_at=4)
    assert not seen


def test_save_memory_writes_a_suffix_drafters_cache_file_unless_it_is_read_only(tmp_path):
    cache = tmp_path / "cache.json"
    assert PromptLookupDrafter().save_memory() is None  # the protocol's default: nothing kept
    assert SuffixDrafter().save_memory() is None  # no cache_file
    drafter = SuffixDrafter(cache_file=str(cache))
    engine = lookup_engine("local", drafter, max_new_tokens=6)
    engine.generate([[5, 6, 7, 5, 6]])
    assert drafter.save_memory() == cache and cache.is_file()
    read_only = SuffixDrafter(cache_file=str(cache), update_cache_file=False)
    assert read_only.seeded_responses > 0 and read_only.save_memory() is None
