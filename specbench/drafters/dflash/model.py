"""The DFlash draft network (z-lab/dflash ``DFlashDraftModel``, re-implemented; docs/dflash.md).

Per draft round, for a block of ``block_size`` slots ``[last committed token, mask, ..., mask]`` at positions
``n − 1 .. n + block_size − 2`` (``n`` committed tokens)::

    ctx    = hidden_norm(fc(concat(verifier taps at positions 0 .. n − 2)))      # (S, H), once per position
    h      = embed(block)                                      # the verifier's embedding (or a learned mask)
    for each draft layer:
        x  = input_layernorm(h)
        q  = rope(q_norm(q_proj(x)))                           # queries: the block only
        k  = rope(k_norm(k_proj([ctx ; x])));  v = v_proj([ctx ; x])   # keys/values: context, then block
        h  = h + o_proj(attention(q, k, v))                    # no causal mask: every slot sees all keys
        h  = h + mlp(post_attention_layernorm(h))              # SwiGLU
    logits = verifier.lm_head(norm(h))[slots 1 ..]             # block_size − 1 drafts from one forward

The context keys/values of a layer depend only on ``ctx`` and the positions (not on the block or on the
layers below), so they are computed once per committed position and cached (:class:`ContextCache`);
block keys/values are never cached. Parameter names are the z-lab ones (``fc``, ``hidden_norm``,
``layers.N.self_attn.q_proj``, ..., ``norm``), so :mod:`.checkpoint` maps them 1:1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specbench.drafters.dflash.config import DFlashConfig


class RMSNorm(nn.Module):
    """Qwen3 / Llama RMSNorm: normalise in float32, scale by the weight in the input dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, S, D); cos / sin (B, S, D)."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


class Rotary:
    """cos / sin tables of the config's rope (any transformers rope type: default, llama3, yarn, ...).

    Not a submodule: casting the draft to bf16 must not round the float32 inverse frequencies."""

    def __init__(self, config: DFlashConfig):
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        rope_config = Qwen3Config(
            hidden_size=config.hidden_size,
            num_attention_heads=config.num_attention_heads,
            head_dim=config.head_dim,
            max_position_embeddings=config.max_position_embeddings,
            rope_parameters=dict(config.rope),
        )
        self.inner = Qwen3RotaryEmbedding(config=rope_config)

    def __call__(self, like: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inner.inv_freq.device != positions.device:
            self.inner.to(positions.device)  # a device move keeps float32
        return self.inner(like, positions)


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        hidden, dim, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, dim
        self.q_proj = nn.Linear(hidden, self.heads * dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * dim, hidden, bias=bias)
        self.q_norm = RMSNorm(dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(dim, config.rms_norm_eps)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(*x.shape[:-1], heads, self.head_dim).transpose(1, 2)  # (B, heads, S, D)

    def keys_values(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """(k, v), each (B, kv_heads, S, D), of inputs ``x`` (B, S, H) at the positions of ``rope``."""
        k = apply_rope(self.k_norm(self._split(self.k_proj(x), self.kv_heads)), *rope)
        return k, self._split(self.v_proj(x), self.kv_heads)

    def forward(self, x, rope, context_k, context_v, context_valid, block_mask=None) -> torch.Tensor:
        """Block inputs ``x`` (B, W, H) attend to the context keys (B, kv, S, D) where ``context_valid``
        (B, S) or, given, ``block_mask`` (B, W, S + W) (training: many blocks at once), and to every block
        slot (no causal mask)."""
        q = apply_rope(self.q_norm(self._split(self.q_proj(x), self.heads)), *rope)
        k, v = self.keys_values(x, rope)
        k, v = torch.cat([context_k, k], dim=2), torch.cat([context_v, v], dim=2)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if block_mask is None:
            block = torch.ones(x.shape[0], x.shape[1], dtype=torch.bool, device=x.device)
            mask = torch.cat([context_valid, block], dim=1)[:, None, None, :]
        else:
            mask = block_mask[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))


class SwiGLU(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, h, rope, context_k, context_v, context_valid, block_mask=None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rope, context_k, context_v, context_valid, block_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class ContextCache:
    """Per draft layer, the keys/values of the committed context (B, kv, S, D) and their validity (B, S).

    Only committed positions are ever stored (block keys/values are recomputed each round), so nothing
    needs cropping after a rejection: the drafter appends the accepted positions' entries at ``commit``.
    Slots of a row need not be contiguous (attention is order-free once RoPE is applied); ``append``
    right-aligns each row and drops columns no row uses.
    """

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, device, dtype):
        empty = torch.zeros(batch, kv_heads, 0, head_dim, device=device, dtype=dtype)
        self.keys = [empty] * layers
        self.values = [empty] * layers
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)

    @classmethod
    def of(cls, kv: list[tuple[torch.Tensor, torch.Tensor]], valid: torch.Tensor) -> ContextCache:
        """A cache holding ``kv`` (per layer, (B, kv, S, D) each) as they are, gradients kept (training)."""
        cache = cls.__new__(cls)
        cache.keys, cache.values, cache.valid = [k for k, _ in kv], [v for _, v in kv], valid
        return cache

    @property
    def lengths(self) -> torch.Tensor:
        return self.valid.sum(dim=1)

    def append(self, kv: list[tuple[torch.Tensor, torch.Tensor]], valid: torch.Tensor) -> None:
        valid = torch.cat([self.valid, valid], dim=1)
        if valid.shape[0] == 1:  # one row: keep its valid slots, no sort
            index = valid[0].nonzero().squeeze(1)
            self.valid = valid[:, index]
            self.keys = [torch.cat([old, k], dim=2)[:, :, index] for old, (k, _) in zip(self.keys, kv)]
            self.values = [torch.cat([old, v], dim=2)[:, :, index] for old, (_, v) in zip(self.values, kv)]
            return
        order = torch.sort(valid.long(), dim=1, stable=True).indices
        keep = int(valid.sum(dim=1).max()) if valid.numel() else 0
        order = order[:, order.shape[1] - keep :]
        self.valid = torch.gather(valid, 1, order)
        for i, (k, v) in enumerate(kv):
            index = order[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[-1])
            self.keys[i] = torch.gather(torch.cat([self.keys[i], k], dim=2), 2, index)
            self.values[i] = torch.gather(torch.cat([self.values[i], v], dim=2), 2, index)

    def select_rows(self, rows: torch.Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.valid = self.valid[rows]
        self.append([(k[:, :, :0], v[:, :, :0]) for k, v in zip(self.keys, self.values)], self.valid[:, :0])


class DFlashDraftModel(nn.Module):
    """fc + hidden_norm (fusion), ``num_hidden_layers`` draft layers, final norm; an optional learned mask
    embedding (``mask_embedding``) when the config has no ``mask_token_id``. The verifier's embedding and
    LM head are not part of it (the drafter passes them in)."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(len(config.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.rotary = Rotary(config)
        if config.mask_token_id is None:
            self.mask_embedding = nn.Parameter(torch.zeros(hidden))

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated verifier taps (B, S, len(taps)·H) → the fused context (B, S, H)."""
        if features.shape[-1] != self.fc.in_features:
            raise ValueError(
                f"DFlash reads {len(self.config.target_layer_ids)} taps of width {self.config.hidden_size} "
                f"({self.fc.in_features}); got features of width {features.shape[-1]}"
            )
        return self.hidden_norm(self.fc(features.to(self.dtype)))

    def context_kv(
        self, features: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's (k, v) of the context ``features`` (B, S, len(taps)·H) at ``positions`` (B, S)."""
        fused = self.fuse(features)
        rope = self.rotary(fused, positions)
        return [layer.self_attn.keys_values(fused, rope) for layer in self.layers]

    def empty_cache(self, batch: int) -> ContextCache:
        c = self.config
        return ContextCache(
            c.num_hidden_layers, batch, c.num_key_value_heads, c.head_dim, self.device, self.dtype
        )

    def embed_block(self, ids: torch.Tensor, embedding: nn.Module) -> torch.Tensor:
        """Block inputs (B, W): slot 0 is the last committed token, the rest mask slots."""
        if self.config.mask_token_id is not None:
            return embedding(ids).to(self.dtype)
        first = embedding(ids[:, :1]).to(self.dtype)
        masks = self.mask_embedding.to(self.dtype).expand(ids.shape[0], ids.shape[1] - 1, -1)
        return torch.cat([first, masks], dim=1)

    def block_ids(self, last: torch.Tensor, width: int) -> torch.Tensor:
        mask = self.config.mask_token_id if self.config.mask_token_id is not None else 0
        block = torch.full((last.shape[0], width), mask, dtype=torch.long, device=last.device)
        block[:, 0] = last
        return block

    def forward(
        self,
        block_embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: ContextCache,
        layer_outputs: bool = False,
        block_mask: torch.Tensor | None = None,
    ):
        """The final-normed hidden states (B, W, H) of a block at ``positions`` (B, W) given the context in
        ``cache``; with ``layer_outputs``, also every draft layer's output (before the final norm).
        ``block_mask`` (B, W, S + W): which context entries and slots each slot attends to (default: every
        valid context entry and every slot), so that training runs many blocks as one."""
        h = block_embeds.to(self.dtype)
        rope = self.rotary(h, positions)
        outputs = []
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache.keys[i], cache.values[i], cache.valid, block_mask)
            outputs.append(h)
        normed = self.norm(h)
        return (normed, outputs) if layer_outputs else normed
