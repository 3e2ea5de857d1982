"""schedule=cost_aware's cost profiles are measured once per machine, dtype, thread count and pair, then read
back from the cache; a damaged or foreign entry is measured again."""

from __future__ import annotations

import json

import pytest
import torch

from specbench import evaluation
from specbench.decoding import DraftSchedule, GenerationSettings, VerificationRule, cost_cache
from specbench.decoding.cost import CostProfile
from specbench.decoding.cost_aware import CostAwareSchedule
from specbench.decoding.cost_cache import cache_root, cached_profile, profile_identity, profile_path
from specbench.models import ModelSpec, load_verifier
from specbench.pairs import load_drafter


class Counting:
    """A measurement that counts its calls and returns a new profile each time."""

    def __init__(self):
        self.calls = 0

    def __call__(self) -> CostProfile:
        self.calls += 1
        return CostProfile([1.0, 1.5 + self.calls, 2.0 + self.calls], 0.1 * self.calls, dtype="float32")


IDENTITY = {"machine": {"cpu": "test"}, "dtype": "float32", "verifier": "v", "max_n": 3}


def test_first_use_measures_and_later_uses_read_the_cache(tmp_path):
    measure = Counting()
    first, path, hit = cached_profile(IDENTITY, measure, root=tmp_path)
    assert (measure.calls, hit) == (1, False) and path.parent == tmp_path and path.exists()
    again, same_path, hit = cached_profile(IDENTITY, measure, root=tmp_path)
    assert (measure.calls, hit, same_path) == (1, True, path)
    assert again.verify_ms == first.verify_ms and again.draft_ms == first.draft_ms
    fresh, _, hit = cached_profile(IDENTITY, measure, refresh=True, root=tmp_path)
    assert (measure.calls, hit) == (2, False) and fresh.verify_ms != first.verify_ms
    assert cached_profile(IDENTITY, measure, root=tmp_path)[0].verify_ms == fresh.verify_ms  # replaced


def test_another_dtype_or_thread_count_is_another_entry(tmp_path):
    measure = Counting()
    cached_profile(IDENTITY, measure, root=tmp_path)
    for changed in ({**IDENTITY, "dtype": "bfloat16"}, {**IDENTITY, "threads": 2}):
        _, path, hit = cached_profile(changed, measure, root=tmp_path)
        assert not hit and path != profile_path(IDENTITY, tmp_path)
    assert measure.calls == 3 and len(list(tmp_path.glob("*.json"))) == 3


def test_a_damaged_or_foreign_entry_is_measured_again_and_named(tmp_path, capsys):
    measure = Counting()
    _, path, _ = cached_profile(IDENTITY, measure, root=tmp_path)
    path.write_text('{"identity": ')  # a killed writer of another tool, a full disk
    profile, _, hit = cached_profile(IDENTITY, measure, root=tmp_path)
    assert not hit and measure.calls == 2 and str(path) in capsys.readouterr().err
    assert json.loads(path.read_text())["profile"]["verify_ms"] == profile.verify_ms  # rewritten whole
    data = json.loads(path.read_text())
    data["identity"] = {**IDENTITY, "dtype": "bfloat16"}  # copied from another machine
    path.write_text(json.dumps(data))
    assert not cached_profile(IDENTITY, measure, root=tmp_path)[2] and measure.calls == 3
    assert "another machine" in capsys.readouterr().err


def test_build_engines_measures_the_pair_once_then_reads_it(monkeypatch, capsys):
    verifier = load_verifier(ModelSpec(kind="tiny_random", seed=0), "cpu", "float32")
    drafter = load_drafter(ModelSpec(kind="tiny_random", seed=1, num_layers=1), verifier, "cpu", "float32")
    schedule, settings = DraftSchedule("cost_aware", max_gamma=3), GenerationSettings(max_new_tokens=4)
    calls = []
    real = evaluation.measure_profile
    monkeypatch.setattr(evaluation, "measure_profile", lambda *a, **k: calls.append(1) or real(*a, **k))
    engines = [build(verifier, drafter, schedule, settings) for _ in range(2)]
    assert len(calls) == 1  # the second build read the first one's measurement
    first, second = (engine.schedule.profile for engine in engines)
    assert isinstance(engines[1].schedule, CostAwareSchedule) and first.verify_ms == second.verify_ms
    assert first.max_n == 4 and first.dtype == "float32"
    err = capsys.readouterr().err
    assert "measured, cached in" in err and "read from" in err and str(cache_root()) in err
    build(verifier, drafter, schedule, settings, profile="measure")
    assert len(calls) == 2  # schedule.profile=measure measures again


def build(verifier, drafter, schedule, settings, profile=None):
    rule = VerificationRule()
    return evaluation.build_engines(verifier, drafter, rule, schedule, settings, False, None, profile)[0]


def test_the_identity_names_what_changes_a_forwards_cost():
    verifier = load_verifier(ModelSpec(kind="tiny_random", seed=0), "cpu", "float32")
    identity = profile_identity(verifier, None, 4, 256)
    assert identity["dtype"] == "float32" and identity["device"] == "cpu" and identity["max_n"] == 4
    assert identity["threads"] == torch.get_num_threads() and identity["machine"]["cores"] >= 1
    assert identity["verifier_parameters"] == sum(p.numel() for p in verifier.model.parameters())
    json.dumps(identity)  # stored as JSON


def test_a_profile_timed_with_other_cpu_kernels_is_not_reused(tmp_path, monkeypatch):
    """v(n) moves with the products a forward runs through: a profile timed with the few-row float32 kernel
    is not read back once the kernel is switched off (or its source changes), and the reverse."""
    from specbench.models import small_linear

    if small_linear.kernel() is None:
        pytest.skip("no C compiler here: the few-row float32 kernel is not built")
    verifier = load_verifier(ModelSpec(kind="tiny_random", seed=0), "cpu", "float32")
    with_kernel = profile_identity(verifier, None, 4, 256)
    assert with_kernel["kernels"] == cost_cache.kernels_identity()
    assert len(with_kernel["kernels"]["small_linear"]) == 12  # the C source's hash
    monkeypatch.setattr(small_linear, "ENABLED", False)
    without = profile_identity(verifier, None, 4, 256)
    assert without["kernels"]["small_linear"] is None
    measure = Counting()
    cached_profile(with_kernel, measure, root=tmp_path)
    _, path, hit = cached_profile(without, measure, root=tmp_path)
    assert not hit and measure.calls == 2 and path != profile_path(with_kernel, tmp_path)
    edited = {**with_kernel, "kernels": {**with_kernel["kernels"], "small_linear": "0" * 12}}
    assert not cached_profile(edited, measure, root=tmp_path)[2] and measure.calls == 3
