"""What does appending to the KV cache cost: transformers' concatenating DynamicCache against specbench's
in-place buffered layers (specbench/decoding/kv_buffer.py), on the embedded verifier.

For each dtype and each (batch, context) shape, both caches are filled with the same random prompt, then
``--steps`` one-token greedy steps run on each, interleaved round by round; a figure is the median step time
in ms, and the ratio is DynamicCache / buffered (above 1: the buffer is faster). Each row also says whether
both caches produced the same greedy tokens.

    python benchmarks/kv_cache.py --threads 1 --dtypes float32 bfloat16 --shapes 1x300 1x1000 32x300 32x800
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import benchmark_parser, embedded_verifier, record_run

from specbench.decoding.kv_buffer import buffered_cache
from specbench.results.record import figure

CACHES = {"DynamicCache": lambda config: DynamicCache(config=config), "buffered": buffered_cache}


def _shape(text: str) -> tuple[int, int]:
    batch, _, context = text.partition("x")
    return int(batch), int(context)


@torch.no_grad()
def _steps(model, prompt: torch.Tensor, make, steps: int) -> tuple[list[float], torch.Tensor]:
    cache = make(model.config)
    model(input_ids=prompt, cache=cache, use_cache=True)
    token, times, tokens = prompt[:, -1:], [], []
    for _ in range(steps):
        mask = torch.ones(prompt.shape[0], cache.get_seq_length() + 1, dtype=torch.long)
        start = time.perf_counter()
        out = model(input_ids=token, cache=cache, attention_mask=mask, use_cache=True)
        times.append(time.perf_counter() - start)
        token = out.logits[:, -1:].argmax(-1)
        tokens.append(token)
    return times, torch.cat(tokens, dim=1)


def measure(model, batch: int, context: int, steps: int, rounds: int) -> tuple[dict[str, float], bool]:
    prompt = torch.randint(100, 20000, (batch, context), generator=torch.Generator().manual_seed(context))
    times: dict[str, list[float]] = {name: [] for name in CACHES}
    outputs: dict[str, torch.Tensor] = {}
    for _ in range(rounds):
        for name, make in CACHES.items():
            spent, outputs[name] = _steps(model, prompt, make, steps)
            times[name] += spent
    medians = {name: statistics.median(spent) * 1000 for name, spent in times.items()}
    return medians, torch.equal(outputs["DynamicCache"], outputs["buffered"])


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__.splitlines()[0], threads=1)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--shapes", nargs="+", default=["1x300", "1x1000", "32x300", "32x800"],
                        help="BATCHxCONTEXT")  # fmt: skip
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    header = f"{'dtype':<9} {'batch':>5} {'context':>7} {'Dynamic ms':>10} {'buffered ms':>11} {'ratio':>6}"
    print(f"{header} same")
    rows = []
    for dtype in args.dtypes:
        model = embedded_verifier("cpu", dtype)[0].model
        for batch, context in map(_shape, args.shapes):
            ms, same = measure(model, batch, context, args.steps, args.rounds)
            ratio = ms["DynamicCache"] / ms["buffered"]
            print(f"{dtype:<9} {batch:>5} {context:>7} {ms['DynamicCache']:>10.1f} {ms['buffered']:>11.1f} "
                  f"{ratio:>5.2f}x {same}")  # fmt: skip
            rows.append({
                "setup": f"{dtype} batch {batch} context {context}", "identical_outputs": same,
                "figures": {
                    "dynamic_step_ms": figure(ms["DynamicCache"], unit="ms"),
                    "buffered_step_ms": figure(ms["buffered"], unit="ms"),
                    "dynamic_over_buffered": figure(ratio, unit="x"),
                },
            })  # fmt: skip
    record_run(
        args, "kv_cache", rows, "random token prompts", len(args.shapes), dtype="+".join(args.dtypes),
        threads=args.threads, doc="docs/benchmarks.md",
        notes=f"median of {args.steps * args.rounds} one-token steps per cache, interleaved",
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
