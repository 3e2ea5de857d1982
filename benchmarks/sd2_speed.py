"""SD² speed, interleaved: the drafters of one ``benchmarks/sd2_pipeline.py`` run against autoregressive
decoding, question by question in one process, on held-out Spec-Bench questions.

The pipeline evaluates each drafter in its own process, next to that process's own autoregressive run.
On a shared machine two processes' autoregressive rates differ by 5–10 %, as much as the margin this
measures. Here autoregressive decoding and every drafter decode each question in turn, in rotating order
(``harness.run_all``), so a change of load falls on every row alike. Each row is built from the same
``experiment=cpu-sd2`` overrides as the pipeline's evaluation of it (checkpoint, draft vocabulary, taps).
Greedy: every output must be token-identical to autoregressive decoding (exit 1 otherwise).

    python benchmarks/sd2_speed.py --run /work/data/sd2_bf16_all --gammas 1 --per-task 4 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    all_identical,
    benchmark_parser,
    decode_and_report,
    engine_runner,
    heldout_questions,
    out_dir,
)
from sd2_pipeline import DRAFTERS, ROOT, TAPS, TRAINED_BY

from specbench.config.validate import validate
from specbench.evaluation import build_engines
from specbench.models.loading import load_verifier
from specbench.pairs import load_drafter
from specbench.tasks.base import verifier_placement
from specbench.tasks.method_parts import load_method_parts


def composed(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


def overrides_for(drafter: str, run: Path, gamma: int, args: argparse.Namespace) -> list[str]:
    vocab = ([f"model.drafter.draft_vocab={run / 'synth'}",
              f"model.drafter.draft_vocab_size={args.draft_vocab_size}"]
             if args.draft_vocab_size else [])  # fmt: skip
    return [
        "experiment=cpu-sd2", *[o.format(out=run) for o in DRAFTERS[drafter]], f"schedule.gamma={gamma}",
        f"runtime.dtype={args.dtype}", f"runtime.num_threads={args.threads}", f"steering.v_layers={TAPS}",
        f"gen.max_new_tokens={args.max_new_tokens}", "gen.temperature=0.0", "tracking=none", *vocab,
    ]  # fmt: skip


def main() -> int:
    parser = benchmark_parser(__doc__, per_task=4, max_new_tokens=48, dtype="bfloat16", threads=1)
    parser.add_argument("--run", type=Path, required=True, help="the --out folder of a sd2_pipeline.py run")
    parser.add_argument("--drafters", default="distilled,sd2", help=f"comma list from {','.join(DRAFTERS)}")
    parser.add_argument(
        "--gammas", default="1", help="comma list of constant draft lengths (a row per drafter and γ)"
    )
    parser.add_argument("--draft-vocab-size", type=int, default=8192, help="as the pipeline run's (0: full)")
    parser.add_argument("--out")
    args = parser.parse_args()
    run = args.run.resolve()
    drafters = [d for d in args.drafters.split(",") if d]
    if unknown := sorted(set(drafters) - set(DRAFTERS)):
        raise SystemExit(f"--drafters: unknown {unknown}; choose from {', '.join(DRAFTERS)}")
    for drafter in drafters:
        trained = run / TRAINED_BY[drafter] / "trained.pt" if drafter != "pretrained" else None
        if trained is not None and not trained.exists():
            raise SystemExit(
                f"--run {run}: no {trained}; train it with benchmarks/sd2_pipeline.py --out {run}"
            )
    gammas = [int(g) for g in args.gammas.split(",") if g]
    torch.set_num_threads(args.threads)
    out = out_dir(args.out, "sd2-speed")
    out.mkdir(parents=True, exist_ok=True)

    plans = {
        (d, g): validate(composed(overrides_for(d, run, g, args))).resolve() for d in drafters for g in gammas
    }
    first = next(iter(plans.values()))
    verifier = load_verifier(
        first.verifier, first.device, first.dtype,
        placement=verifier_placement(composed(overrides_for(drafters[0], run, gammas[0], args)), first),
    )  # fmt: skip
    autoregressive, _ = build_engines(verifier, None, None, first.schedule, first.settings, baseline=False)
    runners = [engine_runner("autoregressive", autoregressive)]
    for (drafter, gamma), plan in plans.items():
        loaded = load_drafter(plan.drafter, verifier, plan.device, plan.dtype)
        parts = load_method_parts(plan, verifier, loaded)
        engine, _ = build_engines(verifier, parts.drafter, parts.rule, plan.schedule, plan.settings,
                                  baseline=False, steering=parts.steering)  # fmt: skip
        runners.append(engine_runner(f"{drafter}-g{gamma}", engine))

    questions = heldout_questions(args.per_task)
    report = {"run": str(run), "questions": len(questions), "max_new_tokens": args.max_new_tokens,
              "dtype": args.dtype, "threads": args.threads}  # fmt: skip
    figures = decode_and_report(runners, verifier.tokenizer, questions, out, "sd2_speed", report, args)
    return 0 if all_identical(figures) else 1


if __name__ == "__main__":
    sys.exit(main())
