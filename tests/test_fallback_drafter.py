"""The lookup drafter with a model drafter as fallback: exact in greedy decoding and at T = 1, both used."""

import numpy as np
import pytest
import torch
from distribution import chi2_pvalue, exact_first_tokens
from test_lookup_drafters import SAMPLER, e2e_prompts, hf_generate, lookup_engine, tiny_verifier

from specbench.decoding.cost import CostProfile
from specbench.decoding.cost_aware import CostAwareSchedule
from specbench.decoding.drafting import BatchState
from specbench.decoding.engine import SpeculativeEngine
from specbench.decoding.model_drafter import ModelDrafter
from specbench.drafters.fallback import FallbackDrafter
from specbench.drafters.suffix import SuffixDrafter
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model


def _fallback(min_lookup_tokens=2, model_gamma=2) -> FallbackDrafter:
    model = ModelDrafter(tiny_random_model(seed=6).eval(), 320)
    return FallbackDrafter(SuffixDrafter(backend="python"), model, 320, min_lookup_tokens, model_gamma)


def decodes_as_the_verifier(kind: str, make_drafter) -> tuple[FallbackDrafter, list]:
    """Greedy decoding of every e2e prompt with a fresh ``make_drafter()``, batched and one at a time, equals
    HF greedy decoding; returns the batched run's drafter and results."""
    prompts = [list(p) for p in e2e_prompts(kind)]
    expected = [hf_generate(tiny_verifier(kind), p, 30)[0] for p in prompts]
    drafter = make_drafter()
    batched = lookup_engine(kind, drafter).generate(prompts)
    alone = [lookup_engine(kind, make_drafter()).generate([p])[0] for p in prompts]
    for want, row, single in zip(expected, batched, alone):
        assert row.output_ids == want and single.output_ids == want
    assert drafter.lookup_rows > 0 and drafter.model_rows > 0
    return drafter, batched


@pytest.mark.parametrize("kind", ["attention", "local"])
def test_greedy_output_is_the_verifiers_own_with_both_drafters_drafting(kind):
    _, batched = decodes_as_the_verifier(kind, _fallback)
    assert all(r.drafted <= 10 for row in batched for r in row.rounds)
    model_rounds = [r for res in batched for r in res.rounds if r.draft_forwards > 0]
    assert model_rounds and all(r.drafted <= 2 * len(batched) for r in model_rounds)


def test_a_row_with_a_long_match_takes_the_lookup_chain_and_others_the_model():
    """One prompt quotes the verifier's own greedy text (the suffix drafter proposes long chains), the other
    does not (only the model drafts)."""
    quoted, plain = list(e2e_prompts("local")[2]), list(e2e_prompts("local")[1])
    rows = {}
    for name, prompt in (("quoted", quoted), ("plain", plain)):
        drafter = _fallback(min_lookup_tokens=3, model_gamma=1)
        rows[name] = lookup_engine("local", drafter, max_new_tokens=40).generate([prompt])[0]
        assert rows[name].output_ids == hf_generate(tiny_verifier("local"), prompt, 40)[0]
    assert all(r.drafted >= 3 and r.draft_forwards == 0 for r in rows["quoted"].rounds)  # no model forward
    model_rounds = [r for r in rows["plain"].rounds if r.draft_forwards > 0]  # the model's one draft
    assert len(model_rounds) >= len(rows["plain"].rounds) // 2 and all(r.drafted == 1 for r in model_rounds)
    both = lookup_engine("local", _fallback(min_lookup_tokens=3, model_gamma=1), max_new_tokens=40)
    assert [r.output_ids for r in both.generate([quoted, plain])] == [
        rows["quoted"].output_ids,
        rows["plain"].output_ids,
    ]


@pytest.mark.parametrize("batch", [1, 4])
def test_sampling_is_the_verifiers_distribution(batch):
    model = tiny_verifier("local")
    prompt = list(e2e_prompts("local")[2])
    others = [list(p) for p in e2e_prompts("local")[:2]] + [list(e2e_prompts("local")[3])]
    rows = 3000
    prompts = [prompt if i % batch == 0 else others[i % 3] for i in range(rows)]
    drafter = _fallback(min_lookup_tokens=2, model_gamma=2)
    engine = lookup_engine("local", drafter, gamma=3, eos=(), max_new_tokens=3, temperature=1.0, seed=5)
    outs = []
    for start in range(0, rows, 500):
        chunk = prompts[start : start + 500]
        for result, asked in zip(engine.generate(chunk), chunk):
            if asked is prompt:
                outs.append(result.output_ids[:2])
    assert drafter.lookup_rows > 100 and drafter.model_rows > 100
    outs = np.array(outs)
    vocab = model.config.vocab_size
    p1, joint = exact_first_tokens(model, prompt)
    assert chi2_pvalue(np.bincount(outs[:, 0], minlength=vocab), p1) > 1e-3
    assert (
        chi2_pvalue(np.bincount(outs[:, 0] * vocab + outs[:, 1], minlength=vocab**2), joint.reshape(-1))
        > 1e-3
    )


def test_a_proposal_gives_lookup_rows_their_match_length_and_model_rows_none():
    quoted, plain = list(e2e_prompts("local")[2]), list(e2e_prompts("local")[1])
    drafter = _fallback(min_lookup_tokens=3, model_gamma=1)
    assert drafter.trimmed_by_schedule  # schedule=cost_aware trims it (a chain drafter)
    # The quoted prompt repeats its own text: after decoding part of it, the suffix drafter finds a match.
    engine = lookup_engine("local", drafter, max_new_tokens=12)
    history = [quoted + engine.generate([quoted])[0].output_ids, plain]
    state = BatchState.create(history, 10, 30, [EOS_ID], PAD_ID, "cpu")
    drafter.reset(2)
    drafter.prefill(state, None)
    proposal = drafter.propose(state, torch.tensor([10, 10]), SAMPLER)
    lookup_row, model_row = proposal.match_lengths.tolist()
    assert proposal.lengths[0] >= 3 and lookup_row >= 1
    assert proposal.lengths[1] == 1 and model_row == 0


@pytest.mark.parametrize("batch", [1, 3])
def test_cost_aware_trims_the_fallback_losslessly_with_model_rows_in_bucket_zero(batch):
    prompts = (
        [list(p) for p in e2e_prompts("local")][:batch] if batch > 1 else [list(e2e_prompts("local")[1])]
    )
    expected = [hf_generate(tiny_verifier("local"), p, 30)[0] for p in prompts]
    # Verifying n tokens costs 1 + 0.3 (n - 1) steps: long chains of a short match do not pay.
    profile = CostProfile([10.0 * (1 + 0.3 * i) for i in range(11)], draft_ms=1.0)
    schedule = CostAwareSchedule(
        profile, 10, learn_costs=False
    )  # priced by this profile, not the tiny model's times
    drafter = _fallback(min_lookup_tokens=2, model_gamma=1)
    engine = SpeculativeEngine(
        tiny_verifier("local"),
        drafter,
        None,
        schedule,
        lookup_engine("local", drafter).settings,
        eos_token_ids=(EOS_ID,),
        pad_token_id=PAD_ID,
    )
    results = engine.generate(prompts)
    assert [r.output_ids for r in results] == expected
    assert drafter.lookup_rows > 0 and drafter.model_rows > 0
    assert schedule.trials[0].sum() > 0 and schedule.trials[1:].sum() > 0  # model rows, lookup rows
    assert schedule.trials[0, 1:].sum() == 0  # the model drafts one token: bucket 0 tries position 1 only
    if batch > 1:  # the row that quotes itself: its chains grow once their first drafts keep being accepted
        assert max(r.drafted for r in results[2].rounds) >= 4


def test_bad_arguments_are_refused():
    model = ModelDrafter(tiny_random_model(seed=6).eval(), 320)
    with pytest.raises(ValueError, match="deterministic"):
        FallbackDrafter(model, SuffixDrafter(backend="python"), 320)
    with pytest.raises(ValueError, match="min_lookup_tokens and model_gamma"):
        FallbackDrafter(SuffixDrafter(backend="python"), model, 320, min_lookup_tokens=0)
