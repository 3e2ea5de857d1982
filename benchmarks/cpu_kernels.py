"""What exact bf16 decoding costs in the kernels on this CPU: the few-row products and the attention.

Side by side, median of repeated calls, 1 thread by default:

- per SmolLM2-135M linear shape and row count: ``F.linear`` and the transposed product ``(W @ xᵀ)ᵀ`` in bf16
  (the two row-invariant products :class:`~specbench.models.row_invariant.RowInvariantLinear` chooses from,
  ``LINEAR_PRODUCT``) and ``F.linear`` in float32; and whether ``F.linear`` of one bf16 row gives the bits
  that row gets in a block (it does not for every shape, hence the two-row copy);
- 1 / 4 / 16 queries over 64 / 300 / 700 / 2048 cached keys (9 query heads, 3 key heads, head size 64): the
  exact row-invariant attention, compiled (``exact_attention.c``, what ``sdpa_rowwise`` calls where it is
  built) and its torch formulation (the fallback), against transformers' SDPA with a boolean mask over the
  keys (what ``generate`` and a verification pass it).

    python benchmarks/cpu_kernels.py --threads 1
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import benchmark_parser

from specbench.models import exact_attention, row_invariant
from specbench.results.record import figure
from specbench.results.run import record_run

SHAPES = {
    "q/o": (576, 576), "k/v": (192, 576), "up": (1536, 576), "down": (576, 1536), "lm_head": (49152, 576),
}  # fmt: skip
ROWS = (1, 2, 4, 8, 11)
QUERIES = (1, 4, 16)  # the verify shapes: a block of γ + 1 rows
KEYS = (64, 300, 700, 2048)


def median_ms(call, repeats: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return 1000.0 * statistics.median(times)


def _transposed(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (weight @ x.T).T.contiguous()


def linear_rows(repeats: int) -> list[dict]:
    rows, generator = [], torch.Generator().manual_seed(0)
    for name, (out_features, in_features) in SHAPES.items():
        weight = torch.randn(out_features, in_features, generator=generator) * in_features**-0.5
        bf16, n = weight.bfloat16(), max(repeats // 10, 5) if out_features > 10_000 else repeats
        for count in ROWS:
            x = torch.randn(count, in_features, generator=generator)
            xb = x.bfloat16()
            block = torch.cat((xb, xb))  # at least two rows
            one_row_exact = torch.equal(F.linear(xb[:1], bf16)[0], F.linear(block, bf16)[0])
            figures = {
                "bf16_linear_ms": figure(median_ms(partial(F.linear, xb, bf16), n), unit="ms"),
                "bf16_transposed_ms": figure(median_ms(partial(_transposed, bf16, xb), n), unit="ms"),
                "fp32_linear_ms": figure(median_ms(partial(F.linear, x, weight), n), unit="ms"),
                "bf16_one_row_same_bits": figure(float(one_row_exact)),
            }
            setup = f"linear {name} {count} row(s)"
            rows.append({"setup": setup, "figures": figures, "identical_outputs": None})
    return rows


class _Attention(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def attention_rows(repeats: int) -> list[dict]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module, generator, rows = _Attention().eval(), torch.Generator().manual_seed(1), []
    compiled = exact_attention.kernel() is not None
    for queries, keys in itertools.product(QUERIES, KEYS):
        q = torch.randn(1, 9, queries, 64, generator=generator).bfloat16()
        k, v = (torch.randn(1, 3, keys, 64, generator=generator).bfloat16() for _ in range(2))
        # what transformers' generate / a verification passes SDPA: a boolean mask over the keys
        allowed = torch.ones(1, 1, queries, keys, dtype=torch.bool).tril_(keys - queries)
        sdpa = median_ms(partial(sdpa_attention_forward, module, q, k, v, allowed, scaling=0.125), repeats)
        torch_form = median_ms(partial(row_invariant._attend, q, k, v, None, 0.125), repeats)
        figures = {"sdpa_ms": figure(sdpa, unit="ms"), "torch_rowwise_ms": figure(torch_form, unit="ms"),
                   "torch_rowwise_over_sdpa": figure(torch_form / sdpa, unit="x")}  # fmt: skip
        if compiled:
            kernel = median_ms(partial(exact_attention.exact_attention, q, k, v, None, 0.125), repeats)
            figures |= {
                "kernel_ms": figure(kernel, unit="ms"),
                "kernel_over_sdpa": figure(kernel / sdpa, unit="x"),
            }
        setup = f"attention {queries} quer{'y' if queries == 1 else 'ies'}, {keys} keys"
        rows.append({"setup": setup, "identical_outputs": None, "figures": figures})
    return rows


def main(argv=None) -> int:
    parser = benchmark_parser(__doc__, threads=1)
    parser.add_argument("--repeats", type=int, default=200, help="calls timed per figure (LM head: a tenth)")
    parser.add_argument("--attention-only", action="store_true", help="time the attention rows only")
    parser.add_argument("--notes", default="", help="appended to the record's notes (e.g. machine load)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = ([] if args.attention_only else linear_rows(args.repeats)) + attention_rows(args.repeats)
    print(f"LINEAR_PRODUCT on this CPU: {row_invariant.LINEAR_PRODUCT}")
    for row in rows:
        cells = "  ".join(f"{key} {value['value']:.3f}" for key, value in row["figures"].items())
        print(f"{row['setup']:<30} {cells}")
    notes = (
        f"median of {args.repeats} calls; LINEAR_PRODUCT={row_invariant.LINEAR_PRODUCT}; exact attention "
        f"kernel {'built' if exact_attention.kernel() else 'not built'}. {args.notes}"
    ).strip()
    record_run(args, "cpu_kernels", rows, "synthetic tensors (SmolLM2-135M shapes)", len(rows),
               dtype="bfloat16,float32", threads=args.threads,
               doc="docs/engine.md#bf16-on-a-cpu-row-invariant-forwards", notes=notes)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
