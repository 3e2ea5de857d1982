"""SD² steering (methods.md §4): zero-init identity, hooks that change the drafter, decoding alignment."""

from __future__ import annotations

import functools

import pytest
import torch

from specbench.decoding import DraftSchedule, GenerationSettings, SpeculativeEngine
from specbench.decoding.model_drafter import ModelDrafter
from specbench.drafters.sd2 import SD2Drafter
from specbench.drafters.steering import SteeredDrafter, SteeringHead, resolve_spec, verifier_features
from specbench.models.early_exit import early_exit_drafter
from specbench.models.taps import record_states
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model

PROMPTS = [[65], [72, 101, 108], [1, 2, 3, 4, 5, 6], [200, 17, 99, 3, 45, 250, 11, 8, 77]]


@functools.cache
def pair(arch: str):
    verifier = tiny_random_model(arch, seed=0, num_layers=4)
    drafter = tiny_random_model(arch, seed=1, num_layers=2)
    return verifier, drafter


def steered(arch="llama", guide="merged", d_layers="all", rank=None, scale=0.0, drafter=None, seed=0):
    verifier, default_drafter = pair(arch)
    drafter = drafter if drafter is not None else default_drafter
    spec = resolve_spec(verifier, drafter, [1, 2, 4], guide, d_layers, rank)
    module = SteeredDrafter(drafter, spec)
    if scale:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            w = module.head.project.weight
            w.copy_(torch.randn(w.shape, generator=g) * scale)
    return verifier, drafter, module


def features_for(verifier, ids):
    """Every tap of the verifier (the convention of specbench.models.taps) for ``ids``."""
    with record_states(verifier, range(verifier.config.num_hidden_layers + 1)) as states:
        verifier(input_ids=ids)
    return states.taps


def test_fusion_starts_as_the_plain_sum_and_projection_at_zero():
    head = SteeringHead(verifier_hidden=8, num_features=3, num_layers=2, out_size=5)
    x = torch.randn(4, 24)
    fused = head.fusion(x)
    torch.testing.assert_close(fused, x[:, :8] + x[:, 8:16] + x[:, 16:])
    assert torch.count_nonzero(head(x)) == 0
    assert head(x).shape == (4, 2, 5)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("guide", ["merged", "simple"])
@pytest.mark.parametrize("rank", [None, 4])
def test_zero_initialised_steering_leaves_the_drafter_logits_exactly_unchanged(arch, guide, rank):
    verifier, drafter, module = steered(arch, guide, rank=rank)
    ids = torch.tensor([PROMPTS[3]])
    try:
        plain = drafter(input_ids=ids).logits
        feats = verifier_features(features_for(verifier, ids), module.spec.v_layers)
        with module.steer(module.deltas(feats)):
            steered_logits = drafter(input_ids=ids).logits
        assert torch.equal(plain, steered_logits)
    finally:
        module.remove()


@pytest.mark.parametrize("guide", ["merged", "simple"])
def test_non_zero_projection_changes_the_drafter_logits_only_inside_steer(guide):
    verifier, drafter, module = steered("llama", guide, scale=0.5)
    ids = torch.tensor([PROMPTS[3]])
    try:
        plain = drafter(input_ids=ids).logits
        feats = verifier_features(features_for(verifier, ids), module.spec.v_layers)
        with module.steer(module.deltas(feats)):
            changed = drafter(input_ids=ids).logits
        assert not torch.allclose(plain, changed, atol=1e-4)
        assert torch.equal(drafter(input_ids=ids).logits, plain)  # hooks are inert outside steer()
    finally:
        module.remove()


def test_merged_offset_enters_the_up_projection_as_methods_md_says():
    """MLP(x) = down(act(gate(x)) * (up(x) + delta)) for a steered layer, checked by hand on layer 0."""
    _verifier, drafter, module = steered("llama", "merged", d_layers=[0], scale=0.5)
    mlp = drafter.model.layers[0].mlp
    x = torch.randn(1, 3, drafter.config.hidden_size)
    delta = torch.randn(1, 1, mlp.up_proj.out_features)
    try:
        with module.steer(delta):
            got = mlp(x)
        want = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * (mlp.up_proj(x) + delta[:, 0]))
        torch.testing.assert_close(got, want)
        untouched = drafter.model.layers[1].mlp
        with module.steer(delta):
            y = untouched(x)
        torch.testing.assert_close(y, untouched(x))
    finally:
        module.remove()


def test_early_exit_drafter_steering_never_reaches_the_verifier():
    verifier = tiny_random_model("llama", seed=3, num_layers=4)
    drafter = early_exit_drafter(verifier, 2)
    spec = resolve_spec(verifier, drafter, [1, 2, 3])
    module = SteeredDrafter(drafter, spec)
    torch.nn.init.normal_(module.head.project.weight, std=0.5)
    ids = torch.tensor([PROMPTS[2]])
    try:
        before = verifier(input_ids=ids).logits
        deltas = module.deltas(torch.randn(1, 3 * verifier.config.hidden_size))
        with module.steer(deltas):
            drafted = drafter(input_ids=ids).logits
        assert torch.equal(verifier(input_ids=ids).logits, before)
        assert not torch.allclose(drafted, drafter(input_ids=ids).logits, atol=1e-4)
    finally:
        module.remove()


def test_bad_steering_settings_name_the_key():
    verifier, drafter = pair("llama")
    with pytest.raises(ValueError, match="steering.v_layers"):
        resolve_spec(verifier, drafter, [1, 2, 9])
    with pytest.raises(ValueError, match="steering.v_layers"):
        resolve_spec(verifier, drafter, [2, 1, 3])
    with pytest.raises(ValueError, match="steering.d_layers"):
        resolve_spec(verifier, drafter, [1, 2, 3], d_layers=[5])


def engine(verifier, drafter, steering, gamma, settings=None, batch=False):
    return SpeculativeEngine(
        verifier,
        SD2Drafter(steering) if steering is not None else ModelDrafter(drafter),
        schedule=DraftSchedule("constant", gamma),
        settings=settings or GenerationSettings(max_new_tokens=24),
        eos_token_ids=[EOS_ID],
        pad_token_id=PAD_ID,
    )


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_decoding_with_non_zero_steering_equals_the_verifier(arch, gamma):
    verifier, drafter, module = steered(arch, scale=0.3)
    try:
        for prompt in PROMPTS:
            want = verifier.generate(
                torch.tensor([prompt]),
                max_new_tokens=24,
                do_sample=False,
                eos_token_id=EOS_ID,
                pad_token_id=PAD_ID,
            )[0, len(prompt) :].tolist()
            got = engine(verifier, drafter, module, gamma).generate([prompt])[0].output_ids
            assert got == want
        batch = engine(verifier, drafter, module, gamma).generate(PROMPTS)
        singles = [engine(verifier, drafter, module, gamma).generate([p])[0].output_ids for p in PROMPTS]
        assert [r.output_ids for r in batch] == singles
    finally:
        module.remove()


def test_steering_changes_drafts_and_zero_steering_changes_nothing():
    twin = tiny_random_model("llama", seed=0, num_layers=4)  # the verifier's twin: every draft accepted
    verifier, drafter, module = steered("llama", scale=0.0, drafter=twin)
    try:
        plain = engine(verifier, drafter, None, 3).generate(PROMPTS)
        zero = engine(verifier, drafter, module, 3).generate(PROMPTS)
        assert [[(r.drafted, r.accepted) for r in s.rounds] for s in plain] == [
            [(r.drafted, r.accepted) for r in s.rounds] for s in zero
        ]
        torch.nn.init.normal_(module.head.project.weight, std=2.0)
        steered_run = engine(verifier, drafter, module, 3).generate(PROMPTS)
        assert [r.output_ids for r in steered_run] == [r.output_ids for r in plain]
        assert [[r.accepted for r in s.rounds] for s in steered_run] != [
            [r.accepted for r in s.rounds] for s in plain
        ]
    finally:
        module.remove()


class RecordingSteering(SteeredDrafter):
    """Records each round's steering source so the test can check which verifier state it came from."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sources = []

    def deltas(self, features, mask=None):
        self.sources.append((features.clone(), None if mask is None else mask.clone()))
        return super().deltas(features, mask)


def test_decoding_steers_each_round_with_the_state_of_the_last_accepted_token():
    """Round r's source = verifier hidden states (v_layers) at the position whose input is the last token
    accepted before it, i.e. the token just before the round's first drafted position."""
    verifier, drafter = pair("llama")
    spec = resolve_spec(verifier, drafter, [1, 2, 4])
    module = RecordingSteering(drafter, spec)
    prompt = PROMPTS[3]
    try:
        result = engine(verifier, drafter, module, 3).generate([prompt])[0]
        full = torch.tensor([prompt + result.output_ids])
        feats = verifier_features(features_for(verifier, full), spec.v_layers)[0]
        position = len(prompt) - 1  # input position of the token that round 1 drafts from
        for record, (source, mask) in zip(result.rounds, module.sources):
            assert bool(mask.all())
            torch.testing.assert_close(source[0], feats[position - 1], atol=1e-4, rtol=1e-4)
            position += record.emitted
    finally:
        module.remove()
