"""Greedy static ensemble == HF transformers' ``assistant_ensemble_weight`` (methods.md §2.1).

HF (``generation/utils.py``, assisted decoding, greedy branch) accepts drafts while they equal
argmax(ν) with ν = a·p + (1 − a)·q, a = ``assistant_ensemble_weight`` (weight of the *target*), takes the
first mismatch's argmax ν as the correction and argmax p as the bonus. ``num_assistant_tokens``,
``num_assistant_tokens_schedule`` and ``assistant_confidence_threshold`` are read from the *drafter's*
generation_config (``candidate_generator.AssistedCandidateGenerator``); a threshold of 0 disables the
confidence stopping criterion and its online re-fitting. Our draft weight w is HF's 1 − a.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from specbench.decoding import DraftSchedule, EnsembleRule, GenerationSettings, SpeculativeEngine
from specbench.decoding.model_drafter import ModelDrafter
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model

MAX_NEW = 24
PROMPTS = [[72, 101, 108, 108, 111], [200, 17, 99, 3, 45, 250, 11, 8, 77], [65]]



@functools.cache
def pair(arch: str, drafter_kind: str):
    verifier = tiny_random_model(arch, seed=0)
    if drafter_kind == "independent":
        drafter = tiny_random_model(arch, seed=1, num_layers=1)
    else:
        drafter = copy.deepcopy(verifier)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in drafter.parameters():
                param.add_(torch.randn(param.shape, generator=g) * 0.02)
    return verifier, drafter


def hf_ensemble(verifier, drafter, prompt, gamma, draft_weight, eos=EOS_ID, hf_settings=None):
    drafter = copy.deepcopy(drafter)  # HF reads (and may update) the drafter's generation_config
    settings = hf_settings or {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant"}
    settings = {
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
        **settings,
    }
    for key, value in settings.items():
        setattr(drafter.generation_config, key, value)
    kwargs = {} if draft_weight == 0 else {"assistant_ensemble_weight": 1.0 - draft_weight}
    out = verifier.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        assistant_model=drafter,
        do_sample=False,
        max_new_tokens=MAX_NEW,
        eos_token_id=eos,
        pad_token_id=PAD_ID,
        **kwargs,
    )
    return out[0, len(prompt):].tolist()


def ours(verifier, drafter, prompts, gamma, draft_weight, eos=(EOS_ID,), schedule=None):
    engine = SpeculativeEngine(
        verifier, ModelDrafter(drafter), rule=EnsembleRule(draft_weight, "linear"),
        schedule=schedule or DraftSchedule("constant", gamma),
        settings=GenerationSettings(max_new_tokens=MAX_NEW), eos_token_ids=eos, pad_token_id=PAD_ID,
    )
    return engine.generate(prompts)


CASES = [("llama", "independent", 3), ("qwen3", "perturbed", 4), ("llama", "perturbed", 2)]


@pytest.mark.parametrize("arch,drafter_kind,gamma", CASES)
@pytest.mark.parametrize("draft_weight", [0.2, 0.5, 0.8])
def test_static_ensemble_greedy_matches_hf(arch, drafter_kind, gamma, draft_weight):
    """Batch 1, as HF assisted generation supports only that."""
    verifier, drafter = pair(arch, drafter_kind)
    for prompt in PROMPTS:
        expected = hf_ensemble(verifier, drafter, prompt, gamma, draft_weight)
        got = ours(verifier, drafter, [prompt], gamma, draft_weight)[0]
        assert got.output_ids == expected, (prompt, got.output_ids, expected)


@pytest.mark.parametrize("arch,drafter_kind", [("llama", "independent"), ("qwen3", "perturbed")])
def test_the_oracle_comparison_is_not_vacuous(arch, drafter_kind):
    """The ensemble changes the output (vs plain greedy) and different weights give different outputs."""
    verifier, drafter = pair(arch, drafter_kind)
    # A batch of prompts of different lengths (gives what each prompt gives alone: see the test above).
    outputs = {w: [r.output_ids for r in ours(verifier, drafter, PROMPTS, 4, w)] for w in (0.0, 0.5, 0.8)}
    for prompt, out in zip(PROMPTS, outputs[0.8]):
        assert out == ours(verifier, drafter, [prompt], 4, 0.8)[0].output_ids
    assert outputs[0.8] != outputs[0.0]
    assert outputs[0.5] != outputs[0.0] or outputs[0.8] != outputs[0.5]
    # w = 0 is exact SD: HF's plain assisted greedy.
    for prompt, out in zip(PROMPTS, outputs[0.0]):
        assert out == hf_ensemble(verifier, drafter, prompt, 4, 0.0)


def test_static_ensemble_stops_at_eos_like_hf():
    """An EOS id that the ensemble output produces mid-way (so drafts and corrections can both be EOS)."""
    verifier, drafter = pair("qwen3", "perturbed")
    prompt = PROMPTS[0]
    plain = [r.output_ids for r in ours(verifier, drafter, PROMPTS, 3, 0.5, eos=())]
    eos = next(t for i, t in enumerate(plain[0]) if i >= 4 and t not in plain[0][:i])
    for prompt in PROMPTS:
        expected = hf_ensemble(verifier, drafter, prompt, 3, 0.5, eos=eos)
        assert ours(verifier, drafter, [prompt], 3, 0.5, eos=(eos,))[0].output_ids == expected
    assert hf_ensemble(verifier, drafter, PROMPTS[0], 3, 0.5, eos=eos)[-1] == eos


@pytest.mark.parametrize("schedule", ["heuristic", "dynamic"])
def test_static_ensemble_schedules_match_hf(schedule, monkeypatch):
    """With w > 0 the round boundaries change the output, so the schedules must match HF's exactly.

    heuristic = HF ``num_assistant_tokens_schedule="heuristic"`` (fresh per call); dynamic = HF's
    ``assistant_confidence_threshold`` stopping criterion with its online threshold re-fitting disabled
    (HF re-fits whenever scikit-learn is importable; methods.md §3.1 says we do not).
    """
    from transformers.generation import candidate_generator

    monkeypatch.setattr(candidate_generator, "is_sklearn_available", lambda: False)
    verifier, drafter = pair("llama", "perturbed")
    if schedule == "heuristic":
        ours_schedule = DraftSchedule("heuristic", gamma=2)
        hf_settings = {"num_assistant_tokens": 2, "num_assistant_tokens_schedule": "heuristic"}
    else:
        # Tiny random drafters are unconfident (max q ≈ 0.2): a low threshold makes the length vary.
        ours_schedule = DraftSchedule("dynamic", gamma=1, max_gamma=5, confidence_threshold=0.1)
        hf_settings = {"num_assistant_tokens": 5, "assistant_confidence_threshold": 0.1}
    drafted = set()
    for prompt in PROMPTS:
        expected = hf_ensemble(verifier, drafter, prompt, None, 0.5, hf_settings=hf_settings)
        result = ours(verifier, drafter, [prompt], None, 0.5, schedule=ours_schedule)[0]
        assert result.output_ids == expected
        drafted |= {r.drafted for r in result.rounds}
    assert len(drafted) >= 3  # the draft length really varied
