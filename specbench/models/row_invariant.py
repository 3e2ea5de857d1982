"""Row-invariant bf16 / fp16 forwards on a CPU, so that speculative decoding stays token-identical there.

Lossless speculative decoding promises the output of autoregressive decoding. With exact arithmetic it
gets it, but a verification forward computes the logits of position t in a block of n rows, while
autoregressive decoding computes them in a one-row forward. Where a kernel's result for one row depends on
how many rows it is given, the two logits differ in the last bits; in bf16 every activation is rounded to
8 bits of mantissa between operations, the difference grows layer by layer, and a greedy argmax between two
near-tied tokens flips. Measured on the embedded SmolLM2-135M on this project's CPUs (torch 2.13, oneDNN):

- ``F.linear`` in bf16 gives every row the same bits for 2..64 rows, but one row takes another path whose
  result differs for some shapes (the MLP's down projection, K = 1536; measured on AMD EPYC). A
  :class:`RowInvariantLinear` computes a single row as two identical rows, keeping the first, and few rows
  with one product for the whole process (:data:`LINEAR_PRODUCT`): on Intel Xeon with AMX the transposed
  product ``(W @ xᵀ)ᵀ``, which costs about half of ``F.linear``'s there; elsewhere ``F.linear`` itself,
  which on AMD EPYC (AVX-512 bf16, no AMX) costs 0.6x the transposed product for 2..11 rows and as much
  for two rows as for one. Either gives a row the same bits in any block; mixing them would not.
- SDPA's CPU kernel gives a query a different result in a block of n queries under a mask than alone.
  :func:`row_invariant_sdpa` (attention implementation ``sdpa_rowwise``) computes attention from matrix
  products that are row-invariant, for one query and for blocks alike.

float32 is not made row-invariant as a whole (its outputs are already identical in the engine's tests), but
its linear layers of 1..12 rows on one thread take :mod:`specbench.models.small_linear`'s kernel, for speed,
which is row-invariant too; nothing changes off the CPU.
Prefills longer than :data:`MAX_ROWWISE_QUERIES` keep SDPA: the prompt is computed the
same way in both decodings.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from specbench.models import exact_attention, small_linear

ROWWISE_ATTENTION = "sdpa_rowwise"
MAX_ROWWISE_QUERIES = 32  # a verification block is γ + 1 rows; longer blocks are prefills
MAX_TRANSPOSED_ROWS = 64  # rows of a linear layer's transposed product (beyond: prefills, large batches)
# float32 on a CPU (speed only: float32 is not made row-invariant). On Intel Xeon with AMX F.linear's cost
# steps up at 7 rows on large matrices (SmolLM2's MLP: 1 row 0.12 ms, 7 rows 0.35 ms, 11 rows 0.46 ms) while
# the transposed product stays at 0.22-0.26 ms up to 16 rows; on a 576 x 576 projection F.linear stays cheaper
# up to ~16 rows. On AMD EPYC it is the other way round (the MLP at 8-11 rows: F.linear 0.26-0.39 ms, the
# transposed product 0.50-0.76 ms): only the CPUs with AMX take it (``fp32_transposed``).
FP32_TRANSPOSED_ROWS = (7, 64)
FP32_TRANSPOSED_WEIGHT = 1 << 19  # weight elements
KEY_CHUNK = 512  # keys per probability-value product (below the 1024 where the kernel's blocking changed)
REDUCED = (torch.bfloat16, torch.float16)
PRODUCTS = ("transposed", "linear")


def _has_amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return any(line.startswith("flags") and "amx_bf16" in line.split() for line in info)
    except OSError:
        return False


def linear_product() -> str:
    """The few-row bf16 / fp16 product of this process: ``$SPECBENCH_LINEAR_PRODUCT`` (transposed | linear),
    else "transposed" on a CPU with AMX and "linear" on any other. Fixed once per process: every forward
    must compute a row the same way whatever the block."""
    chosen = os.environ.get("SPECBENCH_LINEAR_PRODUCT", "").strip().lower()
    if chosen and chosen not in PRODUCTS:
        raise ValueError(f"SPECBENCH_LINEAR_PRODUCT must be one of {list(PRODUCTS)}, got {chosen!r}")
    return chosen or ("transposed" if _has_amx() else "linear")


LINEAR_PRODUCT = linear_product()
FP32_TRANSPOSED = _has_amx()  # float32 blocks of FP32_TRANSPOSED_ROWS on large weights: transposed product


def needs_row_invariance(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in REDUCED


class RowInvariantLinear(nn.Linear):
    """``nn.Linear`` that computes 1..:data:`MAX_TRANSPOSED_ROWS` bf16 / fp16 CPU rows with the process's
    :data:`LINEAR_PRODUCT` (the transposed product ``(W @ xᵀ)ᵀ`` or ``F.linear``), a single row as two copies
    of it (keeping one); more rows, and other inputs, take ``F.linear``.

    Measured on this project's CPUs (torch 2.13, oneDNN): on Intel Xeon with AMX the transposed product gives
    a row the same bits in blocks of 2..64 rows and costs half of ``F.linear``'s few-row bf16 product on
    SmolLM2-135M's shapes (the LM head: 2.6 ms against 4.6–7 ms for 2–11 rows); on AMD EPYC ``F.linear`` of
    two or more rows gives a row the same bits and costs 0.6x the transposed product (the LM head 8.6 ms
    against 10.7 ms, the MLP 0.08 ms against 0.16 ms for two rows). float32 blocks of 7..64 rows on large
    weights take the transposed product for speed alone, on CPUs with AMX (:data:`FP32_TRANSPOSED_ROWS`);
    before that, 1..12 float32 rows on one thread take the compiled small-linear kernel where it is built
    (:mod:`specbench.models.small_linear`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if small_linear.applies(x, self.weight, self.bias):  # float32, 1..12 rows, 1 thread: the C kernel
            return small_linear.linear(x, self.weight, self.bias)
        width = x.shape[-1]
        rows = x.numel() // width if width else 0
        if 1 <= rows <= MAX_TRANSPOSED_ROWS and x.dtype in REDUCED and x.device.type == "cpu":
            flat = x.reshape(rows, width)
            if rows == 1:  # two real rows (cat costs 1/4 of repeat); a stride-0 expand took the one-row path
                flat = torch.cat((flat, flat))
            if LINEAR_PRODUCT == "linear":
                out = F.linear(flat, self.weight, self.bias)[:rows]
                return out.reshape(*x.shape[:-1], self.out_features)
            # contiguous: a row's layout downstream must not depend on how many rows shared the product
            out = (self.weight @ flat.T).T[:rows].contiguous()
            if self.bias is not None:
                out = out + self.bias
            return out.reshape(*x.shape[:-1], self.out_features)
        if (FP32_TRANSPOSED and FP32_TRANSPOSED_ROWS[0] <= rows <= FP32_TRANSPOSED_ROWS[1]
                and self.weight.numel() >= FP32_TRANSPOSED_WEIGHT
                and x.dtype == torch.float32 and x.device.type == "cpu"):  # fmt: skip
            out = (self.weight @ x.reshape(rows, width).T).T.contiguous()
            if self.bias is not None:
                out = out + self.bias
            return out.reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.weight, self.bias)


def row_invariant_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for decoding on reduced-precision CPU tensors whose result for a query does not depend on
    how many queries share the call; other inputs go to transformers' SDPA.

    ``query`` (B, H, Q, d) holds the last Q positions of the K keys (the cache layout of decoding), so
    without a mask query j sees keys ``0 .. K − Q + j``. Each step is row-invariant on its own: the products
    are bf16 matrix products of at least two rows (GQA packs the query heads of one key head into rows), a
    masked key after a query's last one contributes an exact 0, the softmax denominator is one more column
    of the probability-value product (``[V, 1]``) instead of a sum whose order would depend on K, and each
    row of a padded batch runs over its own keys, from its first attended one, so the products see the
    same key layout whatever the padding (which moves as the cache re-aligns rows). It is also
    faster than SDPA's CPU kernel for one query over a long cache (0.15 ms against 1.0 ms per layer at
    K = 1200)."""
    batch, heads, queries, dim = query.shape
    key_heads, keys = key.shape[1], key.shape[2]
    if (
        queries > MAX_ROWWISE_QUERIES
        or queries > keys
        or not needs_row_invariance(query)
        or heads % key_heads
        or kwargs.get("softcap") is not None
        or (dropout and module.training)
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    scale = dim**-0.5 if scaling is None else scaling
    allowed = None
    if attention_mask is not None:
        allowed = attention_mask[:, :1, -queries:, -keys:]
        if allowed.dtype != torch.bool:
            allowed = allowed == 0
    if exact_attention.kernel() is not None and exact_attention.supports(query, key, value):
        return exact_attention.exact_attention(query, key, value, allowed, scale), None
    if batch == 1 or allowed is None:
        return _attend(query, key, value, allowed, scale).transpose(1, 2).contiguous(), None
    # Each row over its own keys from its first attended one: left padding (which moves as rows are
    # re-aligned or leave the batch) then never shifts where a row's keys sit in the products.
    first = allowed[:, 0].any(dim=1).int().argmax(dim=-1).tolist()
    outputs = [
        _attend(
            query[b : b + 1],
            key[b : b + 1, :, s:],
            value[b : b + 1, :, s:],
            allowed[b : b + 1, ..., s:],
            scale,
        )
        for b, s in enumerate(first)
    ]
    return torch.cat(outputs).transpose(1, 2).contiguous(), None


def _attend(query, key, value, allowed, scale) -> torch.Tensor:
    """(B, H, Q, d) softmax attention of :func:`row_invariant_sdpa`; ``allowed`` (B, 1, Q, K) bool or None
    (causal over the last Q positions)."""
    batch, heads, queries, dim = query.shape
    key_heads, keys = key.shape[1], key.shape[2]
    group = heads // key_heads
    rows = query.reshape(batch, key_heads, group, queries, dim).transpose(2, 3)
    rows = rows.reshape(batch, key_heads, queries * group, dim)  # query-major: row = q * group + g
    scores = torch.matmul(rows, key.transpose(-1, -2)).float().mul_(scale)
    if allowed is not None:
        scores.masked_fill_(~allowed.repeat_interleave(group, dim=2), float("-inf"))
    elif queries > 1:
        later = torch.ones(queries, keys, dtype=torch.bool, device=query.device).triu_(keys - queries + 1)
        scores.masked_fill_(later.repeat_interleave(group, dim=0), float("-inf"))
    top = scores.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)  # a fully masked (padding) row
    weights = scores.sub_(top).exp_().to(query.dtype)
    # The probability-value product reduces over the keys, and the kernel's blocking of that reduction changes
    # with the number of keys (measured on AMD EPYC: 1019..1023 keys against 1025..1029 with the later ones
    # masked give other bits; on Intel Xeon with AMX already 34 against 35). Every chunk is therefore exactly
    # KEY_CHUNK keys from key 0, the last one padded with zero weights and zero values: a query's reduction is
    # the same however many keys follow it, its masked tail and the padding add exact zeros, and the partials
    # are added in order. The denominator is one more column of the values, ``[V, 1]``.
    width = value.shape[-1]  # may differ from the query / key width
    padded = -(-keys // KEY_CHUNK) * KEY_CHUNK
    value_one = value.new_zeros(*value.shape[:-2], padded, width + 1)
    value_one[..., :keys, :width] = value
    value_one[..., :keys, width] = 1
    weights = F.pad(weights, (0, padded - keys))
    summed = None
    for start in range(0, padded, KEY_CHUNK):
        part = torch.matmul(
            weights[..., start : start + KEY_CHUNK], value_one[..., start : start + KEY_CHUNK, :]
        )
        summed = part.float() if summed is None else summed.add_(part.float())
    width = value.shape[-1]  # may differ from the query / key width
    out = (summed[..., :width] / summed[..., width:].clamp(min=1e-30)).to(query.dtype)
    out = out.reshape(batch, key_heads, queries, group, width).transpose(2, 3)
    return out.reshape(batch, heads, queries, width)


AttentionInterface.register(ROWWISE_ATTENTION, row_invariant_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(ROWWISE_ATTENTION, sdpa_mask)


def use_row_invariant_forwards(model: nn.Module) -> int:
    """Give ``model`` the row-invariant linear layers and, when it uses SDPA, the row-wise attention.

    Only classes change (plain ``nn.Linear`` → :class:`RowInvariantLinear`; a subclass such as the
    small-batch LM head handles this itself), so parameters, tied weights, state dicts and hooks stay as
    they were. Both act on bf16 / fp16 CPU tensors (the linear layers also on few float32 CPU rows, through
    the small-linear kernel), checked per call, so a later ``.to()`` is fine.
    Returns the number of linear layers changed."""
    changed = 0
    for sub in model.modules():
        if type(sub) is nn.Linear:
            sub.__class__ = RowInvariantLinear
            changed += 1
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        config._attn_implementation = ROWWISE_ATTENTION
    return changed
