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

With ``--fp32``, instead: the float32 few-row products and what they make of a verification forward.

- per shape and row count (1..16): ``F.linear``, the transposed product, ``addmm``, ``bmm``, ``einsum``,
  ``mv`` per row and the compiled small-linear kernel (``small_linear.c``, what float32 linear layers of
  1..12 rows take where it is built), taken in turn on each repeat, over enough copies of the weights that
  they come from memory, as in a forward (the LM head alone is larger than the caches); ratios to
  ``F.linear``'s one-row time;
- v(n) of the embedded SmolLM2-135M-Instruct verifier in float32, n = 1..``--max-n`` new tokens after 256
  cached ones, with the kernel on and off (off: the products before it, the LM head's transposed product for
  2..64 rows), the two taking turns in every round; ratios to the one-row forward without the kernel and,
  for the kernel, to its own one-row forward.

    python benchmarks/cpu_kernels.py --threads 1
    python benchmarks/cpu_kernels.py --threads 1 --fp32
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
from harness import benchmark_parser, embedded_verifier, verify_ms_in_turn

from specbench.models import exact_attention, row_invariant, small_linear
from specbench.results.record import figure
from specbench.results.run import record_run

SHAPES = {
    "q/o": (576, 576), "k/v": (192, 576), "up": (1536, 576), "down": (576, 1536), "lm_head": (49152, 576),
}  # fmt: skip
ROWS = (1, 2, 4, 8, 11)
QUERIES = (1, 4, 16)  # the verify shapes: a block of γ + 1 rows
KEYS = (64, 300, 700, 2048)
FP32_ROWS = (1, 2, 3, 4, 8, 11, 12, 16)
COLD_BYTES = 96 << 20  # weight copies cycled per timing: above the caches (32 MiB of L3 here)


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


def _fp32_products() -> dict:
    """The float32 forms of ``x @ wᵀ`` that ``--fp32`` times: torch's, then the kernel where it is built."""
    return {
        "linear": F.linear,
        "transposed": lambda x, w: (w @ x.T).T,
        "addmm": lambda x, w: torch.addmm(w.new_zeros(w.shape[0]), x, w.T),
        "bmm": lambda x, w: torch.bmm(x[None], w.T[None])[0],
        "einsum": lambda x, w: torch.einsum("mk,jk->mj", x, w),
        "mv_per_row": lambda x, w: torch.stack([torch.mv(w, row) for row in x]),
        "kernel": small_linear.linear if small_linear.kernel() is not None else None,
    }


def fp32_linear_rows(repeats: int) -> list[dict]:
    """float32 F.linear, transposed product and kernel per shape and rows in turn, weights from memory."""
    rows, generator = [], torch.Generator().manual_seed(0)
    for name, (out_features, in_features) in SHAPES.items():
        copies = max(1, COLD_BYTES // (4 * out_features * in_features))
        weights = [torch.randn(out_features, in_features, generator=generator) for _ in range(copies)]
        inputs = {n: torch.randn(n, in_features, generator=generator) for n in FP32_ROWS}
        products = {key: call for key, call in _fp32_products().items() if call is not None}
        times = {(n, key): [] for n in FP32_ROWS for key in products}
        for _ in range(min(max(repeats // copies, 5), 40) + 1):  # the first round warms up
            for (n, key), taken in times.items():
                begin = time.perf_counter()
                for weight in weights:
                    products[key](inputs[n], weight)
                taken.append((time.perf_counter() - begin) / copies)
        ms = {pair: 1000.0 * statistics.median(values[1:]) for pair, values in times.items()}
        one = ms[1, "linear"]
        for n in FP32_ROWS:
            figures = {f"{key}_ms": figure(ms[n, key], unit="ms") for key in products}
            figures |= {f"{key}_over_linear_1_row": figure(ms[n, key] / one, unit="x") for key in products}
            rows.append({"setup": f"fp32 {name} {n} row(s)", "figures": figures, "identical_outputs": None})
    return rows


def fp32_verify_rows(rounds: int, max_n: int) -> list[dict]:
    """v(n) of the float32 embedded verifier with the small-linear kernel off and on, in turn."""
    verifier, _, _, vocab = embedded_verifier()

    def switch(on: bool):
        return lambda: setattr(small_linear, "ENABLED", on)

    model = verifier.model
    setups = {
        "torch products": (model, switch(False), 256),
        "small-linear kernel": (model, switch(True), 256),
    }
    ms = verify_ms_in_turn(setups, vocab, max_n, rounds)
    small_linear.ENABLED = True
    one, rows = ms["torch products"][0], []
    for name, times in ms.items():
        figures = {f"v{n + 1}": figure(round(t / one, 2)) for n, t in enumerate(times)}
        figures |= {f"ms{n + 1}": figure(round(t, 1), unit="ms") for n, t in enumerate(times)}
        if name != "torch products":
            figures |= {f"own_v{n + 1}": figure(round(t / times[0], 2)) for n, t in enumerate(times)}
        setup = f"v(n), float32 verifier, {name}"
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
    parser.add_argument("--fp32", action="store_true", help="the float32 products and v(n) instead")
    parser.add_argument("--rounds", type=int, default=7, help="--fp32: v(n) rounds per setup (medians)")
    parser.add_argument("--max-n", type=int, default=12, help="--fp32: v(n) up to this many new tokens")
    parser.add_argument("--notes", default="", help="appended to the record's notes (e.g. machine load)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.fp32:
        return fp32_main(args)
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


def fp32_main(args) -> int:
    rows = fp32_linear_rows(args.repeats) + fp32_verify_rows(args.rounds, args.max_n)
    for row in rows:
        cells = "  ".join(f"{key} {value['value']:.3f}" for key, value in row["figures"].items()
                          if not key.startswith("ms"))  # fmt: skip
        print(f"{row['setup']:<44} {cells}")
    notes = (
        f"float32, {args.threads} thread(s); products: medians over repeats of {COLD_BYTES >> 20} MiB of "
        f"weight copies, the forms in turn; v(n): 256 cached tokens, {args.rounds} rounds, kernel off and on "
        f"in turn; small-linear kernel {'built' if small_linear.kernel() else 'not built'}. {args.notes}"
    ).strip()
    prompts = "synthetic tensors (SmolLM2-135M shapes) and random tokens"
    record_run(args, "cpu_kernels", rows, prompts, len(rows), dtype="float32", threads=args.threads,
               doc="docs/engine.md#verification-cost-on-a-cpu", notes=notes)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
