"""DIVERSED against the static-ensemble curve, with a drafter that agrees often and a quality signal with
resolution.

The embedded SmolLM2-135M-Instruct verifier with the committed EAGLE-3 head as drafter, on held-out Spec-Bench
questions (first turn; ``--per-task`` per Spec-Bench task), at T = 1 over ``--seeds``. Every method uses the
same drafter and γ: autoregressive sampling, ``sd`` (lossless), the static ensemble at ``--weights``, lossy
(lenient) verification, a speculative cascade, FLy, each DIVERSED head given with ``--head NAME=PATH``, and
the per-token optimum of the heads' objective computed from p and q (``--gated``: a reference, not a head).

Quality (what the heads are judged on):

- ``verifier_logp``: the verifier's own mean log-likelihood per output token (untempered; recorded by the
engine
  from the verification forwards, no extra pass). Lossless methods keep autoregressive sampling's value; a
  lossy method moves it. It is also the reward of ``train.reward=verifier_logp`` (the heads of
  ``experiment=cpu-diversed-eagle`` are trained on it), so a second, independent measure is reported:
- ``rouge_l``: ROUGE-L F1 of the output against the verifier's greedy answer to the same question.

Each figure is the mean over questions of the per-question mean over seeds, with a 95 % bootstrap interval
over questions (``--bootstrap`` resamples). The DIVERSED check: its quality against the static curve (sd at
w = 0 and the static points, piecewise linear in acceptance) at its own acceptance, and whether the interval
of the difference (paired bootstrap over questions) lies above 0. Methods run interleaved (batch by batch, in
rotating order), so a shared machine's drifts hit all alike. ``--json`` keeps per-question figures after each
seed, so ``--resume`` continues with the next seed. ``--plot`` draws quality vs acceptance and vs tokens/s.

    .venv/bin/python benchmarks/diversed_study.py --head lambda2=/work/data/diversed_eagle/lambda2/trained.pt
    \\
        --seeds 0,1,2 --json outputs/diversed_study.json --plot docs/img/diversed_study.png
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from diversed_translation import interpolate
from harness import benchmark_parser

from specbench.results import record_run

DEFAULT_HEAD = ROOT / "checkpoints" / "eagle3-smollm2-135m" / "trained.pt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, per_task=3, max_new_tokens=32, threads=1)
    parser.add_argument("--head", action="append", default=[], metavar="NAME=PATH",
                        help="a DIVERSED head (trained.pt) for this pair; repeatable")
    parser.add_argument("--eagle", default=str(DEFAULT_HEAD), help="the EAGLE-3 drafter head")
    parser.add_argument("--tasks", default="mt_bench,translation,qa,math_reasoning",
                        help="Spec-Bench tasks (summarization and rag have long prompts: "
                        "slow prefill on CPU)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--weights", default="0.1,0.2,0.3,0.5,0.7,0.9", help="static-ensemble draft weights")
    parser.add_argument("--lenience", default="0.5", help="lossy rule lenience values (comma list)")
    parser.add_argument("--cascade-alpha", default="0.3", help="speculative cascade (chow) alpha values")
    parser.add_argument("--fly", action=argparse.BooleanOptionalAction, default=True, help="include FLy")
    parser.add_argument("--gated", default="4,8",
                        help="strengths λ of the per-token likelihood gate "
                        "(the head's objective solved per token)")
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting new methods after this")
    parser.add_argument("--json", help="write (and with --resume, read) the per-question figures here")
    parser.add_argument("--resume", action="store_true",
                        help="continue with the seeds --json does not hold yet")
    parser.add_argument("--plot", help="write the two-panel plot (PNG) here")
    parser.add_argument("--replot", nargs="+", metavar="JSON",
                        help="decode nothing: draw --plot from the rows of these --json files (same "
                        "questions and seeds; a method in several is taken from the last)")
    parser.add_argument("--reuse", help="a --json of an earlier run on the same questions, seeds, γ and "
                        "length: its methods (all but auto) are taken from it, not decoded again (the "
                        "engine is deterministic, so they would be token-identical); their speed is the "
                        "earlier run's")
    return parser.parse_args(argv)


# --- statistics ------------------------------------------------------------------------------------------


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def bootstrap_interval(per_question: list[float], resamples: int, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean over questions."""
    rng = random.Random(seed)
    n = len(per_question)
    means = sorted(mean(per_question[rng.randrange(n)] for _ in range(n)) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def curve_gap(rows: dict[str, dict], static: list[str], name: str, key: str, resamples: int):
    """(gap, low, high): quality of ``name`` minus the static curve at its acceptance, with a paired
    bootstrap over questions (the curve is re-drawn from the same resampled questions)."""
    curve_names = ["sd", *static]
    n = len(rows[name]["per_question"][key])
    rng = random.Random(1)

    def gap(index: list[int]) -> float | None:
        def at(row_name, field):
            per = rows[row_name]["per_question"][field]
            return mean(per[i] for i in index)

        points = [(at(c, "acceptance"), at(c, key)) for c in curve_names]
        expected = interpolate(points, at(name, "acceptance"))
        return None if expected is None else at(name, key) - expected

    point = gap(list(range(n)))
    if point is None:
        return None
    samples = sorted(
        g for g in (gap([rng.randrange(n) for _ in range(n)]) for _ in range(resamples)) if g is not None
    )
    return point, samples[int(0.025 * len(samples))], samples[int(0.975 * len(samples)) - 1]


# --- decoding --------------------------------------------------------------------------------------------


def gated_ensemble(strength: float):
    """The per-token optimum of the ``expected_verifier_logp`` + ``tv`` objective, computed from p and q at
    verification (no head): w_t = 1 where drafting costs less likelihood than λ times the acceptance it buys,
    Σ (p − q) log p < λ·TV(p, q), else 0 (linear pool). A reference for what a per-token weight can reach;
    the learned head approximates it from hidden states."""
    import torch

    from specbench.decoding import EnsembleRule
    from specbench.decoding.rules import pool_distributions

    class GatedEnsemble(EnsembleRule):
        name = "gated_ensemble"

        def __init__(self):
            super().__init__(0.0, "linear")

        @property
        def lossless(self) -> bool:
            return False

        def target(self, p, q, weights=None):
            cost = ((p - q) * torch.log(p.clamp(min=1e-30))).sum(-1)
            gain = 0.5 * (p - q).abs().sum(-1)
            return pool_distributions(p, q, (cost < strength * gain).to(p.dtype).unsqueeze(-1), "linear")

        def describe(self):
            return {"rule": self.name, "strength": strength}

    return GatedEnsemble()


def methods(args, verifier, drafter) -> list[tuple[str, object | None, dict]]:
    from specbench.decoding import CascadeRule, EnsembleRule, LenientRule, VerificationRule
    from specbench.decoding.diversed import load_diversed_rule
    from specbench.decoding.fly import FlyRule

    chosen: list[tuple[str, object | None, dict]] = [
        ("auto", None, {}),
        ("sd", VerificationRule(), {"w": 0.0}),
    ]
    for w in (float(x) for x in args.weights.split(",") if x):
        chosen.append((f"static w={w:g}", EnsembleRule(w, "linear"), {"w": w}))
    for lenience in (float(x) for x in args.lenience.split(",") if x):
        chosen.append((f"lossy {lenience:g}", LenientRule(lenience), {}))
    for alpha in (float(x) for x in args.cascade_alpha.split(",") if x):
        chosen.append((f"cascade chow {alpha:g}", CascadeRule("chow", alpha), {}))
    if args.fly:
        chosen.append(("fly", FlyRule(), {}))
    for strength in (float(x) for x in args.gated.split(",") if x):
        chosen.append((f"gated lambda={strength:g}", gated_ensemble(strength), {}))
    for spec in args.head:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--head {spec!r}: expected NAME=PATH")
        chosen.append((f"diversed {name}", load_diversed_rule(path, verifier, drafter, "linear"), {}))
    return chosen


def reusable(args, questions: list[dict], seeds: list[int]) -> dict[str, dict]:
    """The per-method figures of an earlier ``--json`` run, if it measured the same thing; else an error."""
    saved = json.loads(Path(args.reuse).read_text())
    expected = {"question_ids": [q["question_id"] for q in questions], "seeds": seeds, "gamma": args.gamma,
                "max_new_tokens": args.max_new_tokens, "eagle": args.eagle}  # fmt: skip
    differ = [key for key, value in expected.items() if saved.get(key) != value]
    if differ:
        raise SystemExit(
            f"--reuse {args.reuse}: it measured other {', '.join(differ)}; rerun those methods instead"
        )
    return {name: raw for name, raw in saved["raw"].items() if raw["seeds"] == seeds}


def decode(engine, ids: list[list[int]], batch_size: int):
    results, wall = [], 0.0
    for start in range(0, len(ids), batch_size):
        batch = engine.generate(ids[start : start + batch_size])
        wall += batch[0].wall_time
        results += batch
    return results, wall


def new_raw(count: int) -> dict:
    """Per-method accumulators: per question, one value per seed; pooled counts for acceptance / τ / speed."""
    return {
        "per_seed": {key: [[] for _ in range(count)] for key in ("verifier_logp", "rouge_l", "acceptance")},
        "drafted": 0, "accepted": 0, "emitted": 0, "forwards": 0, "tokens": 0, "wall": 0.0, "weights": [],
        "seeds": [],
    }  # fmt: skip


def record(raw: dict, first: int, results, wall: float, texts: list[str], greedy_texts: list[str]) -> None:
    from specbench.scoring.text import rouge

    raw["wall"] += wall
    for offset, (result, text) in enumerate(zip(results, texts)):
        q = first + offset
        d = sum(r.drafted for r in result.rounds)
        a = sum(r.accepted for r in result.rounds)
        raw["per_seed"]["verifier_logp"][q].append(result.verifier_logp)
        raw["per_seed"]["rouge_l"][q].append(rouge(text, greedy_texts[q])["rougeL"])
        raw["per_seed"]["acceptance"][q].append(a / d if d else 0.0)
        raw["drafted"] += d
        raw["accepted"] += a
        raw["emitted"] += sum(r.emitted for r in result.rounds)
        raw["forwards"] += len(result.rounds)
        raw["tokens"] += len(result.output_ids)
        raw["weights"] += [w for r in result.rounds for w in (r.draft_weights or ())]


def measure_seed(seed, chosen, raws, verifier, drafter_factory, ids, greedy_texts, args) -> None:
    """Every method on every question for one seed, interleaved: batch by batch, the methods run in an order
    that rotates, so drifts of a shared machine hit all of them alike (tokens/s stay comparable)."""
    from specbench.decoding import DraftSchedule, GenerationSettings
    from specbench.evaluation import build_engines

    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=seed)
    engines = {}
    for name, rule, _ in chosen:
        engines[name], _ = build_engines(verifier, drafter_factory() if rule is not None else None, rule,
                                         DraftSchedule("constant", gamma=args.gamma), settings,
                                         baseline=False)  # fmt: skip
    names = [name for name, _, _ in chosen]
    for b, first in enumerate(range(0, len(ids), args.batch_size)):
        batch = ids[first : first + args.batch_size]
        for name in names[b % len(names):] + names[: b % len(names)]:
            results = engines[name].generate(batch)
            texts = [verifier.tokenizer.decode(r.output_ids, skip_special_tokens=True) for r in results]
            record(raws[name], first, results, results[0].wall_time, texts, greedy_texts)
    for name in names:
        raws[name]["seeds"].append(seed)


def finish(raw: dict) -> dict:
    return {
        "acceptance_pooled": raw["accepted"] / raw["drafted"] if raw["drafted"] else 0.0,
        "tau": raw["emitted"] / raw["forwards"] if raw["forwards"] else 0.0,
        "tokens_per_s": raw["tokens"] / raw["wall"] if raw["wall"] > 0 else 0.0,
        "mean_draft_weight": mean(raw["weights"]) if raw["weights"] else None,
        "per_question": {key: [mean(v) for v in values] for key, values in raw["per_seed"].items()},
    }


def summarize(rows: dict[str, dict], resamples: int) -> None:
    for row in rows.values():
        for key in ("verifier_logp", "rouge_l", "acceptance"):
            values = row["per_question"][key]
            row[key] = mean(values)
            row[f"{key}_ci"] = bootstrap_interval(values, resamples)
    auto = rows["auto"]["tokens_per_s"]
    for row in rows.values():
        # a reused row: against the autoregressive speed of its own run
        reference = row.get("speed_scale", auto)
        row["speedup"] = row["tokens_per_s"] / reference if reference else None


def print_table(rows: dict[str, dict]) -> None:
    header = (f"{'method':<22} {'draft w':>7} {'accept':>7} {'tau':>5} {'tok/s':>6} {'vs AR':>6} "
              f"{'verifier logp [95% CI]':>26} {'ROUGE-L vs greedy [95% CI]':>28}")  # fmt: skip
    print("\n" + header + "\n" + "-" * len(header))
    for name, row in rows.items():
        w = "-" if row["mean_draft_weight"] is None else f"{row['mean_draft_weight']:.3f}"
        acc = "-" if name == "auto" else f"{row['acceptance']:.3f}"
        lo, hi = row["verifier_logp_ci"]
        rlo, rhi = row["rouge_l_ci"]
        name = f"{name} *" if "speed_scale" in row else name
        print(f"{name:<22} {w:>7} {acc:>7} {row['tau']:>5.2f} {row['tokens_per_s']:>6.1f} "
              f"{row['speedup']:>5.2f}x {row['verifier_logp']:>8.3f} [{lo:>6.3f}, {hi:>6.3f}] "
              f"{row['rouge_l']:>10.1f} [{rlo:>5.1f}, {rhi:>5.1f}]")  # fmt: skip
    print("-" * len(header))
    if any("speed_scale" in row for row in rows.values()):
        print("* reused from --reuse: the same tokens; tok/s and vs AR are that run's")


def record_rows(rows: dict[str, dict]) -> list[dict]:
    """Result-record rows, one per method: its mean draft weight, acceptance, τ, tokens/s, speedup over
    autoregressive sampling, the verifier's log-likelihood per token and ROUGE-L against the greedy answer
    (mean over questions with the median and this run's 95 % bootstrap interval over questions), and for
    the methods judged against the static curve, the gap to it at their acceptance (``*_vs_curve``, with the
    paired bootstrap interval). Sampled at T = 1: ``identical_outputs`` is null."""

    def over_questions(row: dict, key: str) -> dict:
        low, high = row[f"{key}_ci"]
        return {"value": float(row[key]), "median": float(statistics.median(row["per_question"][key])),
                "interval": [float(low), float(high)]}  # fmt: skip

    out = []
    for name, row in rows.items():
        figures: dict[str, dict] = {}
        if row["mean_draft_weight"] is not None:
            figures["draft_weight"] = {"value": float(row["mean_draft_weight"])}
        if name != "auto":
            figures["acceptance"] = over_questions(row, "acceptance")
        figures["tau"] = {"value": float(row["tau"])}
        figures["tokens_per_s"] = {"value": float(row["tokens_per_s"])}
        if row.get("speedup") is not None:
            figures["speedup"] = {"value": float(row["speedup"]), "unit": "x"}
        figures["loglik_per_token"] = over_questions(row, "verifier_logp")
        figures["rouge_l"] = over_questions(row, "rouge_l")
        for key, label in (("gap_verifier_logp", "loglik_vs_curve"), ("gap_rouge_l", "rouge_l_vs_curve")):
            if key in row:
                point, low, high = row[key]
                figures[label] = {"value": float(point), "interval": [float(low), float(high)]}
        entry = {"setup": name, "figures": figures, "identical_outputs": None}
        if "speed_scale" in row:
            entry["notes"] = "reused from --reuse: the same tokens; tokens/s and speedup are that run's"
        out.append(entry)
    return out


def plot(rows: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    palette = plt.get_cmap("tab20").colors
    # one colour per method, both panels
    colors = {name: palette[i % len(palette)] for i, name in enumerate(rows)}
    for ax, x_key, x_label in (
        (axes[0], "acceptance", "acceptance rate"),
        (axes[1], "speedup", "tokens/s vs autoregressive"),
    ):
        static = sorted(
            (n for n in rows if n == "sd" or n.startswith("static")), key=lambda n: rows[n]["acceptance"]
        )
        ax.plot([rows[n][x_key] for n in static], [rows[n]["verifier_logp"] for n in static], "-",
                color="0.6", zorder=1, label="static ensemble curve (sd = w 0)")  # fmt: skip
        for name, row in rows.items():
            if name == "auto" and x_key == "acceptance":
                ax.axhline(row["verifier_logp"], color="0.8", ls="--", lw=1, label="autoregressive (T = 1)")
                continue
            lo, hi = row["verifier_logp_ci"]
            kind = name.split()[0]
            marker = {"static": "o", "sd": "s", "lossy": "v", "cascade": "^", "fly": "D", "diversed": "*",
                      "gated": "P", "auto": "x"}.get(kind, "o")  # fmt: skip
            ax.errorbar(row[x_key], row["verifier_logp"],
                        yerr=[[row["verifier_logp"] - lo], [hi - row["verifier_logp"]]], fmt=marker,
                        ms=12 if kind == "diversed" else 6, capsize=3, label=name, zorder=2,
                        color=colors[name])  # fmt: skip
        ax.set_xlabel(x_label)
        ax.set_ylabel("verifier log-likelihood per token")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(
        "DIVERSED vs fixed weights: SmolLM2-135M + EAGLE-3 head, held-out Spec-Bench, T = 1 (95 % CI)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def replot(paths: list[str], plot_path: str) -> int:
    """The plot from saved rows of several runs of the same questions and seeds (no decoding)."""
    saved = [json.loads(Path(p).read_text()) for p in paths]
    if any(s.get("question_ids") != saved[0].get("question_ids") or s.get("seeds") != saved[0].get("seeds")
           for s in saved):  # fmt: skip
        raise SystemExit(
            "--replot: the files measured different questions or seeds; they cannot share one plot"
        )
    rows = {name: row for s in saved for name, row in s["rows"].items()}
    plot(rows, Path(plot_path))
    return 0


def resumed_raws(out: Path, raws: dict, questions: list[dict], seeds: list[int]) -> dict:
    """The per-question figures a previous run saved in ``out``, when it measured the same questions, seeds
    and methods; else ``raws`` (fresh)."""
    saved = json.loads(out.read_text())
    same = saved.get("question_ids") == [q["question_id"] for q in questions] and saved.get("seeds") == seeds
    if same and set(saved.get("raw", {})) == set(raws):
        print(f"resuming: seeds {saved['raw']['auto']['seeds']} done, from {out}")
        return saved["raw"]
    return raws


def collect_rows(raws: dict, reused: dict, every: list) -> dict[str, dict]:
    """The figures of every method measured on all the seeds done, plus the ``reused`` methods (their speed
    scaled by the earlier run's autoregressive speed), in the order of the method kinds."""
    done = raws["auto"]["seeds"]
    rows = {name: finish(raw) for name, raw in raws.items() if raw["seeds"] == done and done}
    if reused:
        earlier_auto = finish(reused["auto"])["tokens_per_s"]
        for name, raw in reused.items():
            if name != "auto" and name not in rows:
                rows[name] = {**finish(raw), "speed_scale": earlier_auto}
        kinds = ["auto", "sd", "static", "lossy", "cascade", "fly", "gated", "diversed"]
        # stable within a kind
        rows = dict(sorted(rows.items(), key=lambda item: kinds.index(item[0].split()[0])))
    for name, _, meta in every:  # fixed weights: show the configured one
        if name in rows and rows[name]["mean_draft_weight"] is None and "w" in meta:
            rows[name]["mean_draft_weight"] = meta["w"]
    return rows


def compare_with_static(rows: dict[str, dict], bootstrap: int) -> None:
    """Print (and store in the row) each non-static method's quality gap to the static-ensemble curve at its
    acceptance, with its bootstrap interval."""
    static = [n for n in rows if n.startswith("static")]
    for name in (n for n in rows if n.startswith(("diversed", "gated", "lossy", "cascade", "fly"))):
        for key in ("verifier_logp", "rouge_l"):
            gap = curve_gap(rows, static, name, key, bootstrap)
            if gap is None:
                print(f"[n/a ] {name}: acceptance {rows[name]['acceptance']:.3f} "
                      f"outside the static curve ({key})")
                continue
            point, lo, hi = gap
            verdict = "ABOVE" if lo > 0 else ("BELOW" if hi < 0 else "ON   ")
            print(f"[{verdict}] {name} vs the static curve at its acceptance, {key}: {point:+.3f} "
                  f"[{lo:+.3f}, {hi:+.3f}]")  # fmt: skip
            rows[name][f"gap_{key}"] = [point, lo, hi]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        if not args.plot:
            raise SystemExit("--replot needs --plot PATH")
        return replot(args.replot, args.plot)
    import torch
    from harness import first_turn_ids, heldout_questions, task_of

    from specbench.decoding import GenerationSettings, SpeculativeEngine
    from specbench.drafters.eagle3.format import load_eagle3_drafter
    from specbench.evaluation import eos_token_ids, pad_token_id
    from specbench.models import ModelSpec, load_verifier
    from specbench.models.pair import verifier_vocab_size

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    verifier = load_verifier(ModelSpec(kind="embedded"), "cpu", "float32")
    tokenizer, model = verifier.tokenizer, verifier.model
    vocab = verifier_vocab_size(model, tokenizer)
    drafter = load_eagle3_drafter(args.eagle, verifier, vocab, name="eagle3-smollm2-135m")
    tasks = [t for t in args.tasks.split(",") if t]
    questions = [q for q in heldout_questions(args.per_task) if task_of(q["category"]) in tasks]
    ids = [first_turn_ids(tokenizer, q) for q in questions]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    eos = eos_token_ids(model, tokenizer)
    greedy = SpeculativeEngine(model, None, settings=GenerationSettings(max_new_tokens=args.max_new_tokens),
                               vocab_size=vocab, eos_token_ids=eos, pad_token_id=pad_token_id(tokenizer, eos))
    greedy_texts = [tokenizer.decode(r.output_ids, skip_special_tokens=True)
                    for r in decode(greedy, ids, args.batch_size)[0]]
    print(f"{len(questions)} held-out Spec-Bench questions, T = 1, seeds {seeds}, gamma {args.gamma}, "
          f"{args.max_new_tokens} new tokens, drafter {drafter.name}", flush=True)  # fmt: skip
    out = Path(args.json) if args.json else None
    every = methods(args, verifier, drafter)
    reused = reusable(args, questions, seeds) if args.reuse else {}
    chosen = [c for c in every if c[0] not in reused or c[0] == "auto"]
    raws = {name: new_raw(len(ids)) for name, _, _ in chosen}
    if args.resume and out and out.is_file():
        raws = resumed_raws(out, raws, questions, seeds)

    def save(rows: dict | None = None) -> None:
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            payload = {"question_ids": [q["question_id"] for q in questions], "seeds": seeds,
                       "gamma": args.gamma, "max_new_tokens": args.max_new_tokens, "eagle": args.eagle,
                       "heads": args.head, "raw": raws, "rows": rows or {}}  # fmt: skip
            out.write_text(json.dumps(payload, indent=1) + "\n")

    for seed in seeds:
        if seed in raws["auto"]["seeds"]:
            continue
        if args.budget_s and time.perf_counter() - started > args.budget_s:
            print(f"time budget spent: seed {seed} and later not measured")
            break
        t0 = time.perf_counter()
        measure_seed(seed, chosen, raws, verifier, lambda: load_eagle3_drafter(args.eagle, verifier, vocab),
                     ids, greedy_texts, args)  # fmt: skip
        print(f"seed {seed}: {len(chosen)} methods x {len(ids)} questions in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
        save()
    done = raws["auto"]["seeds"]
    rows = collect_rows(raws, reused if done == seeds else {}, every)
    if "auto" not in rows or "sd" not in rows:
        return 1
    summarize(rows, args.bootstrap)
    print_table(rows)
    compare_with_static(rows, args.bootstrap)
    save(rows)
    if args.plot:
        plot(rows, Path(args.plot))
    missing = [seed for seed in seeds if seed not in done]
    record_run(
        args, "diversed_study", record_rows(rows), f"spec_bench heldout ({', '.join(tasks)}; first turn), "
        f"seeds {','.join(map(str, done))}", len(questions), device="cpu", dtype="float32",
        threads=args.threads, doc="docs/diversed.md#measured-with-the-eagle-3-head",
        notes=f"drafter {drafter.name}, T = 1, gamma {args.gamma}, {args.max_new_tokens} new tokens; "
        "quality: mean over questions of the per-question mean over seeds, 95 % bootstrap interval over "
        "questions" + (f"; seeds not measured (budget): {missing}" if missing else ""),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
