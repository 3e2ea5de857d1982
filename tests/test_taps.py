"""One hidden-state convention for every consumer (SD² features, DIVERSED inputs, EAGLE taps).

Tap i is the residual stream after i decoder layers, before the final norm; the last hidden state is the
LM head's input. Checked against the model's own forward: its ``hidden_states`` (pre-norm for i < L),
``last_hidden_state`` (= norm(tap L)) and logits (= lm_head(last hidden state)), on tiny models with
non-unit norm weights (where a norm applied twice changes the numbers) and on the embedded SmolLM2.
"""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.cache import CachedModel
from specbench.models.early_exit import early_exit_drafter
from specbench.models.taps import check_taps, record_states
from specbench.models.tiny import tiny_random_model

IDS = torch.tensor([[5, 9, 33, 71, 12, 8, 140, 2]])


def check_convention(model, ids, atol=1e-5):
    depth = model.config.num_hidden_layers
    with torch.no_grad():
        reference = model(input_ids=ids, output_hidden_states=True)
        base = model.base_model(input_ids=ids)
        with record_states(model, range(depth + 1), last=True) as states:
            logits = model(input_ids=ids).logits
    for i in range(depth):
        torch.testing.assert_close(states.taps[i], reference.hidden_states[i], atol=atol, rtol=0)
    torch.testing.assert_close(
        model.base_model.norm(states.taps[depth]), base.last_hidden_state, atol=atol, rtol=0
    )
    torch.testing.assert_close(states.last, base.last_hidden_state, atol=atol, rtol=0)
    torch.testing.assert_close(model.lm_head(states.last), logits, atol=atol, rtol=0)
    # The final norm is not idempotent on these weights: normalising twice would be visible.
    assert (model.base_model.norm(states.last) - states.last).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_taps_and_last_hidden_state_follow_the_convention_on_tiny_models(arch):
    check_convention(tiny_random_model(arch, seed=3, num_layers=3), IDS)


def test_cached_model_hidden_gives_the_logits_through_the_lm_head():
    model = tiny_random_model("llama", seed=3, num_layers=3)
    cached = CachedModel(model, 259)
    cached.reset(1)
    out = cached.forward(IDS, output_hidden=True, output_taps=(0, 3))
    torch.testing.assert_close(model.lm_head(out.hidden)[..., :259], out.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.base_model.norm(out.taps[3]), out.hidden, atol=1e-5, rtol=0)


def test_an_early_exit_drafter_sharing_layers_records_nothing_into_the_verifier_taps():
    verifier = tiny_random_model("llama", seed=3, num_layers=3)
    drafter = early_exit_drafter(verifier, 1)
    with torch.no_grad(), record_states(verifier, (1,)) as states:
        verifier(input_ids=IDS)
    kept = states.taps[1]
    with torch.no_grad():
        drafter(input_ids=IDS[:, :3])  # outside the block: the hooks are gone
    assert states.taps[1] is kept and kept.shape[1] == IDS.shape[1]


def test_tap_indices_are_checked_against_the_depth():
    model = tiny_random_model("llama", seed=3, num_layers=3)
    assert check_taps(model, [0, 3]) == (0, 3)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        check_taps(model, [4], key="steering.v_layers")


@pytest.mark.slow
def test_taps_and_last_hidden_state_follow_the_convention_on_smollm2(smollm2):
    ids = smollm2.tokenizer("What is the capital of France?", return_tensors="pt").input_ids
    check_convention(smollm2.model, ids, atol=2e-4)
