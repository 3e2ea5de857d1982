"""The small-batch LM head: (W @ xᵀ)ᵀ for 2..64 float32 rows on a CPU, F.linear otherwise, same results.

Where the small-linear kernel is built it takes 1..12 rows first (tests/test_small_linear.py); the tests of
the torch products here switch it off."""

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specbench.decoding import GenerationSettings, SpeculativeEngine
from specbench.decoding.model_drafter import ModelDrafter
from specbench.models import ModelSpec, load_verifier, small_linear
from specbench.models.small_batch_lm_head import MAX_ROWS, SmallBatchLinear, use_small_batch_lm_head
from specbench.models.tiny import tiny_random_model


@pytest.fixture
def torch_products(monkeypatch):
    monkeypatch.setattr(small_linear, "kernel", lambda: None)


def _linear(out_features=300, in_features=48, bias=False, seed=0) -> SmallBatchLinear:
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    layer.__class__ = SmallBatchLinear
    return layer


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 2), (1, 5), (4, 3), (2, 32), (1, MAX_ROWS)])
def test_few_rows_take_the_transposed_product_and_match_f_linear(shape, bias, torch_products):
    layer = _linear(bias=bias)
    x = torch.randn(*shape, layer.in_features)
    got = layer(x)
    rows = x.reshape(-1, layer.in_features)
    transposed = (layer.weight @ rows.T).T + (layer.bias if bias else 0)
    assert got.shape == (*shape, layer.out_features)
    assert torch.equal(got, transposed.reshape(got.shape))
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1), (1, 1, 1), (1, MAX_ROWS + 1), (0, 4)])
def test_one_row_many_rows_and_no_rows_keep_f_linear_exactly(shape, torch_products):
    layer = _linear(bias=True)
    x = torch.randn(*shape, layer.in_features)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_bf16_rows_take_the_row_invariant_transposed_product():
    layer = _linear().to(torch.bfloat16)
    x = torch.randn(1, 4, layer.in_features, dtype=torch.bfloat16)
    assert torch.equal(layer(x), (layer.weight @ x[0].T).T[None])
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=0.02, atol=0.02)


def test_gradients_match_f_linear():
    layer = _linear(bias=True)
    x = torch.randn(1, 4, layer.in_features, requires_grad=True)
    layer(x).square().sum().backward()
    fast = (x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())
    x.grad = layer.weight.grad = layer.bias.grad = None
    F.linear(x, layer.weight, layer.bias).square().sum().backward()
    for a, b in zip(fast, (x.grad, layer.weight.grad, layer.bias.grad)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_model_keeps_its_tied_weights_state_dict_and_logits():
    model = tiny_random_model(seed=3).eval()
    model.get_output_embeddings().weight = model.get_input_embeddings().weight  # tied, as SmolLM2's
    ids = torch.randint(0, 320, (2, 7))
    with torch.no_grad():
        before = model(ids).logits
    keys = list(model.state_dict())
    assert use_small_batch_lm_head(model)
    head = model.get_output_embeddings()
    assert type(head) is SmallBatchLinear
    assert head.weight is model.get_input_embeddings().weight
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        torch.testing.assert_close(model(ids[:1, :4]).logits, before[:1, :4], rtol=1e-5, atol=1e-5)
    clone = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (clone, loaded):
        assert type(other.get_output_embeddings()) is SmallBatchLinear
        with torch.no_grad():
            torch.testing.assert_close(other(ids).logits, before, rtol=1e-5, atol=1e-5)


def test_loaded_models_get_it_and_greedy_speculative_decoding_stays_identical():
    verifier = load_verifier(ModelSpec(kind="tiny_random", seed=5, num_layers=3), device="cpu", dtype="fp32")
    assert type(verifier.model.get_output_embeddings()) is SmallBatchLinear
    drafter = tiny_random_model(seed=6).eval()
    common = {"settings": GenerationSettings(max_new_tokens=24), "vocab_size": 320, "eos_token_ids": []}
    prompts = [[5, 9, 33, 70, 12], [101, 7]]
    reference = [r.output_ids for r in SpeculativeEngine(verifier.model, None, **common).generate(prompts)]
    speculative = SpeculativeEngine(verifier.model, ModelDrafter(drafter, 320), **common).generate(prompts)
    assert [r.output_ids for r in speculative] == reference
    assert any(round_.drafted > 0 for r in speculative for round_ in r.rounds)
