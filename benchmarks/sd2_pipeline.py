"""SD² end to end on the embedded pair: synth → train (distill, sd2) → eval, one table.

    python benchmarks/sd2_pipeline.py [--out runs/sd2-pipeline] [--synth-prompts 256] [--steps 120]

Every step is a ``launch.py`` run of ``experiment=cpu-sd2`` (conf/experiment/cpu-sd2.yaml); a step whose
output exists is skipped, so a rerun resumes. The drafters (pretrained early exit, distilled, SD²) see
the same synthetic data and the same number of steps; they are evaluated on held-out Spec-Bench
questions (``dataset.subset=heldout``, never used for synth), greedy and at T = 1, each next to
autoregressive decoding of the verifier in the same process. Prints τ, acceptance, tokens/s and speedup,
and the issue's targets: τ(SD²) ≥ 1.15 × τ(distilled) > τ(pretrained); SD² faster than autoregressive.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRAFTERS = {
    "pretrained": ["method=sd", "steering=none"],
    "distilled": ["method=distill", "steering=none", "method.drafter_checkpoint={out}/distill/trained.pt"],
    "sd2": ["method=sd2", "steering=sd2", "steering.checkpoint={out}/sd2/trained.pt"],
}


def launch(args: list[str], log: Path, timings: dict[str, float], step: str) -> None:
    """Run ``launch.py experiment=cpu-sd2 ARGS`` (output to ``log``); record its seconds as ``step``."""
    start = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as handle:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "launch.py"), "experiment=cpu-sd2", *args],
            cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False,
        )
    if proc.returncode != 0:
        sys.exit(f"step failed ({proc.returncode}): launch.py {' '.join(args)}\n  see {log}")
    timings[step] = time.perf_counter() - start
    path = log.parent.parent / "timings.json"  # kept across reruns: a resumed pipeline still reports every step
    path.write_text(json.dumps(timings, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "sd2-pipeline")
    parser.add_argument("--synth-prompts", type=int, default=256, help="training-part Spec-Bench prompts to sample")
    parser.add_argument("--steps", type=int, default=120, help="optimiser steps for both distill and sd2")
    parser.add_argument("--eval-prompts", type=int, default=12, help="held-out prompts per evaluation")
    parser.add_argument("--temperatures", default="0.0,1.0")
    parser.add_argument("extra", nargs="*", help="more launch.py overrides for every step")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    saved = out / "timings.json"
    timings: dict[str, float] = json.loads(saved.read_text()) if saved.exists() else {}
    extra = list(args.extra)

    if not (out / "synth" / "dataset").exists():
        launch(
            ["task=synth", "dataset.subset=train", f"dataset.limit={args.synth_prompts}",
             f"synth.output_dir={out / 'synth'}", f"hydra.run.dir={out / 'hydra' / 'synth'}", *extra],
            out / "logs" / "synth.log", timings, "synth",
        )
    for name, method in (("distill", ["method=distill", "steering=none"]), ("sd2", ["method=sd2", "steering=sd2"])):
        if not (out / name / "trained.pt").exists():
            launch(
                ["task=train", *method, f"train.data={out / 'synth'}", f"train.max_steps={args.steps}",
                 f"train.output_dir={out / name}", f"hydra.run.dir={out / 'hydra' / name}", *extra],
                out / "logs" / f"train_{name}.log", timings, f"train_{name}",
            )
    results = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        for drafter, overrides in DRAFTERS.items():
            run = out / "eval" / f"{drafter}-T{temperature:g}"
            if not (run / "metrics.json").exists():
                launch(
                    [*[o.format(out=out) for o in overrides], f"gen.temperature={temperature}",
                     f"dataset.limit={args.eval_prompts}", f"eval.output_dir={run}",
                     f"hydra.run.dir={out / 'hydra' / run.name}", *extra],
                    out / "logs" / f"eval_{run.name}.log", timings, f"eval_{run.name}",
                )
            metrics = json.loads((run / "metrics.json").read_text())
            results.append({**metrics, "drafter": drafter, "temperature": temperature})
    print_table(results, timings, out)


def print_table(results: list[dict], timings: dict[str, float], out: Path) -> None:
    header = f"{'drafter':<11} {'T':>4} {'tau':>6} {'accept':>7} {'tok/s':>7} {'AR tok/s':>9} {'speedup':>8} {'=AR':>5}"
    lines = [header, "-" * len(header)]
    for r in results:
        match = r.get("baseline_match_rate")
        lines.append(
            f"{r['drafter']:<11} {r['temperature']:>4g} {r['tau']:>6.3f} {r['acceptance_rate']:>7.3f} "
            f"{r['tokens_per_s']:>7.2f} {r.get('baseline_tokens_per_s', float('nan')):>9.2f} "
            f"{r.get('speedup', float('nan')):>7.2f}x {'' if match is None else f'{match:.2f}':>5}"
        )
    lines.append("")
    for temperature in sorted({r["temperature"] for r in results}):
        tau = {r["drafter"]: r["tau"] for r in results if r["temperature"] == temperature}
        sd2 = next(r for r in results if r["temperature"] == temperature and r["drafter"] == "sd2")
        lines.append(
            f"T={temperature:g}: tau(sd2)/tau(distilled) = {tau['sd2'] / tau['distilled']:.3f} (target >= 1.15), "
            f"tau(distilled) > tau(pretrained): {tau['distilled'] > tau['pretrained']}, "
            f"sd2 speedup over autoregressive {sd2.get('speedup', float('nan')):.2f}x (target > 1)"
        )
    if timings:
        lines.append("step wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    text = "\n".join(lines)
    print(text)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"results": results, "timings_s": timings}, indent=2) + "\n")


if __name__ == "__main__":
    main()
