"""Deterministic proposals (q = None) through the engine, and the cost-aware draft length.

A drafter that proposes tokens without a distribution is verified as if q were one-hot on each draft: for
``sd`` the acceptance is p(x) and the residual p with x removed, so greedy decoding must equal the
verifier's own and sampling must sample the verifier's distribution, at batch 1 and > 1.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from distribution import chi2_pvalue, exact_first_tokens

from specbench.decoding import DraftSchedule, EnsembleRule, GenerationSettings, LenientRule, SpeculativeEngine
from specbench.decoding.cost import CostProfile, measure_verify_ms, monotone
from specbench.decoding.cost_aware import CostAwareSchedule, match_bucket
from specbench.decoding.metrics import expected_tokens_per_round, predicted_speedup, summarize
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.rules import VerificationRule, one_step_distribution
from specbench.decoding.verification import one_hot_proposal, verify_round
from specbench.drafters.base import Drafter, Proposal
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model

PROMPTS = [[65], [72, 101, 108], [1, 2, 3, 4, 5, 6], [200, 17, 99, 3, 45, 250, 11, 8, 77]]


@functools.cache
def verifier(arch="llama"):
    return tiny_random_model(arch, seed=0)


@functools.cache
def peek_model(noise: float):
    """A copy of the verifier with noise on its weights: its greedy tokens often, not always, agree."""
    model = tiny_random_model("llama", seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=g) * noise)
    return model


class PeekDrafter(Drafter):
    """Proposes, without a distribution, the greedy continuation of a reference model (full forwards, no
    cache: a test drafter), reporting ``match`` as its match length."""

    deterministic = True
    name = "peek"

    def __init__(self, noise: float = 0.005, match: int = 3):
        self.model, self.match = peek_model(noise), match

    @torch.no_grad()
    def propose(self, state, caps, sampler, want_hidden=False):
        tokens, valid = state.tokens, state.token_valid
        drafts = []
        for _ in range(int(caps.max())):
            positions = (valid.long().cumsum(1) - 1).clamp(min=0)
            logits = self.model(input_ids=tokens, attention_mask=valid.long(), position_ids=positions).logits
            drafts.append(logits[:, -1, :259].argmax(-1))
            tokens = torch.cat([tokens, drafts[-1][:, None]], 1)
            valid = torch.cat([valid, torch.ones_like(valid[:, :1])], 1)
        return Proposal(
            torch.stack(drafts, 1), caps.clone(), q=None, match_lengths=torch.full_like(caps, self.match)
        )


def accepted_share(results):
    rounds = [r for res in results for r in res.rounds]
    return sum(r.accepted for r in rounds) / max(sum(r.drafted for r in rounds), 1)


def hf_greedy(prompt, max_new):
    out = verifier().generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    return out[0, len(prompt):].tolist()


def engine(drafter, rule=None, schedule=None, **settings):
    return SpeculativeEngine(
        verifier(), drafter, rule, schedule or DraftSchedule("constant", 4),
        GenerationSettings(**{"max_new_tokens": 20, **settings}), eos_token_ids=[EOS_ID], pad_token_id=PAD_ID,
    )


def test_one_hot_q_gives_the_sd_closed_form():
    """For sd, q one-hot on x: acceptance p(x), residual p without x renormalised, one step = p."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, 11, generator=g), -1)
    drafts = torch.randint(0, 11, (6,), generator=g)
    q = one_hot_proposal(drafts.unsqueeze(1), 11)[:, 0]
    rule = VerificationRule()
    a = rule.acceptance(p, q).gather(-1, drafts[:, None])[:, 0]
    torch.testing.assert_close(a, p.gather(-1, drafts[:, None])[:, 0])
    expected = p.clone().scatter_(-1, drafts[:, None], 0.0)
    torch.testing.assert_close(rule.residual(p, q), expected / expected.sum(-1, keepdim=True))
    torch.testing.assert_close(one_step_distribution(rule, p, q), p)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("noise", [0.005, 0.01])
def test_greedy_with_a_deterministic_drafter_equals_the_verifier(batch, noise):
    prompts = PROMPTS if batch == 4 else [PROMPTS[2]]
    results = engine(PeekDrafter(noise)).generate(prompts)
    for prompt, result in zip(prompts, results):
        assert result.output_ids == hf_greedy(prompt, 20)
        assert all(r.draft_forwards == 0 for r in result.rounds)
    assert 0.1 < accepted_share(results) < 0.95


def test_a_deterministic_drafter_that_always_agrees_emits_gamma_plus_one_per_round():
    """Oracle check of the accounting: proposing the verifier's own greedy continuation is always accepted."""
    prompt = PROMPTS[3]
    want = hf_greedy(prompt, 20)

    class Oracle(Drafter):
        deterministic = True

        def propose(self, state, caps, sampler, want_hidden=False):
            done = len(state.row_tokens(0)) - len(prompt)
            k = int(caps[0])
            return Proposal(torch.tensor([want[done: done + k]]), torch.tensor([len(want[done: done + k])]))

    result = engine(Oracle()).generate([prompt])[0]
    assert result.output_ids == want
    assert all(r.accepted == r.drafted for r in result.rounds)
    assert [r.emitted for r in result.rounds][:-1] == [5] * (len(result.rounds) - 1)


@pytest.mark.parametrize("batch", [1, 4])
def test_sampling_with_a_deterministic_drafter_matches_the_verifier(batch):
    prompt = PROMPTS[1]
    rows = 4000
    prompts = [prompt if i % batch == 0 else PROMPTS[3] for i in range(rows)]
    eng = SpeculativeEngine(
        verifier(),
        PeekDrafter(0.005),
        None,
        DraftSchedule("constant", 3),
        GenerationSettings(max_new_tokens=3, temperature=1.0, seed=7),
        pad_token_id=PAD_ID,
    )
    outs, results = [], []
    for start in range(0, rows, 500):
        chunk = prompts[start:start + 500]
        batch_results = eng.generate(chunk)
        results += batch_results
        outs += [r.output_ids for r, pr in zip(batch_results, chunk) if pr is prompt]
    outs = np.array(outs)
    assert 0.05 < accepted_share(results) < 0.95
    vocab = verifier().config.vocab_size
    p1, joint = exact_first_tokens(verifier(), prompt)
    assert chi2_pvalue(np.bincount(outs[:, 0], minlength=vocab), p1) > 1e-3
    assert (
        chi2_pvalue(np.bincount(outs[:, 0] * vocab + outs[:, 1], minlength=vocab**2), joint.reshape(-1))
        > 1e-3
    )


def test_rules_that_need_q_refuse_a_deterministic_drafter_and_lossy_accepts_it():
    with pytest.raises(ValueError, match="needs the drafter's distribution q"):
        engine(PeekDrafter(), EnsembleRule(0.3))
    result = engine(PeekDrafter(), LenientRule(0.5)).generate([PROMPTS[2]])[0]
    assert len(result.output_ids) == 20


def test_a_drafter_with_another_lm_head_size_is_refused_by_the_engine():
    other = tiny_random_model("llama", seed=1, num_layers=1, vocab_size=384)
    with pytest.raises(ValueError, match="LM head has 384 rows"):
        SpeculativeEngine(verifier(), ModelDrafter(other))
    # With the shared tokenizer size made explicit, the two heads are sliced to it and decoding runs at T > 0.
    eng = SpeculativeEngine(
        verifier(), ModelDrafter(other, 259), vocab_size=259, settings=GenerationSettings(8, temperature=1.0)
    )
    assert len(eng.generate([PROMPTS[1]])[0].output_ids) == 8


# -- cost profile and cost-aware schedule -----------------------------------------------------------------


def flat_profile(c=0.05, slope=0.0, n=17):
    return CostProfile([10.0 * (1 + slope * i) for i in range(n)], draft_ms=10.0 * c)


def test_profile_prices_rounds_and_reduces_to_leviathan_when_verification_is_flat():
    profile = flat_profile(c=0.05)
    assert profile.v(1) == 1.0 and profile.c == pytest.approx(0.05)
    # Rounds of γ = 5 that emit E[τ] tokens: the profile's prediction is S(α, γ, c) (methods.md §7 values).
    tau = expected_tokens_per_round(0.8, 5)
    assert tau == pytest.approx(3.69, abs=0.01)
    assert profile.predicted_speedup([(5, tau)]) == pytest.approx(predicted_speedup(0.8, 5, 0.05))
    assert predicted_speedup(0.8, 5, 0.05) == pytest.approx(2.95, abs=0.01)
    steep = flat_profile(c=0.05, slope=0.1)
    assert steep.v(6) == pytest.approx(1.5)
    assert steep.predicted_speedup([(5, tau)]) == pytest.approx(tau / (5 * 0.05 + 1.5))
    assert steep.v(20) == pytest.approx(1 + 0.1 * 19)  # linear extrapolation past the measured n


def test_measured_costs_are_made_monotone_by_least_squares():
    assert monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert monotone([5.0, 1.0, 1.0, 1.0]) == [2.0, 2.0, 2.0, 2.0]
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    times = measure_verify_ms(verifier(), 259, max_n=4, context_len=8, repeats=2)
    assert len(times) == 4 and times == sorted(times)


def test_verification_costs_are_timed_in_turn_so_a_load_change_hits_every_n(monkeypatch):
    from specbench.decoding.cache import CachedModel

    widths, forward = [], CachedModel.forward

    def recording(self, ids, *args, **kwargs):
        widths.append(ids.shape[1])
        return forward(self, ids, *args, **kwargs)

    monkeypatch.setattr(CachedModel, "forward", recording)
    measure_verify_ms(verifier(), 259, max_n=3, context_len=8, repeats=2)
    assert widths == [8] + [1, 2, 3] * 3  # the context, a warm-up of every n, then each repeat over all n


def test_profile_file_round_trip_and_errors(tmp_path):
    path = flat_profile().save(tmp_path / "profile.json")
    assert CostProfile.load(path) == flat_profile()
    (tmp_path / "junk.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a specbench cost profile"):
        CostProfile.load(tmp_path / "junk.json")
    with pytest.raises(FileNotFoundError, match="task=profile"):
        CostProfile.load(tmp_path / "missing.json")


def test_cost_aware_lengths_follow_the_costs_and_the_estimates():
    free = CostAwareSchedule(flat_profile(c=0.0, slope=0.0), max_gamma=8)
    assert free.best_length(0, 8) == 8  # drafting is free: draft as much as allowed
    costly = CostAwareSchedule(flat_profile(c=0.2, slope=0.3), max_gamma=8)
    for _ in range(200):  # rounds whose first draft is always rejected
        costly.observe(Proposal(torch.zeros(1, 3, dtype=torch.long), torch.tensor([3])), torch.tensor([0]))
    assert costly.acceptance(0)[0] < 0.01
    assert costly.best_length(0, 8) == 0  # drafting cannot pay: no drafts
    # The chosen k maximises expected tokens per unit cost, by brute force.
    s = CostAwareSchedule(flat_profile(c=0.05, slope=0.08), max_gamma=6)
    alpha = s.acceptance(0).numpy()
    rates = [(1 + sum(np.prod(alpha[:i + 1]) for i in range(k))) / s.profile.round_cost(k) for k in range(7)]
    assert s.best_length(0, 6) == int(np.argmax(rates))


def test_cost_aware_trims_lookup_proposals_per_match_length():
    s = CostAwareSchedule(flat_profile(c=0.0, slope=0.25), max_gamma=8)
    good, bad = match_bucket(9), match_bucket(1)
    for _ in range(300):
        s.observe(Proposal(torch.zeros(2, 8, dtype=torch.long), torch.tensor([8, 8]),
                           match_lengths=torch.tensor([9, 1])), torch.tensor([8, 0]))
    proposal = Proposal(
        torch.arange(16).view(2, 8), torch.tensor([8, 8]), match_lengths=torch.tensor([1, 12])
    )
    trimmed = s.trim(proposal)
    assert trimmed.lengths.tolist() == [0, 8]
    assert trimmed.tokens.shape == (2, 8) and s.acceptance(good)[7] > 0.9 and s.acceptance(bad)[0] < 0.01


def test_a_position_never_verified_inherits_the_estimate_of_the_one_before():
    s = CostAwareSchedule(flat_profile(c=0.0, slope=0.3), max_gamma=8)
    assert s.acceptance(2).tolist() == [0.5] * 8  # nothing observed: the prior everywhere
    for _ in range(20):  # chains trimmed to 2 drafts, both always accepted
        s.observe(
            Proposal(torch.zeros(1, 2, dtype=torch.long), torch.tensor([2]), match_lengths=torch.tensor([2])),
            torch.tensor([2]),
        )
    alpha = s.acceptance(match_bucket(2))
    assert alpha[0] == pytest.approx(21 / 22) and alpha[1] == pytest.approx((20 + 2 * 21 / 22) / 22)
    assert alpha[2] == pytest.approx(alpha[1])  # position 3, never tried, is not held at 1/2
    assert s.best_length(match_bucket(2), 8, drafted=True) > 2  # so the schedule tries longer chains


def test_a_trim_weighs_only_the_verification_of_drafts_already_made():
    s = CostAwareSchedule(flat_profile(c=1.0, slope=0.0), max_gamma=8)  # a draft costs a verifier step
    assert s.best_length(0, 8) == 0  # before drafting: E(1) = 1.5 tokens for 2 steps does not pay
    assert s.best_length(0, 8, drafted=True) == 8  # made already: verifying them is free here
    proposal = Proposal(torch.arange(8).view(1, 8), torch.tensor([8]), match_lengths=torch.tensor([3]))
    assert s.trim(proposal).lengths.tolist() == [8]


@pytest.mark.parametrize("learn_costs", [False, True])
@pytest.mark.parametrize("batch", [1, 4])
def test_cost_aware_decoding_stays_lossless(batch, learn_costs):
    prompts = PROMPTS[:batch] if batch > 1 else [PROMPTS[3]]
    schedule = CostAwareSchedule(flat_profile(c=0.0, slope=0.05), max_gamma=6, learn_costs=learn_costs)
    results = engine(PeekDrafter(0.005), schedule=schedule).generate(prompts)
    for prompt, result in zip(prompts, results):
        assert result.output_ids == hf_greedy(prompt, 20)
    assert accepted_share(results) > 0.1
    model_drafter = ModelDrafter(tiny_random_model("llama", seed=1, num_layers=1))
    schedule = CostAwareSchedule(flat_profile(c=0.1, slope=0.05), max_gamma=6, learn_costs=learn_costs)
    results = engine(model_drafter, schedule=schedule).generate(prompts)
    for prompt, result in zip(prompts, results):
        assert result.output_ids == hf_greedy(prompt, 20)
    if not learn_costs:  # learned, the tiny drafter's real cost decides whether it drafts at all
        assert schedule.trials[0].sum() > 0


def test_summary_has_the_profile_prediction_and_a_cost_ratio_for_model_free_drafters():
    results = engine(PeekDrafter()).generate([PROMPTS[2]])
    metrics = summarize(results, results[0].wall_time, profile=flat_profile(c=0.0, slope=0.1))
    rounds = results[0].rounds
    expected = sum(r.emitted for r in rounds) / sum(1 + 0.1 * r.drafted for r in rounds)
    assert metrics["predicted_speedup_profile"] == pytest.approx(expected)
    assert "cost_ratio" in metrics and "predicted_speedup" in metrics


def test_deterministic_proposals_through_verify_round_match_a_one_hot_q():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(3, 4, 9, generator=g) * 2, -1)
    drafts = torch.randint(0, 9, (3, 3), generator=g)
    lens = torch.tensor([3, 1, 0])
    a = verify_round(VerificationRule(), p, None, drafts, lens, False, torch.Generator().manual_seed(5))
    b = verify_round(VerificationRule(), p, one_hot_proposal(drafts, 9), drafts, lens, False,
                     torch.Generator().manual_seed(5))
    assert torch.equal(a.accepted, b.accepted) and torch.equal(a.next_token, b.next_token)
