"""DFlash checkpoints in the z-lab layout (docs/dflash.md): the test writes a tiny checkpoint with random
weights (norm weights not 1), loads it for a tiny verifier, and compares the draft network layer by layer
with an independent forward written here with plain torch ops; export / load round trip; mismatched pairs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specbench.drafters.dflash.checkpoint import DFlashCheckpointError, export_dflash, load_dflash, read_state
from specbench.drafters.dflash.config import DFlashConfig, DFlashConfigError, default_target_layer_ids
from specbench.models.tiny import tiny_random_model

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, VOCAB = 32, 4, 2, 8, 48, 2, 320
TARGET_LAYERS, TAPS, BLOCK, MASK = 4, [0, 2], 4, 300


def zlab_config(**changes) -> dict:
    """A config.json as z-lab's DFlash checkpoints write it (Qwen3 fields + dflash_config)."""
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "head_dim": HEAD_DIM,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS,
        "layer_types": ["full_attention"] * LAYERS,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "vocab_size": VOCAB,
        "num_target_layers": TARGET_LAYERS,
        "block_size": BLOCK,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS},
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    config.update(changes)
    return config


def zlab_weights(seed=0, layers=LAYERS, taps=2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return (scale * torch.randn(*shape, generator=g)).contiguous()

    def norm(size):
        return (0.5 + torch.rand(size, generator=g)).contiguous()  # not 1: a misplaced norm shows

    weights = {
        "fc.weight": rand(HIDDEN, taps * HIDDEN),
        "hidden_norm.weight": norm(HIDDEN),
        "norm.weight": norm(HIDDEN),
    }
    for i in range(layers):
        p = f"layers.{i}."
        weights |= {
            p + "input_layernorm.weight": norm(HIDDEN),
            p + "post_attention_layernorm.weight": norm(HIDDEN),
            p + "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": norm(HEAD_DIM),
            p + "self_attn.k_norm.weight": norm(HEAD_DIM),
            p + "mlp.gate_proj.weight": rand(INTER, HIDDEN),
            p + "mlp.up_proj.weight": rand(INTER, HIDDEN),
            p + "mlp.down_proj.weight": rand(HIDDEN, INTER),
        }
    return weights


def write_checkpoint(directory, config=None, weights=None, sharded=False):
    directory.mkdir(parents=True, exist_ok=True)
    config = config or zlab_config()
    weights = weights if weights is not None else zlab_weights()
    (directory / "config.json").write_text(json.dumps(config))
    if not sharded:
        save_file(weights, str(directory / "model.safetensors"))
        return directory
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: weights[k] for k in keys}, str(directory / shard))
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


@pytest.fixture(scope="module")
def verifier():
    return tiny_random_model(
        "qwen3", num_layers=TARGET_LAYERS, hidden_size=HIDDEN, num_heads=HEADS, num_kv_heads=KV_HEADS
    )


# --- the independent forward: plain torch ops on the checkpoint's tensors ---------------------------------


def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta=10000.0):
    """x (S, heads, D) at integer positions pos (S,): the half-split rotation of Llama / Qwen."""
    d = x.shape[-1]
    freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * freq[None, :]  # (S, D/2)
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def reference_forward(w, features, ctx_pos, block_embeds, block_pos):
    """One row: features (S, F), block_embeds (W, H); returns every layer's output and the normed final."""
    ctx = rms(features @ w["fc.weight"].T, w["hidden_norm.weight"])
    h = block_embeds
    outputs = []
    for i in range(LAYERS):
        p = f"layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        both = torch.cat([ctx, x])  # keys / values: context first, then the block
        both_pos = torch.cat([ctx_pos, block_pos])
        q = rope(
            rms(
                (x @ w[p + "self_attn.q_proj.weight"].T).view(-1, HEADS, HEAD_DIM),
                w[p + "self_attn.q_norm.weight"],
            ),
            block_pos,
        )
        k = rope(
            rms(
                (both @ w[p + "self_attn.k_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM),
                w[p + "self_attn.k_norm.weight"],
            ),
            both_pos,
        )
        v = (both @ w[p + "self_attn.v_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM)
        heads = []
        for head in range(HEADS):
            kv = head // (HEADS // KV_HEADS)
            scores = q[:, head] @ k[:, kv].T / HEAD_DIM**0.5  # (W, S + W): no causal mask
            heads.append(torch.softmax(scores, dim=-1) @ v[:, kv])
        h = h + torch.cat(heads, dim=-1) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        outputs.append(h)
    return outputs, rms(h, w["norm.weight"])


@pytest.mark.parametrize("sharded", [False, True])
def test_loaded_checkpoint_matches_an_independent_forward_layer_by_layer(verifier, tmp_path, sharded):
    weights = zlab_weights()
    model = load_dflash(write_checkpoint(tmp_path / "ckpt", weights=weights, sharded=sharded), verifier)
    assert model.config.target_layer_ids == tuple(TAPS) and model.config.block_size == BLOCK
    assert model.config.mask_token_id == MASK
    g = torch.Generator().manual_seed(1)
    lengths = [5, 3]  # two rows of different context lengths, left-padded into one cache
    features = torch.randn(2, 5, len(TAPS) * HIDDEN, generator=g)
    valid = torch.arange(5)[None, :] >= torch.tensor([5 - n for n in lengths])[:, None]
    positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    cache = model.empty_cache(2)
    cache.append(model.context_kv(features, positions), valid)
    last = torch.tensor([65, 66])
    ids = model.block_ids(last, BLOCK)
    assert ids[:, 1:].eq(MASK).all()
    embeds = model.embed_block(ids, verifier.get_input_embeddings())
    block_pos = torch.tensor(lengths)[:, None] + torch.arange(BLOCK)[None, :]
    normed, outputs = model(embeds, block_pos, cache, layer_outputs=True)
    for row, n in enumerate(lengths):
        want_outputs, want_normed = reference_forward(
            weights, features[row, 5 - n :], torch.arange(n), embeds[row], block_pos[row]
        )
        for layer, (got, want) in enumerate(zip(outputs, want_outputs)):
            torch.testing.assert_close(got[row], want, atol=1e-5, rtol=1e-5, msg=f"layer {layer}, row {row}")
        torch.testing.assert_close(normed[row], want_normed, atol=1e-5, rtol=1e-5)


def test_export_then_load_round_trips_config_and_tensors(verifier, tmp_path):
    model = load_dflash(write_checkpoint(tmp_path / "in"), verifier)
    export_dflash(model, tmp_path / "out")
    raw, state = read_state(tmp_path / "out")
    assert raw["dflash_config"] == {"block_size": BLOCK, "mask_token_id": MASK, "target_layer_ids": TAPS}
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["num_target_layers"] == TARGET_LAYERS
    assert DFlashConfig.from_dict(raw) == model.config
    assert state.keys() == zlab_weights().keys()
    again = load_dflash(tmp_path / "out", verifier)
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_a_learned_mask_embedding_round_trips(verifier, tmp_path):
    config = zlab_config(dflash_config={"mask_token_id": None, "target_layer_ids": TAPS})
    weights = zlab_weights() | {"mask_embedding": torch.randn(HIDDEN)}
    model = load_dflash(write_checkpoint(tmp_path / "in", config, weights), verifier)
    ids = model.block_ids(torch.tensor([7]), BLOCK)
    embeds = model.embed_block(ids, verifier.get_input_embeddings())
    torch.testing.assert_close(embeds[0, 1:], weights["mask_embedding"].expand(BLOCK - 1, -1))
    torch.testing.assert_close(embeds[0, 0], verifier.get_input_embeddings().weight[7])
    export_dflash(model, tmp_path / "out")
    assert torch.equal(load_dflash(tmp_path / "out", verifier).mask_embedding, model.mask_embedding)


@pytest.mark.parametrize(
    ("changes", "verifier_kwargs", "match"),
    [
        ({}, {"hidden_size": 64}, "hidden_size 32 but the verifier's is 64"),
        (
            {"dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 5]}, "num_target_layers": None},
            {},
            "target_layer_ids=\\[0, 5\\] but the verifier has 4 layers",
        ),
        ({}, {"num_layers": 6}, "num_target_layers=4 but the verifier has 6 layers"),
        ({"vocab_size": 400}, {}, "vocab_size 400 but the verifier's embedding has 320 rows"),
        ({"dflash_config": {"mask_token_id": 999, "target_layer_ids": TAPS}}, {}, "mask_token_id=999"),
    ],
)
def test_a_mismatched_pair_is_refused_before_decoding(tmp_path, changes, verifier_kwargs, match):
    kwargs = {
        "num_layers": TARGET_LAYERS,
        "hidden_size": HIDDEN,
        "num_heads": HEADS,
        "num_kv_heads": KV_HEADS,
    }
    other = tiny_random_model("qwen3", **(kwargs | verifier_kwargs))
    config = {k: v for k, v in zlab_config(**changes).items() if v is not None or k == "rope_scaling"}
    with pytest.raises(DFlashCheckpointError, match=match):
        load_dflash(write_checkpoint(tmp_path / "ckpt", config), other)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"layer_types": ["sliding_attention"] * LAYERS}, "sliding-window"),
        ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS, "selector_rank": 8}}, "DFlash2"),
        ({"is_causal": True}, "non-causal"),
        (
            {"dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS, "attention_mode": "mla"}},
            "variant",
        ),
        ({"shift_label": True}, "shift_label=True"),
        ({"block_size": 1}, "block_size=1"),
        ({"dflash_config": {"mask_token_id": MASK, "target_layer_ids": [1, 4]}}, "num_target_layers=4"),
    ],
)
def test_configs_this_implementation_cannot_run_are_refused(changes, match):
    with pytest.raises(DFlashConfigError, match=match):
        DFlashConfig.from_dict(zlab_config(**changes))


def test_default_taps_follow_zlab_when_the_config_gives_none():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B-DFlash-b16's taps
    config = DFlashConfig.from_dict(zlab_config(dflash_config={"mask_token_id": MASK}, num_target_layers=36))
    assert config.target_layer_ids == (1, 33)


def test_llama3_rope_round_trips_and_bf16_keeps_float32_frequencies():
    from specbench.drafters.dflash.model import DFlashDraftModel

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    config = DFlashConfig.from_dict(zlab_config(rope_theta=500000.0, rope_scaling=scaling))
    assert config.rope == {**scaling, "rope_theta": 500000.0}
    assert DFlashConfig.from_dict(config.to_dict()) == config
    model = DFlashDraftModel(config).to(torch.bfloat16)
    assert model.rotary.inner.rope_type == "llama3" and model.rotary.inner.inv_freq.dtype == torch.float32
