"""Our engine vs HF transformers on the same prompts, drafter and gamma, in one process.

Runs, per prompt and interleaved (so machine noise hits every method alike):
  hf_ar        verifier.generate(do_sample=False)
  hf_assisted  verifier.generate(assistant_model=drafter), constant gamma, confidence threshold 0
  ours_ar      SpeculativeEngine without a drafter (autoregressive)
  ours_sd      SpeculativeEngine with the same drafter, rule `sd`, constant gamma
checks that all outputs are token-identical, and prints tokens/s (aggregate and median per prompt),
the ratios, and the engine's τ, acceptance, cost ratio c, predicted speedup S and efficiency.

    python benchmarks/engine_vs_hf.py --questions ../shared/data/spec_bench/question.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import benchmark_parser

from specbench.data.prompts import load_jsonl
from specbench.data.templates import encode_prompt
from specbench.decoding import DraftSchedule, GenerationSettings, SpeculativeEngine, VerificationRule
from specbench.decoding.metrics import summarize
from specbench.decoding.model_drafter import ModelDrafter
from specbench.evaluation import eos_token_ids, pad_token_id
from specbench.models import ModelSpec, load_verifier, shared_vocab_size, synchronize
from specbench.pairs import load_drafter
from specbench.results import bootstrap_interval, record_run
from specbench.results.record import figure


def parse_args(argv=None) -> argparse.Namespace:
    parser = benchmark_parser(
        __doc__, questions={"required": True, "help": "Spec-Bench question.jsonl (or any prompt jsonl)"},
        num_prompts=10, max_new_tokens=96, device="auto", dtype="float32", threads=None,
    )  # fmt: skip
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--drafter-layers", type=int, default=4, help="K of the early-exit drafter")
    parser.add_argument("--drafter", default=None, help="hub id / local path of a separate drafter instead")
    parser.add_argument("--verifier", default=None, help="hub id / local path (default: embedded SmolLM2)")
    parser.add_argument("--json-out", default=None, help="also write the figures to this JSON file")
    return parser.parse_args(argv)


def load_pair(args):
    verifier_spec = (
        ModelSpec(kind="embedded") if args.verifier is None
        else ModelSpec(kind="local" if Path(args.verifier).exists() else "hub", path=args.verifier)
    )
    verifier = load_verifier(verifier_spec, args.device, args.dtype)
    if args.drafter is None:
        drafter_spec = ModelSpec(kind="early_exit", num_layers=args.drafter_layers)
    else:
        drafter_spec = ModelSpec(kind="local" if Path(args.drafter).exists() else "hub", path=args.drafter)
    drafter = load_drafter(drafter_spec, verifier, args.device, args.dtype)
    return verifier, drafter


def hf_generate(verifier, drafter, ids, max_new_tokens, eos, pad):
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False, "eos_token_id": eos, "pad_token_id": pad}
    if drafter is not None:
        kwargs["assistant_model"] = drafter
    out = verifier.generate(torch.tensor([ids], device=verifier.device), **kwargs)
    return out[0, len(ids):].tolist()


def configure_hf_assistant(drafter, gamma: int) -> None:
    # HF reads these from the assistant's generation config.
    drafter.generation_config.num_assistant_tokens = gamma
    drafter.generation_config.num_assistant_tokens_schedule = "constant"
    drafter.generation_config.assistant_confidence_threshold = 0.0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    verifier, drafter = load_pair(args)
    vocab = shared_vocab_size(verifier.model, drafter.model, verifier.tokenizer, drafter.tokenizer)
    tokenizer = verifier.tokenizer
    eos = eos_token_ids(verifier.model, tokenizer)
    pad = pad_token_id(tokenizer, eos)
    prompts = load_jsonl(args.questions, limit=args.num_prompts)
    encoded = [encode_prompt(tokenizer, p.text)[0] for p in prompts]
    configure_hf_assistant(drafter.model, args.gamma)

    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    schedule = DraftSchedule("constant", args.gamma)
    common = {"settings": settings, "vocab_size": vocab, "eos_token_ids": eos, "pad_token_id": pad}
    ours_sd = SpeculativeEngine(
        verifier.model, ModelDrafter(drafter.model, vocab), VerificationRule(), schedule, **common
    )
    ours_ar = SpeculativeEngine(verifier.model, None, None, schedule, **common)

    device = verifier.model.device
    runners = {
        "hf_ar": lambda ids: (hf_generate(verifier.model, None, ids, args.max_new_tokens, eos, pad), None),
        "hf_assisted": lambda ids: (
            hf_generate(verifier.model, drafter.model, ids, args.max_new_tokens, eos, pad),
            None,
        ),
        "ours_ar": lambda ids: _ours(ours_ar, ids),
        "ours_sd": lambda ids: _ours(ours_sd, ids),
    }
    for run in runners.values():  # warm-up
        run(encoded[0][:32])

    times, tokens, outputs, engine_results = time_runners(runners, encoded, device)
    identical = all(outputs[name] == outputs["hf_ar"] for name in runners)
    mismatched = [name for name in runners if outputs[name] != outputs["hf_ar"]]
    figures = {name: _throughput(tokens[name], times[name]) for name in runners}
    metrics = summarize(engine_results, wall_time=sum(times["ours_sd"]),
                        baseline_tokens_per_s=figures["ours_ar"]["tokens_per_s"])
    report = {
        "device": str(device), "dtype": str(verifier.model.dtype), "verifier": verifier.name,
        "drafter": drafter.name, "gamma": args.gamma, "num_prompts": len(encoded),
        "max_new_tokens": args.max_new_tokens, "identical_outputs": identical, "mismatched": mismatched,
        "throughput": figures,
        "ours_sd_vs_hf_assisted": figures["ours_sd"]["tokens_per_s"] / figures["hf_assisted"]["tokens_per_s"],
        "ours_ar_vs_hf_ar": figures["ours_ar"]["tokens_per_s"] / figures["hf_ar"]["tokens_per_s"],
        "hf_assisted_vs_hf_ar": figures["hf_assisted"]["tokens_per_s"] / figures["hf_ar"]["tokens_per_s"],
        "engine": {k: metrics[k] for k in ("tau", "acceptance_rate", "cost_ratio", "predicted_speedup",
                                           "speedup", "efficiency") if k in metrics},
        # Share of the engine's wall time spent inside drafter/verifier forwards (the rest is loop overhead
        # and prefill); at batch 1 the per-round times are not shared between rows.
        "forward_time_share": sum(r.draft_time + r.verify_time for res in engine_results for r in res.rounds)
        / sum(times["ours_sd"]),
    }
    _print_report(report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    record_run(
        args,
        "engine_vs_hf",
        record_rows(report, tokens, times, outputs, _drafter_label(args, drafter)),
        f"{Path(args.questions).parent.name}/{Path(args.questions).name}, first {len(encoded)}",
        len(encoded),
        device=report["device"],
        dtype=report["dtype"].removeprefix("torch."),
        threads=torch.get_num_threads(),
        doc="docs/benchmarks.md#engine-vs-hf-transformers",
        notes=f"{report['verifier']} / {report['drafter']}, {args.max_new_tokens} new tokens, greedy; "
        "speedup against HF generate (autoregressive)",
    )
    return 0 if identical else 1


def time_runners(runners: dict, encoded: list[list[int]], device) -> tuple[dict, dict, dict, list]:
    """Every runner on every prompt in turn: seconds, output lengths and outputs per runner, and the engine
    results of ``ours_sd``."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    tokens: dict[str, list[int]] = {name: [] for name in runners}
    outputs: dict[str, list] = {name: [] for name in runners}
    engine_results = []
    for index, ids in enumerate(encoded):
        for name, run in runners.items():
            synchronize(device)
            start = time.perf_counter()
            out, result = run(ids)
            synchronize(device)
            times[name].append(time.perf_counter() - start)
            tokens[name].append(len(out))
            outputs[name].append(out)
            if name == "ours_sd":
                engine_results.append(result)
        print(f"prompt {index + 1}/{len(encoded)}: " + ", ".join(
            f"{n} {tokens[n][-1] / times[n][-1]:.1f} tok/s" for n in runners), file=sys.stderr)  # fmt: skip
    return times, tokens, outputs, engine_results


def _drafter_label(args, drafter) -> str:
    return f"early exit K={args.drafter_layers}" if args.drafter is None else drafter.name


def _rate(pairs) -> float:
    """Aggregate tokens/s of (tokens, seconds) pairs."""
    return sum(n for n, _ in pairs) / max(sum(t for _, t in pairs), 1e-9)


def record_rows(report: dict, tokens: dict[str, list[int]], times: dict[str, list[float]],
                outputs: dict[str, list], drafter: str) -> list[dict]:
    """Result-record rows, one per method: tokens/s (aggregate, with the median per prompt and a bootstrap
    interval over prompts), the speedup against HF generate (the same, per prompt paired) and, for the
    engine's sd row, τ, acceptance, c, the predicted speedup S, efficiency and the share of time in
    forwards."""
    gamma = report["gamma"]
    setups = {
        "hf_ar": "HF generate, autoregressive",
        "hf_assisted": f"HF assisted generation, {drafter}, γ={gamma}",
        "ours_ar": "specbench autoregressive",
        "ours_sd": f"specbench sd, {drafter}, γ={gamma}",
    }  # fmt: skip
    base = list(zip(tokens["hf_ar"], times["hf_ar"]))
    rows = []
    for name, setup in setups.items():
        own = list(zip(tokens[name], times[name]))
        speed = figure(_rate(own))
        speedup = figure(_rate(own) / _rate(base), unit="x")
        if name == "hf_ar":
            speedup = figure(1.0, unit="x")  # the reference
        if len(own) >= 2:
            speed["median"] = report["throughput"][name]["median_tokens_per_s"]
            speed["interval"] = list(bootstrap_interval(own, _rate))
        if len(own) >= 2 and name != "hf_ar":
            paired = list(zip(own, base))
            speedup["median"] = statistics.median(
                (n / t) / (nb / tb) for (n, t), (nb, tb) in paired if t > 0 and tb > 0
            )
            speedup["interval"] = list(bootstrap_interval(
                paired, lambda xs: _rate([a for a, _ in xs]) / _rate([b for _, b in xs])))  # fmt: skip
        figures = {"tokens_per_s": speed, "speedup": speedup}
        if name == "ours_sd":
            engine = report["engine"]
            for key, label in (("tau", "tau"), ("acceptance_rate", "acceptance"), ("cost_ratio", "c"),
                               ("predicted_speedup", "predicted_speedup"),
                               ("efficiency", "efficiency")):  # fmt: skip
                if isinstance(engine.get(key), (int, float)) and engine[key] == engine[key]:
                    figures[label] = figure(engine[key])
            figures["forward_share"] = figure(100.0 * report["forward_time_share"], unit="%")
        rows.append(
            {"setup": setup, "figures": figures, "identical_outputs": outputs[name] == outputs["hf_ar"]}
        )
    return rows


def _ours(engine: SpeculativeEngine, ids):
    result = engine.generate([ids])[0]
    return result.output_ids, result


def _throughput(tokens: list[int], times: list[float]) -> dict:
    per_prompt = [n / t for n, t in zip(tokens, times) if t > 0]
    return {"tokens_per_s": sum(tokens) / sum(times), "median_tokens_per_s": statistics.median(per_prompt),
            "new_tokens": sum(tokens), "seconds": sum(times)}


def _print_report(report: dict) -> None:
    print(f"\n{report['verifier']} / {report['drafter']}  gamma={report['gamma']}  "
          f"{report['num_prompts']} prompts x {report['max_new_tokens']} new tokens  on {report['device']} "
          f"({report['dtype']})")
    print(f"{'method':<13}{'tokens/s':>10}{'median':>10}{'vs hf_ar':>10}")
    base = report["throughput"]["hf_ar"]["tokens_per_s"]
    for name, fig in report["throughput"].items():
        print(f"{name:<13}{fig['tokens_per_s']:>10.2f}{fig['median_tokens_per_s']:>10.2f}"
              f"{fig['tokens_per_s'] / base:>10.2f}")
    engine = report["engine"]
    print(
        f"\nours_sd / hf_assisted = {report['ours_sd_vs_hf_assisted']:.2f}x   "
        f"ours_ar / hf_ar = {report['ours_ar_vs_hf_ar']:.2f}x   identical outputs: "
        f"{report['identical_outputs']}"
        + (f" (mismatch: {report['mismatched']})" if report["mismatched"] else "")
    )
    print("engine: " + "  ".join(f"{k}={v:.3f}" for k, v in engine.items())
          + f"  forward_time_share={report['forward_time_share']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
