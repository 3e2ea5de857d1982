"""How many response tokens per second does task=synth sample, batched, against one autoregressive stream?

Both run :func:`specbench.pipelines.synthesize.synthesize` (what ``task=synth`` runs) on the embedded verifier
in one process, on training-part Spec-Bench questions (never held-out ones): ``--single-prompts`` prompts at
batch size 1, then ``--batch-size`` x ``--batches`` prompts batched, the same token budget per row; the figure
is generated tokens over decoding seconds (prefill included), and the ratio is what batching buys.

    python benchmarks/synth_throughput.py --threads 1 --dtype float32 --batch-size 32 --max-new-tokens 128
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import benchmark_parser, embedded_verifier

from specbench.data.dataset_config import dataset_settings
from specbench.data.datasets import load_dataset_prompts
from specbench.pipelines.synth_plan import SynthSettings
from specbench.pipelines.synthesize import synthesize
from specbench.results import record_run
from specbench.results.record import figure


def measure(verifier, prompts, settings: SynthSettings, dataset) -> tuple[int, float]:
    """(generated tokens, decoding seconds) of one synthesize() call into a throwaway dir."""
    with tempfile.TemporaryDirectory(prefix="specbench-synth-bench-") as out:
        result = synthesize(verifier, prompts, settings, out, dataset=dataset, progress=False)
    return result.new_generated_tokens, result.wall_time_s


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__.splitlines()[0], max_new_tokens=128, threads=1, dtype="float32")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=1, help="batches in the batched measurement")
    parser.add_argument("--single-prompts", type=int, default=4, help="prompts decoded one at a time")
    parser.add_argument("--max-prompt-len", type=int, default=512)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    verifier = embedded_verifier("cpu", args.dtype)[0]
    dataset = dataset_settings({"name": "spec_bench", "subset": "train"})
    prompts = load_dataset_prompts(dataset)
    common = {
        "target_len": args.max_prompt_len + args.max_new_tokens, "max_prompt_len": args.max_prompt_len,
        "temperature": 0.0, "max_new_tokens": args.max_new_tokens, "validation_fraction": 0.0,
    }  # fmt: skip
    warm = SynthSettings(batch_size=2, **{**common, "max_new_tokens": 4})
    measure(verifier, prompts[:2], warm, dataset)
    batched_count = args.batch_size * args.batches
    # the single stream takes prompts spread over the batched set, so both see the same mix of lengths
    step = max(batched_count // args.single_prompts, 1)
    single_prompts = prompts[:batched_count:step][: args.single_prompts]
    single = measure(verifier, single_prompts, SynthSettings(batch_size=1, **common), dataset)
    batched = measure(
        verifier, prompts[:batched_count], SynthSettings(batch_size=args.batch_size, **common), dataset
    )
    rates = {"single stream": single[0] / single[1], f"batch {args.batch_size}": batched[0] / batched[1]}
    print(f"{'setup':<16} {'tokens':>8} {'seconds':>9} {'tokens/s':>9} {'vs single':>9}")
    rows = []
    for (label, rate), (tokens, seconds) in zip(rates.items(), (single, batched)):
        ratio = rate / rates["single stream"]
        print(f"{label:<16} {tokens:>8} {seconds:>9.1f} {rate:>9.1f} {ratio:>8.2f}x")
        rows.append({
            "setup": label, "identical_outputs": None, "notes": f"{tokens} tokens in {seconds:.1f} s",
            "figures": {
                "tokens_per_s": figure(rate, unit="tokens/s"), "vs_single_stream": figure(ratio, unit="x"),
            },
        })  # fmt: skip
    record_run(
        args, "synth_throughput", rows, "Spec-Bench train part (first prompts)", batched_count,
        dtype=args.dtype, threads=args.threads, doc="docs/synthetic-data.md",
        notes=f"greedy, {args.max_new_tokens} new tokens per row, prompts <= {args.max_prompt_len} tokens; "
        "decoding seconds include the prefill",
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
