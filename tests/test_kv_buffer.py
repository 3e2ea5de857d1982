"""The in-place KV cache layer: it holds exactly what transformers' concatenating layer holds, after any mix
of appends, crops, gathers and row selections, and an append within capacity copies nothing."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicCache, DynamicLayer

from specbench.decoding.cache import CachedModel
from specbench.decoding.kv_buffer import MIN_GROWTH, BufferedLayer, buffered_cache


def _states(batch: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, width, 8, generator=g), torch.randn(batch, 2, width, 8, generator=g)


def _same(buffered: BufferedLayer, reference: DynamicLayer) -> None:
    assert torch.equal(buffered.keys, reference.keys)
    assert torch.equal(buffered.values, reference.values)
    assert buffered.get_seq_length() == reference.get_seq_length()


def test_appends_match_concatenation_across_growth():
    buffered, reference = BufferedLayer(), DynamicLayer()
    widths = [37, 1, 1, 5, MIN_GROWTH, 3, MIN_GROWTH * 2, 1]  # overflows the buffer more than once
    for seed, width in enumerate(widths):
        k, v = _states(3, width, seed)
        out_b = buffered.update(k, v)
        out_r = reference.update(k, v)
        assert torch.equal(out_b[0], out_r[0]) and torch.equal(out_b[1], out_r[1])
        _same(buffered, reference)
    assert buffered.keys.stride(-1) == 1 and buffered.keys.shape == (3, 2, sum(widths), 8)


def test_append_within_capacity_writes_in_place():
    layer = BufferedLayer()
    layer.update(*_states(2, 10, 0))
    storage = layer.keys.untyped_storage().data_ptr()
    for seed in range(1, MIN_GROWTH + 1):  # fills the buffer (10 + MIN_GROWTH columns) exactly
        layer.update(*_states(2, 1, seed))
    assert layer.keys.untyped_storage().data_ptr() == storage  # no reallocation, so no copy of the cache
    layer.update(*_states(2, 1, MIN_GROWTH + 1))
    assert layer.keys.untyped_storage().data_ptr() != storage  # full: it grew


def test_crop_gather_and_row_selection_match_transformers_layer():
    buffered, reference = BufferedLayer(), DynamicLayer()
    for layer in (buffered, reference):
        layer.update(*_states(4, 20, 0))
    storage = buffered.keys.untyped_storage().data_ptr()
    for layer in (buffered, reference):  # what CachedModel._crop does: a column window
        layer.keys, layer.values = layer.keys[:, :, 3:17], layer.values[:, :, 3:17]
    _same(buffered, reference)
    assert buffered.keys.untyped_storage().data_ptr() == storage  # a window moves no data
    for layer in (buffered, reference):  # rejected drafts past the window are overwritten by the next append
        layer.update(*_states(4, 6, 1))
    _same(buffered, reference)
    order = torch.stack([torch.randperm(20, generator=torch.Generator().manual_seed(b)) for b in range(4)])
    index = order[:, None, :, None].expand(-1, 2, -1, 8)
    for layer in (buffered, reference):  # re-alignment: a gathered copy of the same batch
        layer.keys = torch.gather(layer.keys, 2, index)
        layer.values = torch.gather(layer.values, 2, index)
    _same(buffered, reference)
    rows = torch.tensor([2, 0])
    for layer in (buffered, reference):  # finished rows leave the batch (transformers' own method)
        layer.batch_select_indices(rows)
        layer.update(*_states(2, 2, 2))
    _same(buffered, reference)
    for layer in (buffered, reference):
        layer.crop(-5)
        layer.update(*_states(2, 1, 3))
    _same(buffered, reference)
    buffered.reset()
    assert buffered.keys is None and not buffered.is_initialized
    buffered.update(*_states(1, 4, 4))
    assert buffered.keys.shape == (1, 2, 4, 8)


def test_wrong_shape_append_is_refused():
    layer = BufferedLayer()
    layer.update(*_states(2, 4, 0))
    with pytest.raises(ValueError, match="cache append"):
        layer.update(*_states(3, 1, 1))


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for module in model.modules():  # norm weights away from 1, so a wrong norm would show
            if hasattr(module, "variance_epsilon"):
                module.weight.uniform_(0.5, 1.5)
    return model


def test_cached_model_uses_buffered_layers_and_matches_dynamic_cache(tiny_llama):
    """Padded batch, a forward, a keep() that drops rejected columns, more forwards: the logits equal
    the same calls over transformers' concatenating DynamicCache."""
    ids = torch.randint(1, 97, (3, 9), generator=torch.Generator().manual_seed(5))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[0, :4] = False
    valid[2, :2] = False
    runs = []
    for make in (buffered_cache, lambda config: DynamicCache(config=config)):
        model = CachedModel(tiny_llama, 97)
        model.reset(3)
        model.cache = make(tiny_llama.config)
        logits = [model.forward(ids, valid).logits]
        model.keep(model.num_valid - torch.tensor([2, 0, 1]))
        for step in range(3):
            logits.append(model.forward(ids[:, step : step + 2]).logits)
            model.keep(model.num_valid - 1)
        runs.append((logits, model.cache))
    (buffered_logits, cache), (dynamic_logits, _) = runs
    assert all(isinstance(layer, BufferedLayer) for layer in cache.layers)
    for a, b in zip(buffered_logits, dynamic_logits):
        assert torch.equal(a, b)
    fresh = CachedModel(tiny_llama, 97)
    fresh.reset(1)
    assert all(isinstance(layer, BufferedLayer) for layer in fresh.cache.layers)
