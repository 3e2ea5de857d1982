"""schedule=cost_aware with learn_costs: round costs re-estimated from the run's own round times."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch
from test_deterministic_drafters import PROMPTS, PeekDrafter, engine, flat_profile, hf_greedy

from specbench.decoding.cost import CostProfile
from specbench.decoding.cost_aware import CostAwareSchedule
from specbench.decoding.learned_cost import LearnedCosts
from specbench.drafters.base import Proposal
from specbench.models.tiny import tiny_random_model


def profile(verify_ms, draft_ms=1.0):
    return CostProfile(list(verify_ms), draft_ms=draft_ms)


def test_before_any_round_the_costs_are_the_profiles():
    p = profile([10.0, 12.0, 15.0, 19.0], draft_ms=0.8)
    verify, c = LearnedCosts(p, 6).relative()
    assert verify == pytest.approx([p.v(n) for n in range(1, 7)])  # past max_n: the profile's extrapolation
    assert c == pytest.approx(p.c)


def test_a_uniformly_slower_machine_keeps_the_shape_and_learns_the_scale():
    p = profile([10.0, 11.0, 13.0, 16.0], draft_ms=2.0)
    costs = LearnedCosts(p, 4)
    for _ in range(200):
        for n in (1, 2, 4):  # n = 3 is never observed
            costs.observe(n, 2.0 * p.verify_ms[n - 1], forwards=2, draft_ms=2 * 2.0 * p.draft_ms)
    verify, c = costs.relative()
    assert verify == pytest.approx([p.v(n) for n in range(1, 5)], rel=1e-6)
    assert c == pytest.approx(p.c, rel=1e-3)
    assert costs.load_scale == pytest.approx(2.0, rel=0.01)


def test_a_profile_that_overstated_v2_is_corrected_by_the_rounds_and_changes_the_trim():
    # Timed in a busy minute: v(2) = 1.4. The run's own rounds verify 2 columns as fast as 1.
    busy = profile([10.0, 14.0, 15.0, 16.0, 17.0], draft_ms=0.5)
    schedule = CostAwareSchedule(busy, max_gamma=4)
    for _ in range(100):  # first drafts accepted 30 % of the time
        for accepted in (1, 0, 0, 1, 0, 0, 0, 1, 0, 0):
            schedule.observe(
                Proposal(torch.zeros(1, 1, dtype=torch.long), torch.tensor([1])), torch.tensor([accepted])
            )
    assert schedule.acceptance(0)[0] == pytest.approx(0.3, abs=0.01)
    assert schedule.best_length(0, 4, drafted=True) == 0  # 1.3 tokens for 1.4 steps: the profile says no
    for _ in range(60):
        schedule.observe_round(1, 0.010, 0, 0.0)
        schedule.observe_round(2, 0.010, 1, 0.0005)
    verify, _ = schedule.costs.relative()
    assert verify[1] < 1.05
    assert schedule.best_length(0, 4, drafted=True) >= 1  # 1.3 tokens for about 1 step: draft
    unlearned = CostAwareSchedule(busy, max_gamma=4, learn_costs=False)
    assert not unlearned.learns_costs and unlearned.costs is None


def test_one_descheduled_round_barely_moves_a_cost():
    costs = LearnedCosts(profile([10.0, 10.0]), 2)
    for _ in range(30):
        costs.observe(1, 10.0)
        costs.observe(2, 10.0)
    costs.observe(2, 1000.0)  # the OS took the core for a second
    verify, _ = costs.relative()
    assert verify[1] < 1.3  # an arithmetic mean would read about 5


def test_a_length_no_longer_chosen_drifts_back_to_the_profile_at_todays_load():
    costs = LearnedCosts(profile([10.0, 10.0, 10.0]), 3)
    for _ in range(50):
        costs.observe(1, 10.0)
        costs.observe(2, 20.0)
    assert costs.relative()[0][1] > 1.5
    for _ in range(300):
        costs.observe(1, 10.0)
    assert costs.relative()[0][1] == pytest.approx(1.0, abs=0.05)


def test_estimates_are_non_decreasing_in_n():
    costs = LearnedCosts(profile([10.0, 11.0, 12.0]), 3)
    for _ in range(50):
        costs.observe(3, 9.0)  # noise: 3 columns read faster than the profile's 1
    verify, _ = costs.relative()
    assert all(a <= b + 1e-12 for a, b in pairwise(verify))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="decay"):
        LearnedCosts(profile([10.0]), 2, decay=0.0)
    with pytest.raises(ValueError, match="prior_rounds"):
        LearnedCosts(profile([10.0]), 2, prior_rounds=0)


class RecordingSchedule(CostAwareSchedule):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reports = []

    def observe_round(self, columns, round_seconds, forwards, draft_seconds):
        self.reports.append((columns, round_seconds, forwards, draft_seconds))
        super().observe_round(columns, round_seconds, forwards, draft_seconds)


@pytest.mark.parametrize("learn_costs", [True, False])
def test_the_engine_reports_every_rounds_columns_forwards_and_times(learn_costs):
    from specbench.decoding.model_drafter import ModelDrafter

    model = tiny_random_model("llama", seed=1, num_layers=1)
    drafter = ModelDrafter(model, model.config.vocab_size)
    schedule = RecordingSchedule(flat_profile(c=0.0, slope=0.0), max_gamma=4, learn_costs=learn_costs)
    result = engine(drafter, schedule=schedule).generate([PROMPTS[1]])[0]
    assert result.output_ids == hf_greedy(PROMPTS[1], 20)
    if not learn_costs:
        assert schedule.reports == []
        return
    assert [(cols, fwd) for cols, _, fwd, _ in schedule.reports] == [
        (r.drafted + 1, r.draft_forwards) for r in result.rounds
    ]
    assert all(t > 0 and d >= 0 for _, t, _, d in schedule.reports)
    assert schedule.costs.rounds == len(result.rounds)
    # the draft times reported are the rounds' own
    assert [d for *_, d in schedule.reports] == pytest.approx([r.draft_time for r in result.rounds])


def test_learned_costs_stay_lossless_with_a_lookup_drafter_at_batch_4():
    schedule = CostAwareSchedule(flat_profile(c=0.0, slope=0.2), max_gamma=6)
    results = engine(PeekDrafter(0.005), schedule=schedule).generate(PROMPTS)
    for prompt, result in zip(PROMPTS, results):
        assert result.output_ids == hf_greedy(prompt, 20)
    assert schedule.costs.rounds > 0 and math.isfinite(schedule.costs.load_scale)
