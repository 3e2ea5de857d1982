"""The compiled float32 few-row linear layer: F.linear's results within rounding, the same bits for a row
alone or among others, the fallback without a compiler, and the loaders' layers calling it."""

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specbench.models import ModelSpec, exact_attention, load_verifier, small_linear
from specbench.models.row_invariant import RowInvariantLinear
from specbench.models.small_batch_lm_head import SmallBatchLinear

pytestmark = pytest.mark.skipif(small_linear.kernel() is None, reason="no C compiler here")

# (outputs, inputs): SmolLM2-135M's k/v and down projections, and widths that are not multiples of 8
SHAPES = [(192, 576), (576, 1536), (37, 100), (5, 3), (300, 48)]


def _weights(outs: int, width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(outs, width, generator=generator) * width**-0.5 + 0.1  # non-zero mean: no cancelling
    return weight, torch.randn(outs, generator=generator)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 12, 13, 30])
@pytest.mark.parametrize("shape", SHAPES)
def test_it_matches_f_linear_within_float32_rounding(shape, rows, bias):
    weight, b = _weights(*shape)
    b = b if bias else None
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows)) * 3
    got = small_linear.linear(x, weight, b)
    assert got.shape == (rows, shape[0]) and got.dtype == torch.float32
    exact = F.linear(x.double(), weight.double(), None if b is None else b.double()).float()
    torch.testing.assert_close(got, exact, rtol=1e-5, atol=1e-5 * shape[1] ** 0.5)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_row_gets_the_same_bits_alone_and_among_any_other_rows(shape):
    weight, bias = _weights(*shape, seed=1)
    x = torch.randn(30, shape[1], generator=torch.Generator().manual_seed(2))
    alone = torch.cat([small_linear.linear(x[m : m + 1], weight, bias) for m in range(30)])
    for rows in range(2, 31):  # 13..30 rows go through the weights in groups of 12: the same arithmetic
        block = small_linear.linear(x[:rows], weight, bias)
        assert torch.equal(block, alone[:rows]), rows
    shifted = small_linear.linear(x[5:9], weight, bias)  # a row at another place in the block
    assert torch.equal(shifted, alone[5:9])


def test_strided_and_batched_inputs_are_read_as_f_linear_reads_them():
    weight, bias = _weights(64, 96)
    x = torch.randn(2, 3, 200)[..., 10:106]  # rows with a stride of 200, last dimension contiguous
    got = small_linear.linear(x, weight, bias)
    assert got.shape == (2, 3, 64)
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    column = torch.randn(96, 4).T  # last dimension strided: copied first
    got = small_linear.linear(column, weight)
    torch.testing.assert_close(got, F.linear(column, weight), rtol=1e-5, atol=1e-5)


def test_it_applies_to_few_float32_cpu_rows_on_one_thread_without_gradients():
    weight, bias = _weights(16, 32)
    x = torch.randn(4, 32)
    assert small_linear.applies(x, weight, bias)
    assert small_linear.applies(x[:1], weight, None)
    assert not small_linear.applies(torch.randn(small_linear.MAX_ROWS + 1, 32), weight, bias)
    assert not small_linear.applies(torch.randn(0, 32), weight, bias)
    assert not small_linear.applies(x.bfloat16(), weight.bfloat16(), None)
    assert not small_linear.applies(x.double(), weight.double(), None)
    assert not small_linear.applies(x.requires_grad_(), weight, bias)
    with torch.no_grad():
        assert small_linear.applies(x, weight, bias)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert not small_linear.applies(x, weight, bias)
    finally:
        torch.set_num_threads(previous)


def test_the_layers_use_it_for_float32_rows_and_keep_f_linear_otherwise(monkeypatch):
    calls = []
    monkeypatch.setattr(small_linear, "linear", lambda *a: calls.append(a) or F.linear(*a))
    for cls in (RowInvariantLinear, SmallBatchLinear):
        layer = nn.Linear(32, 24)
        layer.__class__ = cls
        with torch.no_grad():
            for rows in (1, 4, 12):
                layer(torch.randn(1, rows, 32))
            layer(torch.randn(13, 32))
        layer(torch.randn(4, 32, requires_grad=True)).sum().backward()  # training: autograd's F.linear
        assert layer.weight.grad is not None
    assert len(calls) == 2 * 3


def test_loaded_float32_models_call_it_in_every_linear_layer_and_the_lm_head(monkeypatch):
    verifier = load_verifier(ModelSpec(kind="tiny_random", seed=5, num_layers=2), device="cpu", dtype="fp32")
    model = verifier.model
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert all(type(m) in (RowInvariantLinear, SmallBatchLinear) for m in linears)
    assert type(model.get_output_embeddings()) is SmallBatchLinear
    weights = []
    real = small_linear.linear
    monkeypatch.setattr(small_linear, "linear", lambda x, w, b=None: weights.append(w) or real(x, w, b))
    ids = torch.randint(0, 320, (1, 4))
    with torch.no_grad():
        logits = model(ids).logits
    assert {id(w) for w in weights} == {id(m.weight) for m in linears}
    monkeypatch.setattr(small_linear, "kernel", lambda: None)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, logits, rtol=1e-4, atol=1e-4)


def test_the_build_is_named_by_its_source_next_to_the_attention_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_KERNEL_DIR", str(tmp_path))
    built = exact_attention._build(shutil.which("cc") or shutil.which("gcc"), small_linear.SOURCE)
    assert built.parent == tmp_path and built.name.startswith("small_linear-") and built.suffix == ".so"


@pytest.mark.parametrize("how", ["no compiler", "switched off"])
def test_without_it_one_line_is_printed_and_the_layers_keep_torch(how, monkeypatch, capsys):
    if how == "no compiler":
        monkeypatch.setenv("CC", "/nonexistent/cc")
    else:
        monkeypatch.setenv("SPECBENCH_SMALL_LINEAR", "torch")
    small_linear.kernel.cache_clear()
    try:
        assert small_linear.kernel() is None
        lines = capsys.readouterr().err.strip().splitlines()
        if how == "no compiler":
            assert len(lines) == 1 and "small-batch linear kernel not built" in lines[0]
            assert "install gcc" in lines[0]
        layer = nn.Linear(40, 24)
        layer.__class__ = RowInvariantLinear
        x = torch.randn(3, 40)
        with torch.no_grad():
            assert not small_linear.applies(x, layer.weight, layer.bias)
            assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    finally:
        monkeypatch.delenv("CC", raising=False)
        monkeypatch.delenv("SPECBENCH_SMALL_LINEAR", raising=False)
        small_linear.kernel.cache_clear()
    assert small_linear.kernel() is not None
