"""Row-invariant bf16 CPU forwards: a position's logits do not depend on how many positions share the forward.

That is what makes greedy speculative decoding in bf16 token-identical to autoregressive decoding: the
verifier scores a block of γ + 1 positions at once, autoregressive decoding one at a time.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specbench.decoding import GenerationSettings, SpeculativeEngine
from specbench.decoding.cache import CachedModel
from specbench.decoding.model_drafter import ModelDrafter
from specbench.models import ModelSpec, load_verifier, row_invariant, small_linear
from specbench.models.row_invariant import (
    MAX_TRANSPOSED_ROWS,
    ROWWISE_ATTENTION,
    RowInvariantLinear,
    row_invariant_sdpa,
    use_row_invariant_forwards,
)
from specbench.models.small_batch_lm_head import SmallBatchLinear
from specbench.models.tiny import tiny_random_model


class _Attention(nn.Module):
    """What attention functions read from a transformers attention module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _qkv(batch=2, heads=6, key_heads=2, queries=5, keys=40, dim=16, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, queries, dim, generator=g).to(dtype)
    k = torch.randn(batch, key_heads, keys, dim, generator=g).to(dtype)
    v = torch.randn(batch, key_heads, keys, dim, generator=g).to(dtype)
    return q, k, v


def _reference(q, k, v, allowed):
    """float64 softmax attention with a boolean (B, 1, Q, K) mask; (B, Q, H, d) like the functions."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def _causal(batch, queries, keys, padding=None):
    last = keys - queries + torch.arange(queries)
    allowed = (torch.arange(keys) <= last.unsqueeze(1)).expand(batch, 1, queries, keys).clone()
    if padding is not None:  # (B, K) valid key slots
        allowed &= padding[:, None, None, :]
    return allowed


@pytest.mark.parametrize("queries", [1, 2, 5])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_matches_exact_softmax_attention(queries, masked):
    q, k, v = _qkv(queries=queries)
    padding = torch.ones(2, 40, dtype=torch.bool)
    padding[1, :7] = False  # left padding in the second row
    allowed = _causal(2, queries, 40, padding if masked else None)
    out, weights = row_invariant_sdpa(_Attention(3), q, k, v, allowed if masked else None)
    assert weights is None and out.shape == (2, queries, 6, 16) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), _reference(q, k, v, allowed), rtol=0.02, atol=0.02)


def test_values_may_be_wider_than_queries_and_keys():
    q, k, _ = _qkv(queries=3, keys=40, dim=16)
    v = torch.randn(2, 2, 40, 24).to(torch.bfloat16)
    out, _ = row_invariant_sdpa(_Attention(3), q, k, v, None)
    assert out.shape == (2, 3, 6, 24)
    torch.testing.assert_close(out.double(), _reference(q, k, v, _causal(2, 3, 40)), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("queries", [2, 3, 4, 7, 8, 11, 17])
@pytest.mark.parametrize("keys", [30, 35, 41, 66, 130, 257, 1026, 1027, 1029, 1100, 2060])
def test_a_query_in_a_block_gets_the_bits_it_gets_alone(queries, keys):
    """Keys around 1024 are where the probability-value product's blocking changed with the number of keys on
    AMD EPYC (a block of 7 over 1026–1029 keys against its first query alone over 1020–1023 gave other bits);
    on Intel Xeon with AMX already a few dozen keys do (a block of 2 over 35 keys against its first query
    alone)."""
    """Query j of a block of Q (the last Q positions) == the one-query call over keys 0..K-Q+j, bit for
    bit."""
    q, k, v = _qkv(batch=1, queries=queries, keys=keys, dim=64, seed=keys)
    module = _Attention(3)
    block, _ = row_invariant_sdpa(module, q, k, v, None)
    masked, _ = row_invariant_sdpa(module, q, k, v, _causal(1, queries, keys))
    assert torch.equal(block, masked)
    for j in range(queries):
        end = keys - queries + 1 + j
        alone, _ = row_invariant_sdpa(module, q[:, :, j : j + 1], k[:, :, :end], v[:, :, :end], None)
        assert torch.equal(block[:, j], alone[:, 0]), f"query {j} of {queries} over {keys} keys"


@pytest.mark.parametrize("keys", [30, 513, 1100])
def test_a_node_of_a_draft_tree_gets_the_bits_of_its_own_chain_alone(keys):
    """Tree drafts: a node attends to the cache and its ancestors, with its siblings' keys masked in between;
    its result must be the one-query call over exactly those keys, contiguous."""
    from specbench.decoding.tree import tree_structure

    nodes = 9
    q, k, v = _qkv(batch=1, queries=nodes, keys=keys + nodes, dim=64, seed=keys + 1)
    parents = torch.tensor([[0, 1, 0, 0, 2, 3, 1, 5]])  # 8 drafts under the root (column 0)
    ancestors, _ = tree_structure(parents)
    allowed = torch.cat([torch.ones(1, nodes, keys, dtype=torch.bool), ancestors], dim=2).unsqueeze(1)
    module = _Attention(3)
    block, _ = row_invariant_sdpa(module, q, k, v, allowed)
    for j in range(nodes):
        index = torch.cat([torch.arange(keys), keys + torch.nonzero(ancestors[0, j]).squeeze(1)])
        alone, _ = row_invariant_sdpa(module, q[:, :, j : j + 1], k[:, :, index], v[:, :, index], None)
        assert torch.equal(block[:, j], alone[:, 0]), f"node {j} over {keys} keys"


def test_padded_rows_of_a_batch_get_their_bits_too():
    q, k, v = _qkv(batch=2, queries=4, keys=60, dim=32, seed=4)
    padding = torch.ones(2, 60, dtype=torch.bool)
    padding[0, :9] = False
    module = _Attention(3)
    block, _ = row_invariant_sdpa(module, q, k, v, _causal(2, 4, 60, padding))
    for j in range(4):
        end = 60 - 4 + 1 + j
        alone_mask = padding[:, None, None, :end]
        alone, _ = row_invariant_sdpa(module, q[:, :, j : j + 1], k[:, :, :end], v[:, :, :end], alone_mask)
        assert torch.equal(block[:, j], alone[:, 0])


@pytest.mark.parametrize("queries, starts", [(1, (7, 0, 129)), (4, (1, 0, 3)), (4, (11, 0, 36))])
def test_a_row_of_a_padded_batch_gets_the_bits_it_gets_alone_without_padding(queries, starts):
    """Left padding moves as the cache re-aligns rows; a row's attention must not see where it ends (on this
    project's CPUs one product over the whole padded batch gives some rows other bits at 700 keys)."""
    q, k, v = _qkv(batch=3, queries=queries, keys=700, dim=64, seed=9)
    padding = torch.ones(3, 700, dtype=torch.bool)
    for b, start in enumerate(starts):
        padding[b, :start] = False
    module = _Attention(3)
    batched, _ = row_invariant_sdpa(module, q, k, v, _causal(3, queries, 700, padding))
    for b, start in enumerate(starts):
        alone, _ = row_invariant_sdpa(
            module, q[b : b + 1], k[b : b + 1, :, start:], v[b : b + 1, :, start:], None
        )
        assert torch.equal(batched[b : b + 1], alone), f"row {b}"


def test_float32_and_long_blocks_keep_sdpa_exactly():
    module = _Attention(3)
    for dtype, queries in ((torch.float32, 1), (torch.float32, 3), (torch.bfloat16, 40)):
        q, k, v = _qkv(queries=queries, keys=50, dtype=dtype)
        allowed = _causal(2, queries, 50)
        out, _ = row_invariant_sdpa(module, q, k, v, allowed)
        assert torch.equal(out, sdpa_attention_forward(module, q, k, v, allowed)[0])


@pytest.mark.parametrize("product", row_invariant.PRODUCTS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("in_features", "out_features"), [(48, 576), (1536, 576), (576, 192), (576, 4096)])
def test_a_single_bf16_row_gets_the_bits_of_a_row_in_a_block(
    in_features, out_features, bias, product, monkeypatch
):
    """SmolLM2-135M's shapes (1536 -> 576: the down projection; 576 -> 192: k / v; a wide LM-head-like one): a
    row alone, in blocks of 2..64 rows and in a batch gets the same bits, those of the process's product (the
    transposed product or F.linear of two or more rows), with either product."""
    monkeypatch.setattr(row_invariant, "LINEAR_PRODUCT", product)
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features, bias=bias)
    layer.weight.data = torch.randn(out_features, in_features) / in_features**0.5
    layer = layer.to(torch.bfloat16)
    layer.__class__ = RowInvariantLinear
    x = torch.randn(64, in_features).to(torch.bfloat16)
    block = layer(x)
    if product == "transposed":
        expected = (layer.weight @ x.T).T + (layer.bias if bias else 0)
    else:
        expected = F.linear(x, layer.weight, layer.bias)
    assert torch.equal(block, expected)
    for rows in (2, 3, 5, 11, 33):
        assert torch.equal(layer(x[:rows]), block[:rows]), f"{rows} rows"
    assert torch.equal(layer(x[:12].reshape(4, 3, in_features)), block[:12].reshape(4, 3, out_features))
    for i in range(0, 64, 7):
        assert torch.equal(layer(x[i : i + 1]), block[i : i + 1]), f"row {i}"
    assert torch.equal(layer(x[3]), block[3])  # 1-D input keeps its shape
    assert layer(x[None, :1]).shape == (1, 1, out_features)
    assert layer(x[None, :1]).is_contiguous()


def test_the_product_is_chosen_by_the_cpu_or_the_environment(monkeypatch):
    monkeypatch.setattr(row_invariant, "_has_amx", lambda: True)
    monkeypatch.delenv("SPECBENCH_LINEAR_PRODUCT", raising=False)
    assert row_invariant.linear_product() == "transposed"
    monkeypatch.setattr(row_invariant, "_has_amx", lambda: False)
    assert row_invariant.linear_product() == "linear"
    monkeypatch.setenv("SPECBENCH_LINEAR_PRODUCT", "transposed")
    assert row_invariant.linear_product() == "transposed"
    monkeypatch.setenv("SPECBENCH_LINEAR_PRODUCT", "fast")
    with pytest.raises(ValueError, match="SPECBENCH_LINEAR_PRODUCT must be one of"):
        row_invariant.linear_product()


def test_more_bf16_rows_than_the_transposed_product_takes_keep_f_linear():
    layer = nn.Linear(40, 24).to(torch.bfloat16)
    layer.__class__ = RowInvariantLinear
    x = torch.randn(MAX_TRANSPOSED_ROWS + 1, 40).to(torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def test_float32_rows_keep_f_linear_exactly_without_the_small_linear_kernel(monkeypatch):
    monkeypatch.setattr(small_linear, "kernel", lambda: None)  # with it: tests/test_small_linear.py
    torch.manual_seed(0)
    layer = nn.Linear(40, 24)
    layer.__class__ = RowInvariantLinear
    for shape in ((1, 40), (5, 40), (2, 3, 40)):
        x = torch.randn(*shape)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def _model(seed=11) -> nn.Module:
    model = tiny_random_model(seed=seed, num_layers=2, hidden_size=576, num_heads=9, num_kv_heads=3,
                              intermediate_size=1536)
    use_row_invariant_forwards(model)
    return model.to(torch.bfloat16)


def _incremental_and_block_logits(model, context, block, valid=None):
    cached = CachedModel(model, 320)
    cached.reset(context.shape[0])
    cached.forward(context, valid)
    at_once = cached.forward(block).logits
    cached.reset(context.shape[0])
    cached.forward(context, valid)
    one_by_one = torch.cat([cached.forward(block[:, j : j + 1]).logits for j in range(block.shape[1])], 1)
    return at_once, one_by_one


@pytest.mark.parametrize("product", row_invariant.PRODUCTS)
@pytest.mark.parametrize("width", [2, 4, 9])
def test_a_bf16_model_scores_a_block_as_it_scores_each_position(width, product, monkeypatch):
    monkeypatch.setattr(row_invariant, "LINEAR_PRODUCT", product)
    model = _model()
    assert model.config._attn_implementation == ROWWISE_ATTENTION
    g = torch.Generator().manual_seed(width)
    context, block = (
        torch.randint(0, 259, (1, 70), generator=g),
        torch.randint(0, 259, (1, width), generator=g),
    )
    at_once, one_by_one = _incremental_and_block_logits(model, context, block)
    assert torch.equal(at_once, one_by_one)


def test_a_padded_bf16_batch_scores_a_block_as_it_scores_each_position():
    model = _model(seed=12)
    g = torch.Generator().manual_seed(1)
    context, block = torch.randint(0, 259, (3, 50), generator=g), torch.randint(0, 259, (3, 4), generator=g)
    valid = torch.ones(3, 50, dtype=torch.bool)
    valid[1, :13] = False
    valid[2, :30] = False
    at_once, one_by_one = _incremental_and_block_logits(model, context, block, valid)
    assert torch.equal(at_once, one_by_one)


def test_loading_in_bf16_gives_the_row_invariant_forwards_and_identical_greedy_decoding():
    verifier = load_verifier(ModelSpec(kind="tiny_random", seed=5, num_layers=3), device="cpu", dtype="bf16")
    model = verifier.model
    assert model.config._attn_implementation == ROWWISE_ATTENTION
    assert type(model.get_output_embeddings()) is SmallBatchLinear
    body = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not model.get_output_embeddings()]
    assert body and all(type(m) is RowInvariantLinear for m in body)
    drafter = tiny_random_model(seed=6).eval().to(torch.bfloat16)
    common = {"settings": GenerationSettings(max_new_tokens=24), "vocab_size": 320, "eos_token_ids": []}
    prompts = [[5, 9, 33, 70, 12], [101, 7], [44] * 9]
    reference = [r.output_ids for r in SpeculativeEngine(model, None, **common).generate(prompts)]
    speculative = SpeculativeEngine(model, ModelDrafter(drafter, 320), **common).generate(prompts)
    assert [r.output_ids for r in speculative] == reference
    assert any(round_.drafted > 0 for r in speculative for round_ in r.rounds)


@pytest.mark.slow
def test_the_embedded_verifier_in_bf16_scores_a_block_as_it_scores_each_position():
    verifier = load_verifier(ModelSpec(kind="embedded"), device="cpu", dtype="bf16")
    g = torch.Generator().manual_seed(0)
    for width in (3, 8):
        context = torch.randint(0, 49152, (1, 200), generator=g)
        block = torch.randint(0, 49152, (1, width), generator=g)
        at_once, one_by_one = _incremental_and_block_logits(verifier.model, context, block)
        assert torch.equal(at_once, one_by_one)


@pytest.mark.slow
def test_the_embedded_pair_in_bf16_decodes_speculatively_as_autoregressively_at_batch_1_and_4():
    from specbench.decoding import DraftSchedule
    from specbench.drafters.eagle3.format import eagle3_drafter
    from specbench.drafters.fallback import suffix_then_eagle3
    from specbench.drafters.suffix import SuffixDrafter
    from specbench.evaluation import eos_token_ids

    verifier = load_verifier(ModelSpec(kind="embedded"), device="cpu", dtype="bf16")
    vocab = len(verifier.tokenizer)
    eos = eos_token_ids(verifier.model, verifier.tokenizer)
    questions = ["Name three colours of the rainbow.", "Translate 'good morning' into French and German.",
                 "What is 17 times 23? Think step by step.", "Write a haiku about the sea."]  # fmt: skip
    prompts = []
    for text in questions:
        ids = verifier.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
        prompts.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    common = {"settings": GenerationSettings(max_new_tokens=40), "vocab_size": vocab, "eos_token_ids": eos,
              "pad_token_id": eos[0]}  # fmt: skip
    plain = SpeculativeEngine(verifier.model, None, **common)
    drafters = {
        "eagle3": (eagle3_drafter("checkpoints/eagle3-smollm2-135m/trained.pt", verifier, vocab), 2),
        "suffix": (SuffixDrafter(num_speculative_tokens=5), 5),
        "suffix+eagle3": (
            suffix_then_eagle3("checkpoints/eagle3-smollm2-135m/trained.pt", verifier, vocab),
            10,
        ),
        "eagle3-tree": (
            eagle3_drafter("checkpoints/eagle3-smollm2-135m/trained.pt", verifier, vocab, tree_width=3),
            2,
        ),
        "suffix+eagle3-tree": (
            suffix_then_eagle3("checkpoints/eagle3-smollm2-135m/trained.pt", verifier, vocab, tree_width=3),
            10,
        ),
    }
    for name, (drafter, gamma) in drafters.items():
        engine = SpeculativeEngine(
            verifier.model, drafter, schedule=DraftSchedule("constant", gamma), **common
        )
        for prompt in prompts:
            assert engine.generate([prompt])[0].output_ids == plain.generate([prompt])[0].output_ids, name
        batched = engine.generate(prompts)
        assert [r.output_ids for r in batched] == [r.output_ids for r in plain.generate(prompts)], name
        assert sum(r.accepted for result in batched for r in result.rounds) > 0


def test_large_float32_blocks_take_the_transposed_product_and_small_ones_f_linear(monkeypatch):
    """Where the CPU has AMX (forced here); elsewhere every float32 block keeps F.linear."""
    from specbench.models.row_invariant import FP32_TRANSPOSED_ROWS, FP32_TRANSPOSED_WEIGHT

    monkeypatch.setattr(row_invariant, "FP32_TRANSPOSED", True)
    monkeypatch.setattr(small_linear, "kernel", lambda: None)  # it takes 1..12 rows first where it is built
    torch.manual_seed(0)
    large = nn.Linear(1536, FP32_TRANSPOSED_WEIGHT // 1536 + 1, bias=True)
    large.__class__ = RowInvariantLinear
    low, high = FP32_TRANSPOSED_ROWS
    for rows in (low, 11, high):
        x = torch.randn(1, rows, 1536)
        assert torch.equal(large(x), (large.weight @ x[0].T).T[None] + large.bias)
        torch.testing.assert_close(large(x), F.linear(x, large.weight, large.bias), rtol=1e-5, atol=1e-5)
    for rows in (1, low - 1, high + 1):
        x = torch.randn(rows, 1536)
        assert torch.equal(large(x), F.linear(x, large.weight, large.bias))


def test_without_amx_large_float32_blocks_keep_f_linear(monkeypatch):
    monkeypatch.setattr(row_invariant, "FP32_TRANSPOSED", False)
    monkeypatch.setattr(small_linear, "kernel", lambda: None)
    large = nn.Linear(1536, row_invariant.FP32_TRANSPOSED_WEIGHT // 1536 + 1)
    large.__class__ = RowInvariantLinear
    x = torch.randn(11, 1536)
    assert torch.equal(large(x), F.linear(x, large.weight, large.bias))
