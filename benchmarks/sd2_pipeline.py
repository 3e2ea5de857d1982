"""The SD² study on the embedded pair: synth → train (distill, SD² and its ablations) → eval, one table.

    python benchmarks/sd2_pipeline.py [--out runs/sd2-pipeline] [--data SYNTH_DIR] [--feature-cache DIR]
        [--draft-vocab-size 8192] [--steps 240] [--eval-prompts 12] [--seeds 0,1,2] [--jobs 2]
        [--eval-dtype bfloat16] [--budget-min M] [--plot docs/img/sd2_study.png] [launch.py overrides ...]

Every step is a ``launch.py`` run of ``experiment=cpu-sd2`` (conf/experiment/cpu-sd2.yaml); a step whose
output exists is skipped, so a rerun resumes, and ``--budget-min`` stops starting new steps once that
many minutes have passed (the table then shows what is done). ``--jobs`` steps run at once, each on
``runtime.num_threads=1``.

- **Data**: ``--data`` an existing ``task=synth`` dataset, else one is sampled from the training part of
  Spec-Bench (``--synth-prompts``, ``--responses-per-prompt`` at T = 1).
- **Training** (same data, steps, draft vocabulary and verifier-feature cache for every run): ``distill``
  (the drafter fine-tuned by KL, no steering), ``sd2`` (merged steering + full fine-tuning, the paper's
  method), and the paper's ablations ``sd2-simple`` (steering added to the residual stream instead of the
  MLP up-projection) and ``sd2-frozen`` (the drafter frozen, only the fusion and W_s trained).
- **Evaluation** on held-out Spec-Bench questions (``dataset.subset=heldout``, never used for synth), greedy
  and at T = 1 for every seed, each next to autoregressive decoding of the verifier in the same process:
  τ, per-position acceptance, tokens/s and speedup. The pretrained drafter drafts over the same vocabulary.
  ``--eval-dtype bfloat16`` decodes in bf16 with the row-invariant CPU forwards (training stays float32);
  those evaluations are kept apart (``eval/*-bf16``) from the float32 ones.
- **Curves**: the training runs' ``val/tvd`` and ``val/tau`` are MLflow metrics; the plot reads them back.

Prints the issue's targets: τ(SD²) ≥ 1.15 × τ(distilled) > τ(pretrained), and SD² faster than
autoregressive decoding.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import benchmark_parser

from specbench.results import record_run

ROOT = Path(__file__).resolve().parents[1]
TAPS = "[2,15,27]"  # SmolLM2 has 30 layers: low, mid, high as SD²'s [3, 16, 29] of 32 (and EAGLE-3's taps)

TRAININGS = {
    "distill": ["method=distill", "steering=none"],
    "sd2": ["method=sd2", "steering=sd2"],
    "sd2-simple": ["method=sd2", "steering=sd2", "steering.guide_method=simple"],
    "sd2-frozen": ["method=sd2", "steering=sd2", "steering.finetune_drafter=none"],
}
DRAFTERS = {
    "pretrained": ["method=sd", "steering=none"],
    "distilled": ["method=distill", "steering=none", "method.drafter_checkpoint={out}/distill/trained.pt"],
    "sd2": ["method=sd2", "steering=sd2", "steering.checkpoint={out}/sd2/trained.pt"],
    "sd2-simple": ["method=sd2", "steering=sd2", "steering.checkpoint={out}/sd2-simple/trained.pt"],
    "sd2-frozen": ["method=sd2", "steering=sd2", "steering.checkpoint={out}/sd2-frozen/trained.pt"],
}

TRAINED_BY = {
    "distilled": "distill",
    **{name: name for name in TRAININGS if name != "distill"},
}  # drafter -> run
LABELS = {"pretrained": "pretrained", "distilled": "distilled", "sd2": "SD²", "sd2-simple": "SD² simple",
          "sd2-frozen": "SD² frozen"}  # the drafters' names in the result record  # fmt: skip


@dataclass
class Step:
    name: str
    args: list[str]
    done: Path  # exists once the step has finished
    after: list[str] = field(default_factory=list)


class Runner:
    """Runs launch.py steps (skipping finished ones), at most ``jobs`` at once, until the budget is spent."""

    def __init__(self, out: Path, jobs: int, budget_s: float | None) -> None:
        self.out, self.jobs, self.budget_s = out, jobs, budget_s
        self.start = time.monotonic()
        self.saved = out / "timings.json"  # kept across reruns: a resumed study still reports every step
        self.timings: dict[str, float] = json.loads(self.saved.read_text()) if self.saved.exists() else {}
        self.failed: list[str] = []
        self.skipped: list[str] = []
        self.lock = threading.Lock()  # steps finish on several threads; one writer of timings.json at a time

    def over_budget(self) -> bool:
        return self.budget_s is not None and time.monotonic() - self.start > self.budget_s

    def run(self, steps: list[Step]) -> None:
        todo = [s for s in steps if not s.done.exists()]
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            list(pool.map(self._one, todo))

    def _one(self, step: Step) -> None:
        if self.over_budget():
            self.skipped.append(step.name)
            return
        missing = [d for d in step.after if d in self.failed or d in self.skipped]
        if missing:
            self.skipped.append(step.name)
            return
        log = self.out / "logs" / f"{step.name}.log"
        began = time.perf_counter()
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        with open(log, "w") as handle:
            proc = subprocess.run(
                [sys.executable, str(ROOT / "launch.py"), "experiment=cpu-sd2", *step.args],
                cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False,
            )
        if proc.returncode != 0:
            self.failed.append(step.name)
            print(f"step {step.name} failed ({proc.returncode}): see {log}", flush=True)
            return
        with self.lock:
            self.timings[step.name] = time.perf_counter() - began
            self.saved.write_text(json.dumps(self.timings, indent=2) + "\n")
        print(f"step {step.name} done in {self.timings[step.name]:.0f} s", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "sd2-pipeline")
    parser.add_argument("--data", type=Path, help="an existing task=synth dataset (skips synth)")
    parser.add_argument(
        "--synth-prompts", type=int, default=256, help="training-part Spec-Bench prompts to sample"
    )
    parser.add_argument("--responses-per-prompt", type=int, default=4)
    parser.add_argument("--feature-cache", type=Path, help="verifier-feature cache (default OUT/features)")
    parser.add_argument("--draft-vocab-size", type=int, default=8192, help="0: the full vocabulary")
    parser.add_argument("--steps", type=int, default=240, help="optimiser steps of every training run")
    parser.add_argument("--trainings", default=",".join(TRAININGS), help=f"subset of {','.join(TRAININGS)}")
    parser.add_argument("--eval-prompts", type=int, default=12, help="held-out prompts per evaluation")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the T = 1 evaluations")
    parser.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--speed-gammas",
        default="",
        help="also decode greedy at these γ (comma list) with the "
        "distilled and SD² drafters: the speed rows (τ is compared at the preset's γ)",
    )
    parser.add_argument("--eval-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="dtype of the evaluations (bfloat16: the row-invariant CPU forwards)")
    parser.add_argument("--jobs", type=int, default=1, help="steps run at once (one torch thread each)")
    parser.add_argument("--budget-min", type=float, help="start no new step after this many minutes")
    parser.add_argument(
        "--plot", type=Path, help="also write the figure here (it is always OUT/sd2_study.png)"
    )
    parser.add_argument("extra", nargs="*", help="more launch.py overrides for every step")
    return parser.parse_args(argv)  # fmt: skip


@dataclass
class Study:
    """Where the study writes and the overrides every step shares."""

    args: argparse.Namespace
    out: Path
    data: Path
    cache: Path
    trainings: list[str]
    common: list[str]
    vocab: list[str]

    @classmethod
    def of(cls, args: argparse.Namespace) -> Study:
        out = args.out.resolve()
        data = args.data.resolve() if args.data else out / "synth"
        trainings = [t for t in args.trainings.split(",") if t]
        unknown = sorted(set(trainings) - set(TRAININGS))
        if unknown:
            sys.exit(f"--trainings: unknown {unknown}; choose from {','.join(TRAININGS)}")
        vocab = ([f"model.drafter.draft_vocab={data}",
                  f"model.drafter.draft_vocab_size={args.draft_vocab_size}"]
                 if args.draft_vocab_size else [])  # fmt: skip
        common = ["runtime.num_threads=1", f"steering.v_layers={TAPS}", *args.extra]
        return cls(
            args, out, data, (args.feature_cache or out / "features").resolve(), trainings, common, vocab
        )


def synth_and_train(study: Study, runner: Runner) -> None:
    """Sample the dataset (unless --data) and train every drafter of --trainings; the first training builds
    the feature cache (unless it exists), the others then reuse it."""
    args, out, data = study.args, study.out, study.data
    if not args.data:
        runner.run([Step("synth", [
            "task=synth", "dataset.subset=train", f"dataset.limit={args.synth_prompts}",
            "synth.temperature=1.0", f"synth.responses_per_prompt={args.responses_per_prompt}",
            f"synth.output_dir={data}",
            f"hydra.run.dir={out / 'hydra' / 'synth'}", *study.common,
        ], data / "dataset")])  # fmt: skip
    if not (data / "dataset").exists() and not (data / "dataset_dict.json").exists():
        sys.exit(f"no synthetic dataset at {data}: see {out / 'logs' / 'synth.log'}")
    train_steps = [
        Step(f"train_{name}", [
            "task=train", *TRAININGS[name], f"train.data={data}", f"train.feature_cache={study.cache}",
            "train.feature_top_k=64", f"train.max_steps={args.steps}", f"train.output_dir={out / name}",
            f"hydra.run.dir={out / 'hydra' / name}", *study.vocab, *study.common,
        ], out / name / "trained.pt")
        for name in study.trainings
    ]  # fmt: skip
    if train_steps and not (study.cache / "features.json").exists():
        runner.run(train_steps[:1])
    runner.run(train_steps)


def evaluate(study: Study, runner: Runner) -> tuple[list[dict], list[dict]]:
    """Every drafter at every (temperature, seed) and the speed rows at --speed-gammas: their metrics."""
    args, out = study.args, study.out
    tag = "" if args.eval_dtype == "float32" else "-bf16"
    settings = ([(0.0, 0)] if args.greedy else []) + [(1.0, int(s)) for s in args.seeds.split(",") if s]
    drafters = [d for d in DRAFTERS if d == "pretrained" or TRAINED_BY[d] in study.trainings]

    def evaluation(drafter: str, run: Path, overrides: list[str]) -> Step:
        return Step(f"eval_{run.name}", [
            *[o.format(out=out) for o in DRAFTERS[drafter]], *overrides, f"dataset.limit={args.eval_prompts}",
            f"eval.output_dir={run}", f"hydra.run.dir={out / 'hydra' / run.name}",
            f"runtime.dtype={args.eval_dtype}", *study.vocab, *study.common,
        ], run / "metrics.json",
            after=[] if drafter == "pretrained" else [f"train_{TRAINED_BY[drafter]}"])  # fmt: skip

    speed_gammas = [int(g) for g in args.speed_gammas.split(",") if g]
    speed_drafters = [d for d in drafters if d in ("distilled", "sd2")]
    runner.run([
        *(evaluation(d, out / "eval" / f"{d}-T{t:g}-s{s}{tag}", [f"gen.temperature={t}", f"gen.seed={s}"])
          for t, s in settings for d in drafters),
        *(evaluation(d, out / "eval" / f"{d}-T0-s0-g{g}{tag}", ["gen.temperature=0.0", f"schedule.gamma={g}"])
          for g in speed_gammas for d in speed_drafters),
    ])  # fmt: skip

    def measured(drafter: str, name: str, temperature: float) -> list[dict]:
        path = out / "eval" / name / "metrics.json"
        return (
            [{**json.loads(path.read_text()), "drafter": drafter, "temperature": temperature}]
            if path.exists()
            else []
        )

    results = [r for t, s in settings for d in drafters for r in measured(d, f"{d}-T{t:g}-s{s}{tag}", t)]
    speed = [
        r for g in speed_gammas for d in speed_drafters for r in measured(d, f"{d}-T0-s0-g{g}{tag}", 0.0)
    ]
    return results, speed


def main(argv=None) -> None:
    args = parse_args(argv)
    study = Study.of(args)
    out = study.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    runner = Runner(out, args.jobs, None if args.budget_min is None else args.budget_min * 60)
    synth_and_train(study, runner)
    results, speed = evaluate(study, runner)
    curves = read_curves(out, study.trainings)
    report(results, speed, curves, runner, out, args.eval_dtype)
    if results or curves:
        plot(results, curves, [out / "sd2_study.png", *([args.plot] if args.plot else [])])
    rows = record_rows(results, speed, curves)
    if rows:
        not_run = runner.failed + runner.skipped
        record_run(
            args, "sd2_pipeline", rows, "spec_bench heldout", args.eval_prompts, device="cpu",
            dtype=args.eval_dtype, threads=1, doc="docs/training.md#result-on-the-embedded-pair",
            notes=f"experiment=cpu-sd2, {args.steps} training steps per drafter (float32), draft vocabulary "
            f"{args.draft_vocab_size or 'full'}; evaluations in {args.eval_dtype}, each next to its own "
            "autoregressive "
            "run; T = 1 rows: mean over seeds" + (f"; steps failed or not run: {not_run}" if not_run else ""),
        )  # fmt: skip
    else:
        print("no evaluation finished: no result record")


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return statistics.fmean(values) if values else None


def _figures(rows: list[dict]) -> dict[str, dict]:
    keys = [("tau", "tau", ""), ("acceptance_rate", "acceptance", ""),
            *((f"acceptance_pos_{k}", f"acceptance_pos_{k}", "") for k in range(1, 5)),
            ("tokens_per_s", "tokens_per_s", ""), ("baseline_tokens_per_s", "ar_tokens_per_s", ""),
            ("speedup", "speedup", "x")]  # fmt: skip
    figures = {}
    for key, name, unit in keys:
        if (value := _mean(rows, key)) is not None:
            figures[name] = {"value": value, **({"unit": unit} if unit else {})}
    return figures


def _identical(rows: list[dict], temperature: float) -> bool | None:
    """Greedy with the exact ``sd`` rule: whether every output matched its autoregressive run; None at T >
    0."""
    match = _mean(rows, "baseline_match_rate")
    return None if temperature or match is None else match == 1.0


def record_rows(results: list[dict], speed: list[dict], curves: dict) -> list[dict]:
    """Result-record rows: per drafter and temperature (greedy, T = 1 averaged over seeds) τ, acceptance (and
    per position), tokens/s, the autoregressive run's tokens/s and the speedup; τ of SD² over τ of the
    distilled drafter; the final ``val/tvd`` of each trained drafter (greedy row); then the greedy rows at
    the ``--speed-gammas``. SD²'s greedy row is the headline."""
    rows: list[dict] = []
    for temperature in sorted({r["temperature"] for r in results}):
        tau = {d: _mean([r for r in results if r["drafter"] == d and r["temperature"] == temperature], "tau")
               for d in DRAFTERS}  # fmt: skip
        for drafter in DRAFTERS:
            picked = [r for r in results if r["drafter"] == drafter and r["temperature"] == temperature]
            if not picked:
                continue
            gamma = picked[0].get("gamma")
            setup = (f"{LABELS[drafter]}" + (f", γ={gamma}" if gamma is not None else "")
                     + (", greedy" if not temperature else f", T={temperature:g}"))  # fmt: skip
            figures = _figures(picked)
            if drafter.startswith("sd2") and tau[drafter] and tau["distilled"]:
                figures["tau_vs_distilled"] = {"value": tau[drafter] / tau["distilled"]}
            tvd = curves.get(TRAINED_BY.get(drafter, ""), {}).get("val/tvd")
            if not temperature and tvd:
                figures["val_tvd"] = {"value": float(tvd[-1][1])}
            row = {"setup": setup, "figures": figures, "identical_outputs": _identical(picked, temperature)}
            if temperature:
                row["notes"] = f"mean over {len(picked)} seed(s): {[r.get('seed') for r in picked]}"
            if drafter == "sd2" and not temperature:
                row["headline"] = True
            rows.append(row)
    for r in sorted(speed, key=lambda r: (r["gamma"], list(DRAFTERS).index(r["drafter"]))):
        setup = f"{LABELS[r['drafter']]}, γ={r['gamma']}, greedy"
        if any(row["setup"] == setup for row in rows):
            setup += " (speed run)"
        rows.append({"setup": setup, "figures": _figures([r]), "identical_outputs": _identical([r], 0.0)})
    return [row for row in rows if row["figures"]]


def read_curves(out: Path, trainings: list[str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Each training run's validation curves, read back from its MLflow run (none without tracking)."""
    curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for name in trainings:
        records = [p for p in (out / name, out / "hydra" / name) if (p / "mlflow_run.json").exists()]
        if not records:
            continue
        record = json.loads((records[0] / "mlflow_run.json").read_text())
        from mlflow.tracking import MlflowClient

        client = MlflowClient(record["tracking_uri"])
        curves[name] = {
            key: [(m.step, m.value) for m in client.get_metric_history(record["run_id"], key)]
            for key in ("val/tvd", "val/tau", "train/loss")
        }
    return curves


def summarise(results: list[dict], drafter: str, temperature: float, key: str) -> list[float]:
    return [
        r[key] for r in results if r["drafter"] == drafter and r["temperature"] == temperature and key in r
    ]


def spread(values: list[float]) -> str:
    if not values:
        return "–"
    mean = statistics.fmean(values)
    return f"{mean:.3f}" if len(values) == 1 else f"{mean:.3f}±{statistics.stdev(values):.3f}"


def report(
    results: list[dict], speed: list[dict], curves: dict, runner: Runner, out: Path, dtype: str
) -> None:
    header = (f"{'drafter':<11} {'T':>3} {'seeds':>5} {'tau':>13} {'accept':>13} {'a@1':>6} {'a@2':>6} "
              f"{'a@3':>6} {'a@4':>6} {'tok/s':>7} {'AR tok/s':>8} {'speedup':>13} {'=AR':>5}")
    lines = [f"evaluations in {dtype}", header, "-" * len(header)]
    for temperature in sorted({r["temperature"] for r in results}):
        for drafter in DRAFTERS:
            rows = [r for r in results if r["drafter"] == drafter and r["temperature"] == temperature]
            if not rows:
                continue

            def mean(key: str, rows: list[dict] = rows) -> float:
                values = [r[key] for r in rows if r.get(key) is not None]
                return statistics.fmean(values) if values else float("nan")

            match = mean("baseline_match_rate")
            lines.append(
                f"{drafter:<11} {temperature:>3g} {len(rows):>5} "
                f"{spread(summarise(results, drafter, temperature, 'tau')):>13} "
                f"{spread(summarise(results, drafter, temperature, 'acceptance_rate')):>13} "
                + " ".join(f"{mean(f'acceptance_pos_{k}'):>6.3f}" for k in range(1, 5))
                + f" {mean('tokens_per_s'):>7.2f} {mean('baseline_tokens_per_s'):>8.2f} "
                f"{spread(summarise(results, drafter, temperature, 'speedup')):>12}x "
                f"{'' if temperature else f'{match:.2f}':>5}"
            )
    lines.append("")
    for temperature in sorted({r["temperature"] for r in results}):
        tau = {d: statistics.fmean(v) for d in DRAFTERS if (v := summarise(results, d, temperature, "tau"))}
        sd2_speedup = summarise(results, "sd2", temperature, "speedup")
        if {"sd2", "distilled", "pretrained"} <= tau.keys():
            lines.append(
                f"T={temperature:g}: tau(sd2)/tau(distilled) = {tau['sd2'] / tau['distilled']:.3f} (target "
                ">= 1.15); "
                f"tau(distilled) {tau['distilled']:.3f} > tau(pretrained) {tau['pretrained']:.3f}: "
                f"{tau['distilled'] > tau['pretrained']}; sd2 speedup over autoregressive "
                f"{statistics.fmean(sd2_speedup):.2f}x (target > 1)"
            )
    if speed:
        lines += ["", "greedy, other γ (speed):", (f"{'drafter':<11} {'gamma':>5} {'tau':>6} {'accept':>7} "
                  f"{'tok/s':>7} {'AR tok/s':>8} {'speedup':>8} {'=AR':>5}")]
        for r in sorted(speed, key=lambda r: (r["gamma"], list(DRAFTERS).index(r["drafter"]))):
            lines.append(
                f"{r['drafter']:<11} {r['gamma']:>5} {r['tau']:>6.3f} {r['acceptance_rate']:>7.3f} "
                f"{r['tokens_per_s']:>7.2f} {r.get('baseline_tokens_per_s', float('nan')):>8.2f} "
                f"{r.get('speedup', float('nan')):>7.2f}x {r.get('baseline_match_rate', float('nan')):>5.2f}"
            )
        lines.append("")
    for name, runs in curves.items():
        last = {k: v[-1][1] for k, v in runs.items() if v}
        lines.append(f"{name}: final " + ", ".join(f"{k} {v:.3f}" for k, v in last.items()))
    if runner.timings:
        lines.append("step wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in runner.timings.items()))
    if runner.failed or runner.skipped:
        lines.append(f"failed: {runner.failed or 'none'}; not run (budget or a failed step before): "
                     f"{runner.skipped or 'none'}")
    text = "\n".join(lines)
    print(text)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(
        {"results": results, "speed": speed, "curves": curves, "timings_s": runner.timings}, indent=2) + "\n")


def plot(results: list[dict], curves: dict, paths: list[Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name, runs in curves.items():
        for ax, key in zip(axes[:2], ("val/tvd", "val/tau")):
            if runs.get(key):
                steps, values = zip(*runs[key])
                ax.plot(steps, values, marker="o", label=name)
    for ax, key in zip(axes[:2], ("val/tvd", "val/tau")):
        ax.set(xlabel="optimiser step", ylabel=key, title=f"validation {key.split('/')[1]} (MLflow)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    temperatures = sorted({r["temperature"] for r in results})
    drafters = [d for d in DRAFTERS if any(r["drafter"] == d for r in results)]
    width = 0.8 / max(len(temperatures), 1)
    for i, temperature in enumerate(temperatures):
        means, errors = [], []
        for drafter in drafters:
            values = summarise(results, drafter, temperature, "tau")
            means.append(statistics.fmean(values) if values else 0.0)
            errors.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        xs = [j + i * width for j in range(len(drafters))]
        axes[2].bar(xs, means, width, yerr=errors, capsize=3, label=f"T = {temperature:g}")
    axes[2].set_xticks([j + width * (len(temperatures) - 1) / 2 for j in range(len(drafters))], drafters,
                       rotation=20, fontsize=8)
    axes[2].set(ylabel="τ (tokens per verifier forward)", title="held-out Spec-Bench questions")
    axes[2].grid(alpha=0.3, axis="y")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    print("plot: " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
