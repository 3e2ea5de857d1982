"""The compiled row-invariant attention: a query's output has the same bits alone, among k queries or before
masked keys, at the verify shapes, in bf16 and float32; without a compiler the row-wise attention falls back
with one line."""

import shutil

import pytest
import torch

from specbench.models import exact_attention, row_invariant

pytestmark = pytest.mark.skipif(
    exact_attention.kernel() is None, reason="no C compiler here: the kernel is not built"
)


def _qkv(queries, keys, dtype, batch=1, heads=9, key_heads=3, dim=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, queries, dim, generator=g).to(dtype)
    k = torch.randn(batch, key_heads, keys, dim, generator=g).to(dtype)
    v = torch.randn(batch, key_heads, keys, dim, generator=g).to(dtype)
    return q, k, v


def _reference(q, k, v, allowed):
    """float64 attention, (B, Q, H, d)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = (q.double() @ k.transpose(-1, -2) * 0.125).masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def _causal(batch, queries, keys):
    last = keys - queries + torch.arange(queries)
    return (torch.arange(keys) <= last.unsqueeze(1)).expand(batch, 1, queries, keys).clone()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("queries,keys", [(1, 64), (2, 64), (4, 300), (9, 517), (16, 64), (16, 2048)])
def test_each_query_gets_the_bits_it_gets_alone(dtype, queries, keys):
    q, k, v = _qkv(queries, keys, dtype)
    block = exact_attention.exact_attention(q, k, v, None, 0.125)
    assert block.shape == (1, queries, 9, 64) and block.dtype == dtype
    for j in range(queries):
        seen = keys - queries + j + 1
        keys_seen, values_seen = k[:, :, :seen], v[:, :, :seen]
        alone = exact_attention.exact_attention(q[:, :, j : j + 1], keys_seen, values_seen, None, 0.125)
        assert torch.equal(alone[:, 0], block[:, j]), f"query {j} of {queries} over {keys} keys"
    tolerance = 0.02 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(block.double(), _reference(q, k, v, _causal(1, queries, keys)),
                               rtol=tolerance, atol=tolerance)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("keys", [64, 300, 700, 2048])
@pytest.mark.parametrize("queries", [1, 3, 4, 5, 16])
def test_a_query_alone_among_others_or_before_masked_keys_gets_the_same_bits(dtype, queries, keys):
    """Every row count and key count of the verify shapes (blocks of 1 to 16 queries, short to long caches):
    query j's output alone over its keys, in the block, and alone before 37 masked keys (holding anything,
    infinities and NaN included) are the same bits."""
    q, k, v = _qkv(queries, keys, dtype, seed=keys + queries)
    block = exact_attention.exact_attention(q, k, v, None, 0.125)
    junk_k, junk_v = (torch.full((1, 3, 37, 64), float("inf"), dtype=dtype) for _ in range(2))
    junk_v[..., ::2] = float("nan")
    for j in range(queries):
        seen = keys - queries + j + 1
        keys_seen, values_seen = k[:, :, :seen], v[:, :, :seen]
        one = q[:, :, j : j + 1]
        alone = exact_attention.exact_attention(one, keys_seen, values_seen, None, 0.125)
        allowed = torch.zeros(1, 1, 1, seen + 37, dtype=torch.bool)
        allowed[..., :seen] = True
        padded_k, padded_v = torch.cat((keys_seen, junk_k), 2), torch.cat((values_seen, junk_v), 2)
        before_masked = exact_attention.exact_attention(one, padded_k, padded_v, allowed, 0.125)
        assert torch.equal(alone[:, 0], block[:, j]), f"query {j} of {queries} over {keys} keys"
        assert torch.equal(before_masked, alone), f"query {j} of {queries} over {keys} keys, masked after"


def test_head_sizes_the_kernel_does_not_take_fall_back():
    q, k, v = _qkv(2, 40, torch.bfloat16, dim=48)
    assert not exact_attention.supports(q, k, v)
    assert exact_attention.supports(*_qkv(2, 40, torch.bfloat16, dim=128))
    out, _ = row_invariant.row_invariant_sdpa(row_invariant.nn.Module(), q, k, v, None, 48**-0.5)
    scores = q.double() @ k.double().repeat_interleave(3, 1).transpose(-1, -2) * 48**-0.5
    allowed = _causal(1, 2, 40)
    reference = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v.double().repeat_interleave(3, 1)
    torch.testing.assert_close(out.double(), reference.transpose(1, 2), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_mask_with_padding_and_holes_changes_nothing_for_the_keys_a_query_sees(dtype):
    q, k, v = _qkv(3, 50, dtype, batch=2)
    allowed = _causal(2, 3, 50)
    allowed[1, :, :, :9] = False  # left padding of the second row
    allowed[1, :, 2, 47] = False  # a tree node that does not see its sibling
    out = exact_attention.exact_attention(q, k, v, allowed, 0.125)
    seen = allowed[1, 0, 2].nonzero().squeeze(1)
    alone = exact_attention.exact_attention(q[1:, :, 2:], k[1:, :, seen], v[1:, :, seen], None, 0.125)
    assert torch.equal(alone[0, 0], out[1, 2])
    tolerance = 0.02 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), _reference(q, k, v, allowed), rtol=tolerance, atol=tolerance)


def test_a_fully_masked_row_gives_zeros_not_nan():
    q, k, v = _qkv(2, 20, torch.bfloat16)
    allowed = torch.zeros(1, 1, 2, 20, dtype=torch.bool)
    assert torch.equal(exact_attention.exact_attention(q, k, v, allowed, 0.125), torch.zeros(1, 2, 9, 64,
                                                                                            dtype=torch.bfloat16))


def test_the_row_wise_attention_calls_the_kernel_for_bf16_decoding_shapes():
    q, k, v = _qkv(5, 100, torch.bfloat16)
    out, _ = row_invariant.row_invariant_sdpa(row_invariant.nn.Module(), q, k, v, None, 0.125)
    assert torch.equal(out, exact_attention.exact_attention(q, k, v, None, 0.125))


def test_the_build_lands_under_the_kernel_dir_named_by_source_compiler_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_KERNEL_DIR", str(tmp_path))
    first = exact_attention._build(shutil.which("cc") or shutil.which("gcc"))
    assert first.parent == tmp_path and first.name.startswith("exact_attention-") and first.suffix == ".so"
    assert exact_attention._build(shutil.which("cc") or shutil.which("gcc")) == first
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no scratch left behind


def test_without_a_compiler_it_falls_back_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    exact_attention.kernel.cache_clear()
    try:
        assert exact_attention.kernel() is None
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "no C compiler" in lines[0] and "install gcc" in lines[0]
        q, k, v = _qkv(3, 40, torch.bfloat16)
        out, _ = row_invariant.row_invariant_sdpa(row_invariant.nn.Module(), q, k, v, None, 0.125)
        torch.testing.assert_close(out.double(), _reference(q, k, v, _causal(1, 3, 40)), rtol=0.02, atol=0.02)
    finally:
        monkeypatch.delenv("CC")
        exact_attention.kernel.cache_clear()
    assert exact_attention.kernel() is not None
