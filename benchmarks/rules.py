"""Verification rules side by side at T = 1: speed, acceptance and a quality signal, one drafter, one
verifier.

The embedded SmolLM2-135M-Instruct verifier (CPU, float32 by default) and one drafter decode the first
turn of held-out Spec-Bench questions (``harness.heldout_questions``) at temperature 1 with every row
below, interleaved question by question (``harness.run_all``), with the same prompts and the same seeds
(``engine.reseed(seed)`` before each question, for every seed of ``--seeds``):

    autoregressive        no drafter (the baseline of every speedup and quality delta)
    sd                    exact speculative sampling (VerificationRule)
    block                 block verification, lossless (BlockRule; Sun et al., ICLR 2025)
    fly                   FLy with its defaults (W = min(6, L-1), θ = 0.3 nats, top-3)
    fly-lenient           FLy, more lenient: θ = 0.1 nats, W = 2
    lossy-0.5, lossy-0.2  lenient verification (LenientRule) at lenience 0.5 and 0.2
    ensemble-0.1/-0.3     static linear ensemble (EnsembleRule) at draft weight 0.1 and 0.3
    cascade               speculative cascade (CascadeRule) with conf/method/cascade.yaml's defaults

Rules come from ``specbench.decoding.methods.build_rule``; the parameters a row leaves out take
``conf/method/<name>.yaml``'s values (the method defaults, not the rule classes' constructor defaults).
Per row: τ (tokens per verifier forward), acceptance rate (accepted drafts / drafted drafts, summed over
``SampleResult.rounds``), tokens/s, speedup vs autoregressive (ratio of mean tokens/s, Spec-Bench's
convention), and the quality signal: the mean log-probability per emitted token under the verifier's own
T = 1 distribution, each output scored once with a single verifier forward over prompt + output (token-
weighted mean, plus the mean paired difference to autoregressive decoding on the same question and seed,
± its standard error). Exact rules (sd, block) must match autoregressive decoding within that noise;
lossy rules show a drop. FLy rows also report deferred drafts per round (how often the entropy gate
actually extended acceptance). The block/sd ratios of τ, acceptance and tokens/s over the same prompts and
seeds are printed explicitly (Sun et al. report +5-8 % wall-clock for block over token-wise).

Output (``--out-dir``, default outputs/rules/TIME): ``rules.json`` (all figures, per-sample records) and
``rules.png`` (quality vs acceptance rate, one labelled point per row).

    OMP_NUM_THREADS=1 python benchmarks/rules.py --drafter eagle3 \
        --head checkpoints/eagle3-smollm2-135m/trained.pt --per-task 3 --max-new-tokens 96 --gamma 4 --seeds
        0,1

Default drafter: that EAGLE-3 head if the file exists, else the verifier's first 4 layers (early exit).
Smoke run: ``--drafter early-exit --layers 4 --per-task 1 --limit 2 --max-new-tokens 12 --seeds 0
--only sd,block,fly``. ``--only`` takes row names or method names (``fly`` selects both FLy rows);
autoregressive always runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    TASKS,
    Decoded,
    Runner,
    benchmark_parser,
    first_turn_ids,
    format_table,
    heldout_questions,
    out_dir,
    record_run,
    run_all,
    speed_rows,
    table,
    task_of,
)

from specbench.decoding import DraftSchedule, GenerationSettings, SpeculativeEngine
from specbench.decoding.fly import FlyRule
from specbench.decoding.methods import build_rule
from specbench.evaluation import eos_token_ids, pad_token_id
from specbench.models import ModelSpec, load_verifier
from specbench.results.record import figure

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HEAD = ROOT / "checkpoints" / "eagle3-smollm2-135m" / "trained.pt"
BASELINE = "autoregressive"
MIN_SAMPLES_FOR_VERDICT = 5  # question x seed pairs before "within noise" is judged


@dataclass(frozen=True)
class RowSpec:
    name: str
    method: str  # "auto" or a rule method of specbench.method_names.RULE_METHODS
    family: str  # baseline | exact | fly | lossy | ensemble | cascade (plot colours)
    params: dict = field(default_factory=dict)  # overrides of conf/method/<method>.yaml


ROWS = (
    RowSpec(BASELINE, "auto", "baseline"),
    RowSpec("sd", "sd", "exact"),
    RowSpec("block", "block", "exact"),
    RowSpec("fly", "fly", "fly"),
    RowSpec("fly-lenient", "fly", "fly", {"entropy_threshold": 0.1, "window_size": 2}),
    RowSpec("lossy-0.5", "lossy", "lossy", {"lenience": 0.5}),
    RowSpec("lossy-0.2", "lossy", "lossy", {"lenience": 0.2}),
    RowSpec("ensemble-0.1", "static_ensemble", "ensemble", {"draft_weight": 0.1, "pool": "linear"}),
    RowSpec("ensemble-0.3", "static_ensemble", "ensemble", {"draft_weight": 0.3, "pool": "linear"}),
    RowSpec("cascade", "cascade", "cascade"),
)
ALIASES = {"ensemble": "static_ensemble", "lenient": "lossy", "ar": BASELINE, "auto": BASELINE}
FAMILY_STYLE = {  # colour, marker
    "exact": ("tab:blue", "o"), "fly": ("tab:red", "*"), "lossy": ("tab:orange", "s"),
    "ensemble": ("tab:green", "^"), "cascade": ("tab:purple", "D"),
}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    parser = benchmark_parser(
        __doc__, per_task=3, max_new_tokens=96, threads=1, device="cpu", dtype="float32",
        out_dir={"default": None, "help": "default: outputs/rules/TIME"},
    )  # fmt: skip
    parser.add_argument(
        "--drafter",
        choices=("eagle3", "early-exit"),
        default=None,
        help="default: eagle3 if --head exists, else early-exit",
    )
    parser.add_argument(
        "--head", default=str(DEFAULT_HEAD), help="EAGLE-3 head (trained.pt of method=eagle3)"
    )
    parser.add_argument("--layers", type=int, default=4, help="early-exit drafter depth K")
    parser.add_argument(
        "--limit", type=int, default=None, help="cap on questions in all (taken round-robin over tasks)"
    )
    parser.add_argument("--gamma", type=int, default=4, help="constant draft length")
    parser.add_argument(
        "--seeds", default="0,1", help="comma list; every row decodes every question per seed"
    )
    parser.add_argument(
        "--only",
        default=None,
        help="comma list of row or method names (autoregressive "
        f"always runs); rows: {', '.join(r.name for r in ROWS)}",
    )
    parser.add_argument("--no-plot", action="store_true")
    return parser.parse_args(argv)


def select_rows(only: str | None) -> list[RowSpec]:
    if not only:
        return list(ROWS)
    tokens = [ALIASES.get(t.strip(), t.strip()) for t in only.split(",") if t.strip()]
    unknown = [t for t in tokens if not any(t in (r.name, r.method) for r in ROWS)]
    if unknown:
        raise SystemExit(
            f"--only: unknown rows {unknown}; rows: {[r.name for r in ROWS]}, "
            f"methods: {sorted({r.method for r in ROWS} - {'auto'})}"
        )
    return [r for r in ROWS if r.name == BASELINE or any(t in (r.name, r.method) for t in tokens)]


def method_defaults(method: str) -> dict:
    """conf/method/<method>.yaml without its name (the defaults the method runs with in launch.py)."""
    path = ROOT / "conf" / "method" / f"{method}.yaml"
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    return {k: v for k, v in (data or {}).items() if k != "name"}


def pick_questions(per_task: int, limit: int | None) -> list[dict]:
    questions = heldout_questions(per_task)
    if limit is None or limit >= len(questions):
        return questions
    by_task = [[q for q in questions if task_of(q["category"]) == t] for t in TASKS]
    interleaved = [q for group in zip(*[g + [None] * per_task for g in by_task]) for q in group if q]
    return interleaved[:limit]


class DeferralCounter:
    """Counts FLy's deferred drafts inside the accepted prefix by wrapping the rule's ``accept_mask``
    (no extra random draws: the rule's decisions and its generator stream are unchanged)."""

    def __init__(self, rule: FlyRule):
        self.deferred = 0
        original = rule.accept_mask

        def accept_mask(native, deferrable, draft_lens):
            mask = original(native, deferrable, draft_lens)
            in_prefix = mask.long().cumprod(1).bool()
            self.deferred += int((mask & ~native & in_prefix).sum())
            return mask

        rule.accept_mask = accept_mask


@dataclass
class Sample:
    """What one decode of one row produced beyond harness.Decoded."""

    rounds: int
    drafted: int
    accepted: int
    emitted: int
    deferred: int | None


def rule_runner(
    name: str,
    engine: SpeculativeEngine,
    seed: Callable[[], int],
    log: list[Sample],
    counter: DeferralCounter | None,
    warm: bool,
) -> Runner:
    """harness.engine_runner with the current seed and the round statistics of every decode kept in ``log``
    (in question order, which is run_all's order per runner)."""

    def run(ids: list[int]) -> Decoded:
        engine.reseed(seed())
        if counter is not None:
            counter.deferred = 0
        result = engine.generate([ids])[0]
        log.append(Sample(
            rounds=len(result.rounds), drafted=sum(r.drafted for r in result.rounds),
            accepted=sum(r.accepted for r in result.rounds), emitted=sum(r.emitted for r in result.rounds),
            deferred=counter.deferred if counter is not None else None,
        ))  # fmt: skip
        return Decoded(
            result.output_ids, result.wall_time, len(result.rounds), [r.emitted for r in result.rounds]
        )

    def warm_up(ids: list[int]) -> None:
        if warm:
            engine.reseed(seed())
            engine.generate([ids])

    return Runner(name, run, warm_up)


@torch.no_grad()
def score(model, prompt: list[int], output: list[int], vocab: int) -> float:
    """Σ log p(output_t | prompt, output_<t) under the verifier at T = 1, from one forward."""
    if not output:
        return 0.0
    ids = torch.tensor([prompt + output], device=model.device)
    logits = model(ids, logits_to_keep=len(output) + 1).logits[0, :-1, :vocab].float()
    logp = torch.log_softmax(logits, dim=-1)
    target = torch.tensor(output, device=logp.device).unsqueeze(-1)
    return float(logp.gather(-1, target).sum())


def mean_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    if len(values) == 1:
        return values[0], math.nan
    return statistics.mean(values), statistics.stdev(values) / math.sqrt(len(values))


def summarise(records: dict[str, list[dict]], figures: dict) -> dict[str, dict]:
    base = {(r["question_id"], r["seed"]): r for r in records[BASELINE]}
    summary = {}
    for name, rows in records.items():
        tokens = sum(r["tokens"] for r in rows)
        drafted = sum(r["drafted"] for r in rows)
        per_sample = [r["logprob"] / r["tokens"] for r in rows if r["tokens"]]
        deltas = [
            r["logprob"] / r["tokens"] - b["logprob"] / b["tokens"]
            for r in rows
            if r["tokens"] and (b := base[(r["question_id"], r["seed"])])["tokens"]
        ]
        delta, delta_se = mean_se(deltas)
        sample_mean, sample_se = mean_se(per_sample)
        deferred = [r["deferred"] for r in rows if r["deferred"] is not None]
        overall = figures[name]["overall"]
        summary[name] = {
            "tau": overall["tau"], "tokens_per_s": overall["tokens_per_s"], "speedup": overall["speedup"],
            "acceptance": sum(r["accepted"] for r in rows) / drafted if drafted else math.nan,
            "drafted_per_round": drafted / max(sum(r["rounds"] for r in rows), 1),
            "logprob_per_token": sum(r["logprob"] for r in rows) / tokens if tokens else math.nan,
            "logprob_sample_mean": sample_mean, "logprob_sample_se": sample_se,
            "delta_logprob_vs_ar": delta, "delta_logprob_se": delta_se,
            "deferred_per_round": (
                sum(deferred) / max(sum(r["rounds"] for r in rows), 1) if deferred else None
            ),
            "samples": len(rows), "tokens": tokens,
        }  # fmt: skip
    return summary


def record_rows(merged: dict[str, list[dict]], records: dict[str, list[dict]], summary: dict[str, dict],
                rules: dict[str, dict]) -> list[dict]:
    """Result-record rows, one per rule: speedup, τ and tokens/s (``harness.speed_rows`` over every question
    and seed), acceptance, the verifier's log-likelihood per token, its paired difference to autoregressive
    decoding (median and bootstrap interval over question x seed samples) and, for FLy, deferred drafts per
    round. Sampled at T = 1, so ``identical_outputs`` is null (outputs differ by design)."""
    rows = speed_rows(merged, BASELINE, greedy=False)
    base = {(r["question_id"], r["seed"]): r for r in records[BASELINE]}
    for row in rows:
        name, s = row["setup"], summary[row["setup"]]
        figures = row["figures"]
        if not math.isnan(s["acceptance"]):
            figures["acceptance"] = figure(s["acceptance"])
        if not math.isnan(s["logprob_per_token"]):
            figures["loglik_per_token"] = figure(s["logprob_per_token"])
        deltas = [
            r["logprob"] / r["tokens"] - b["logprob"] / b["tokens"]
            for r in records[name]
            if r["tokens"] and (b := base[(r["question_id"], r["seed"])])["tokens"]
        ]
        if name != BASELINE and deltas:
            figures["loglik_delta_vs_ar"] = figure(statistics.mean(deltas), deltas)
        if s["deferred_per_round"] is not None:
            figures["deferred_per_round"] = figure(s["deferred_per_round"])
        described = {k: v for k, v in rules[name].items() if k != "rule"}
        row["notes"] = f"rule {rules[name].get('rule', 'auto')}" + (
            f" {json.dumps(described)}" if described else ""
        )
    return rows


def finite(value):
    """``value`` with NaN / inf floats as None, so the JSON is standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def format_summary(summary: dict[str, dict], rules: dict[str, dict]) -> str:
    width = max(len(n) for n in summary) + 2
    header = (
        f"{'row':<{width}}{'tau':>6}{'accept':>8}{'tok/s':>8}{'speedup':>9}{'logp/tok':>10}"
        f"{'Δ vs AR ± se':>18}{'defer/rd':>10}  rule"
    )
    lines = [header, "-" * len(header)]
    for name, s in summary.items():
        accept = f"{s['acceptance']:>8.1%}" if not math.isnan(s["acceptance"]) else f"{'-':>8}"
        delta = "" if name == BASELINE else f"{s['delta_logprob_vs_ar']:+.3f} ± {s['delta_logprob_se']:.3f}"
        defer = f"{s['deferred_per_round']:>10.3f}" if s["deferred_per_round"] is not None else f"{'-':>10}"
        described = {k: v for k, v in rules[name].items() if k != "rule"}
        lines.append(
            f"{name:<{width}}{s['tau']:>6.2f}{accept}{s['tokens_per_s']:>8.1f}{s['speedup']:>8.2f}x"
            f"{s['logprob_per_token']:>10.3f}{delta:>18}{defer}  {rules[name].get('rule', 'auto')}"
            f"{' ' + json.dumps(described) if described else ''}"
        )
    return "\n".join(lines)


def exactness_lines(summary: dict[str, dict], specs: dict[str, RowSpec]) -> list[str]:
    lines = []
    for name, s in summary.items():
        if specs[name].family != "exact":
            continue
        delta, se = s["delta_logprob_vs_ar"], s["delta_logprob_se"]
        if s["samples"] < MIN_SAMPLES_FOR_VERDICT or math.isnan(se):
            verdict = f"too few samples for a noise verdict (< {MIN_SAMPLES_FOR_VERDICT})"
        else:
            verdict = "within noise (|Δ| ≤ 2 se)" if abs(delta) <= 2 * se else "OUTSIDE 2 se: check"
        lines.append(
            f"exact rule {name}: Δ logp/token vs autoregressive {delta:+.4f} ± {se:.4f} -> {verdict}"
        )
    return lines


def plot(path: Path, summary: dict[str, dict], specs: dict[str, RowSpec], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    base = summary[BASELINE]
    ax.axhline(base["logprob_per_token"], color="grey", linestyle="--", linewidth=1)
    if not math.isnan(base["logprob_sample_se"]):
        ax.axhspan(
            base["logprob_per_token"] - base["logprob_sample_se"],
            base["logprob_per_token"] + base["logprob_sample_se"],
            color="grey",
            alpha=0.15,
        )
    ax.text(
        0.01,
        base["logprob_per_token"],
        " autoregressive",
        transform=ax.get_yaxis_transform(),
        va="bottom",
        ha="left",
        color="grey",
        fontsize=8,
    )
    seen: set[str] = set()
    stacked: dict[tuple[float, float], int] = {}  # labels of coinciding points go one above the other
    for name, s in summary.items():
        family = specs[name].family
        if name == BASELINE or math.isnan(s["acceptance"]):
            continue
        colour, marker = FAMILY_STYLE[family]
        err = None if math.isnan(s["delta_logprob_se"]) else s["delta_logprob_se"]
        ax.errorbar(
            s["acceptance"],
            s["logprob_per_token"],
            yerr=err,
            fmt=marker,
            color=colour,
            markersize=11 if marker == "*" else 7,
            capsize=3,
            label=family if family not in seen else None,
        )
        seen.add(family)
        spot = (round(s["acceptance"], 3), round(s["logprob_per_token"], 2))
        stacked[spot] = stacked.get(spot, -1) + 1
        ax.annotate(
            f"{name} (τ {s['tau']:.2f})",
            (s["acceptance"], s["logprob_per_token"]),
            textcoords="offset points",
            xytext=(6, 4 + 10 * stacked[spot]),
            fontsize=8,
        )
    ax.set_xlabel("acceptance rate (accepted drafts / drafted)")
    ax.set_ylabel("mean log p per emitted token under the verifier (T = 1)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def drafter_factory(args, verifier, vocab: int) -> tuple[str, Callable[[], Any]]:
    """The drafter every speculative row decodes with (a fresh one per row) and how the report names it."""
    drafter_kind = args.drafter or ("eagle3" if Path(args.head).is_file() else "early-exit")
    if drafter_kind == "eagle3":
        from specbench.drafters.eagle3.format import load_eagle3_drafter

        label = f"eagle3 head {args.head}"

        def make_drafter():
            return load_eagle3_drafter(args.head, verifier, vocab)
    else:
        from specbench.decoding.model_drafter import ModelDrafter
        from specbench.models.early_exit import early_exit_drafter

        label = f"early-exit, first {args.layers} layers of the verifier"

        def make_drafter():
            return ModelDrafter(early_exit_drafter(verifier.model, args.layers), vocab)

    how = (
        ""
        if args.drafter
        else f" (default: {args.head} {'found' if drafter_kind == 'eagle3' else 'not found'})"
    )
    print(f"drafter: {label}{how}", file=sys.stderr)
    return label, make_drafter


@dataclass
class RuleEngines:
    """One engine per row that could be built, the FLy rows' deferral counters, each row's rule description
    and the rows that could not be built (with why)."""

    engines: dict[str, SpeculativeEngine]
    counters: dict[str, DeferralCounter]
    rules: dict[str, dict]
    problems: list[str]


def build_rule_engines(
    specs: dict[str, RowSpec], model, make_drafter, common: dict, gamma: int
) -> RuleEngines:
    built = RuleEngines({}, {}, {}, [])
    for name, spec in specs.items():
        if spec.method == "auto":
            built.engines[name] = SpeculativeEngine(model, None, **common)
            built.rules[name] = {"rule": "auto"}
            continue
        params = {**method_defaults(spec.method), **spec.params}
        try:
            rule = build_rule(spec.method, **params)
            engine = SpeculativeEngine(
                model, make_drafter(), rule=rule, schedule=DraftSchedule("constant", gamma), **common
            )
        except ValueError as error:
            built.problems.append(f"{name}: {error}")
            print(f"skipping row {name}: {error}", file=sys.stderr)
            continue
        built.engines[name] = engine
        built.rules[name] = rule.describe()
        if isinstance(rule, FlyRule):
            built.counters[name] = DeferralCounter(rule)
    return built


def decode_seeds(
    built: RuleEngines, seeds: list[int], tokenizer, model, questions: list[dict], vocab: int
) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """Every row over every question once per seed: the answer rows (question ids suffixed by the seed) and
    the per-sample records (tokens, verifier log-prob, rounds, drafts, deferrals, wall time)."""
    prompts = {q["question_id"]: first_turn_ids(tokenizer, q) for q in questions}
    current = {"seed": seeds[0]}
    merged: dict[str, list[dict]] = {name: [] for name in built.engines}
    records: dict[str, list[dict]] = {name: [] for name in built.engines}
    for number, seed in enumerate(seeds):
        current["seed"] = seed
        logs: dict[str, list[Sample]] = {name: [] for name in built.engines}
        runners = [
            rule_runner(
                name, engine, lambda: current["seed"], logs[name], built.counters.get(name), number == 0
            )
            for name, engine in built.engines.items()
        ]
        print(f"seed {seed}", file=sys.stderr)
        answers = run_all(runners, tokenizer, questions)
        for name, rows in answers.items():
            for row, sample in zip(rows, logs[name], strict=True):
                qid = row["question_id"]
                output = row["output_ids"]
                logprob = score(model, prompts[qid], output, vocab)
                records[name].append({
                    "question_id": qid, "category": row["category"], "seed": seed, "tokens": len(output),
                    "logprob": logprob, "rounds": sample.rounds, "drafted": sample.drafted,
                    "accepted": sample.accepted, "deferred": sample.deferred,
                    "wall_time": row["choices"][0]["wall_time"][0],
                })  # fmt: skip
                merged[name].append({**row, "question_id": f"{qid}/seed{seed}"})
    return merged, records


def block_against_sd(summary: dict) -> dict | None:
    """The block rule's τ, acceptance and tokens/s as ratios to sd's (None unless both rows ran)."""
    if "block" not in summary or "sd" not in summary:
        return None
    b, s = summary["block"], summary["sd"]
    return {
        "tau": ratio(b["tau"], s["tau"]),
        "acceptance": ratio(b["acceptance"], s["acceptance"]),
        "tokens_per_s": ratio(b["tokens_per_s"], s["tokens_per_s"]),
    }


def print_results(figures, summary, built: RuleEngines, specs, block_vs_sd, questions, seeds) -> None:
    print()
    print(format_table(figures))
    print()
    print(format_summary(summary, built.rules))
    print()
    for line in exactness_lines(summary, specs):
        print(line)
    if block_vs_sd:
        print(
            f"block / sd over the same {len(questions)} prompts x {len(seeds)} seeds: τ ratio "
            f"{block_vs_sd['tau']:.3f} ({block_vs_sd['tau'] - 1:+.1%}), acceptance ratio "
            f"{block_vs_sd['acceptance']:.3f}, tokens/s ratio {block_vs_sd['tokens_per_s']:.3f} "
            "(Sun et al.: +5-8 % wall-clock)"
        )
    for problem in built.problems:
        print(f"row not run: {problem}")


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not seeds:
        raise SystemExit("--seeds: give at least one seed")
    specs = {r.name: r for r in select_rows(args.only)}
    out = out_dir(args.out_dir, "rules")

    verifier = load_verifier(ModelSpec(kind="embedded"), args.device, args.dtype)
    tokenizer, model = verifier.tokenizer, verifier.model
    eos = eos_token_ids(model, tokenizer)
    vocab = min(len(tokenizer), model.get_output_embeddings().weight.shape[0])
    drafter_label, make_drafter = drafter_factory(args, verifier, vocab)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, temperature=1.0)
    pad = pad_token_id(tokenizer, eos)
    common = {"settings": settings, "vocab_size": vocab, "eos_token_ids": eos, "pad_token_id": pad}
    built = build_rule_engines(specs, model, make_drafter, common, args.gamma)
    engines, rules, problems = built.engines, built.rules, built.problems
    specs = {n: s for n, s in specs.items() if n in engines}

    questions = pick_questions(args.per_task, args.limit)
    print(
        f"{len(questions)} questions x {len(seeds)} seeds x {len(engines)} rows, T = 1, gamma = "
        f"{args.gamma}, "
        f"max_new_tokens = {args.max_new_tokens}",
        file=sys.stderr,
    )
    merged, records = decode_seeds(built, seeds, tokenizer, model, questions, vocab)
    figures = table(merged, BASELINE)
    summary = summarise(records, figures)
    block_vs_sd = block_against_sd(summary)
    print_results(figures, summary, built, specs, block_vs_sd, questions, seeds)

    out.mkdir(parents=True, exist_ok=True)
    title = (
        f"SmolLM2-135M-Instruct verifier, {drafter_label}\nT = 1, γ = {args.gamma}, "
        f"{len(questions)} questions x seeds {seeds}, {args.max_new_tokens} new tokens"
    )
    report = {
        "measures": (
            "verification rules at T=1: tau, acceptance, tokens/s, speedup, verifier log-prob per token"
        ),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "drafter": drafter_label, "gamma": args.gamma, "temperature": 1.0, "seeds": seeds,
        "max_new_tokens": args.max_new_tokens, "threads": args.threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "device": str(model.device),
        "dtype": str(model.dtype),
        "questions": [q["question_id"] for q in questions],
        "rows": {name: {"method": specs[name].method, "family": specs[name].family, **rules[name]}
                 for name in engines},
        "summary": summary, "block_vs_sd": block_vs_sd, "figures": figures, "problems": problems,
        "records": records,
    }  # fmt: skip
    (out / "rules.json").write_text(json.dumps(finite(report), indent=2, default=str) + "\n")
    if not args.no_plot:
        plot(out / "rules.png", summary, specs, title)
    print(f"figures: {out / 'rules.json'}" + ("" if args.no_plot else f", plot: {out / 'rules.png'}"))
    record_run(
        args, "rules", record_rows(merged, records, summary, rules),
        f"spec_bench heldout (first turn) x seeds {','.join(map(str, seeds))}", len(questions) * len(seeds),
        device=str(model.device), dtype=str(model.dtype).removeprefix("torch."), threads=args.threads,
        doc="docs/rules-block-and-fly.md#benchmark",
        notes=f"T = 1, gamma {args.gamma}, drafter {drafter_label}, {args.max_new_tokens} new tokens; "
        "log-likelihood per token under the verifier at T = 1"
        + "".join(f"; row not run: {p}" for p in problems),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
