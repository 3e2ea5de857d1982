"""Spec-Bench: answer files and the per-category speedup table, from one run over question.jsonl.

For every question (all turns by default, each turn in the conversation of the previous answers, as
Spec-Bench's ``evaluation/eval.py`` does) the method and the autoregressive baseline of the same
verifier decode in this process, alternating which goes first. Two answer files in Spec-Bench's format
are written (one JSON line per question: ``question_id``, ``category``, ``answer_id``, ``model_id``,
``tstamp`` and ``choices[0]`` with ``turns``, ``new_tokens``, ``wall_time``, ``decoding_steps`` and
``accept_lengths`` per turn / per step), then the table of Spec-Bench's ``evaluation/speed.py``: per task
the #mean accepted tokens (mean tokens per verifier step = τ) and the speedup (mean over questions of
tokens/s, method ÷ baseline), and a row in the format of its leaderboard.

    python benchmarks/spec_bench.py --limit 12 --max-new-tokens 128          # embedded SmolLM2 + early exit
    python benchmarks/spec_bench.py --categories translation,qa --method lossy --param lenience=0.5
    python benchmarks/spec_bench.py --from-files METHOD.jsonl BASELINE.jsonl    # table of existing files

Tokens are counted from the generated ids for both files (Spec-Bench re-tokenizes the baseline's text).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import benchmark_parser

from specbench.data.dataset_sources import question_file
from specbench.data.dataset_specs import MT_BENCH_CATEGORIES, SPEC_BENCH_CATEGORIES
from specbench.data.datasets import encode_messages
from specbench.data.prompts import read_jsonl, subset
from specbench.decoding import DraftSchedule, GenerationSettings, SpeculativeEngine
from specbench.decoding.methods import build_rule, canonical_method
from specbench.evaluation import build_engines, warm_up
from specbench.models import ModelSpec, load_verifier
from specbench.pairs import load_drafter
from specbench.results import bootstrap_interval, record_run
from specbench.results.record import figure

# Spec-Bench's tasks (speed.py) and the column titles of its leaderboard.
TASKS = (
    ("mt_bench", "Multi-turn Conversation"),
    ("translation", "Translation"),
    ("summarization", "Summa-rization"),
    ("qa", "Question Answering"),
    ("math_reasoning", "Mathematical Reasoning"),
    ("rag", "Retrieval-aug. Generation"),
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(
        __doc__, questions={"default": None, "help": "question.jsonl (default: Spec-Bench's, see docs)"},
        out_dir={"default": None, "help": "answer files go here (default outputs/spec_bench/TIME)"},
        max_new_tokens={"default": 1024, "help": "per turn (Spec-Bench: 1024)"}, seed=0, device="auto",
        dtype="float32", threads=None,
    )  # fmt: skip
    parser.add_argument("--limit", type=int, default=None, help="number of questions (after --categories)")
    parser.add_argument("--seed-subset", type=int, default=None, help="seeded random --limit questions")
    parser.add_argument(
        "--categories", default=None, help="comma list of categories; 'mt_bench' stands for its 8 categories"
    )
    parser.add_argument("--turns", choices=("all", "first"), default="all")
    parser.add_argument("--method", default="sd", help="sd, lossy, static_ensemble, cascade, typical, auto")
    parser.add_argument("--param", action="append", default=[], help="rule parameter KEY=VALUE (repeatable)")
    parser.add_argument("--schedule", default="constant", choices=("constant", "heuristic", "dynamic"))
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--verifier", default="embedded", help="embedded (SmolLM2-135M-Instruct), tiny-random, hub id or path"
    )
    parser.add_argument(
        "--drafter", default="early-exit", help="early-exit (K=--drafter-layers), tiny-random, hub id or path"
    )
    parser.add_argument("--drafter-layers", type=int, default=4)
    parser.add_argument(
        "--model-id", default=None, help="model id in the answer files (default: the verifier)"
    )
    parser.add_argument("--from-files", nargs=2, metavar=("METHOD", "BASELINE"), help="only print the table")
    return parser.parse_args(argv)


# -- questions ---------------------------------------------------------------------------------------


def expand_categories(text: str | None) -> list[str] | None:
    if not text:
        return None
    chosen: list[str] = []
    for name in (c.strip() for c in text.split(",") if c.strip()):
        names = MT_BENCH_CATEGORIES if name == "mt_bench" else (name,)
        for each in names:
            if each not in SPEC_BENCH_CATEGORIES:
                raise ValueError(
                    f"--categories: unknown category {each!r}; allowed: {list(SPEC_BENCH_CATEGORIES)}"
                )
            if each not in chosen:
                chosen.append(each)
    return chosen


def load_questions(
    path: str | Path | None,
    categories: list[str] | None = None,
    limit: int | None = None,
    seed: int | None = None,
) -> list[dict]:
    """Rows of a Spec-Bench question file (question_id, category, turns), filtered and subset."""
    path = Path(path) if path else question_file()
    if not path.is_file():
        raise FileNotFoundError(
            f"question file {str(path)!r} does not exist; pass --questions (Spec-Bench's "
            "data/spec_bench/question.jsonl)"
        )
    rows = [row for _, row in read_jsonl(path)]
    for row in rows:
        if not isinstance(row.get("turns"), list) or not row["turns"]:
            raise ValueError(f"{path}: question {row.get('question_id')!r} has no 'turns' list")
    if categories:
        rows = [row for row in rows if row.get("category") in categories]
    return subset(rows, limit, seed)


# -- models and decoding -----------------------------------------------------------------------------


def _spec(name: str, role: str, layers: int) -> ModelSpec:
    if name == "embedded":
        return ModelSpec(kind="embedded")
    if name == "early-exit":
        return ModelSpec(kind="early_exit", num_layers=layers)
    if name == "tiny-random":
        return (
            ModelSpec(kind="tiny_random", name="tiny-random-llama", seed=0)
            if role == "verifier"
            else ModelSpec(kind="tiny_random", name="tiny-random-llama-drafter", seed=1, num_layers=1)
        )
    return ModelSpec(kind="local" if Path(name).expanduser().exists() else "hub", path=name)


def build(args: argparse.Namespace) -> tuple[SpeculativeEngine, SpeculativeEngine, object, str]:
    """(method engine, autoregressive engine, verifier, method label)."""
    method = canonical_method(args.method)
    params = {}
    for item in args.param:
        key, _, value = item.partition("=")
        params[key] = value if key in ("pool", "deferral") else float(value)
    rule = build_rule(method, **params)
    verifier = load_verifier(_spec(args.verifier, "verifier", args.drafter_layers), args.device, args.dtype)
    drafter = None
    if method != "auto":
        drafter = load_drafter(
            _spec(args.drafter, "drafter", args.drafter_layers), verifier, args.device, args.dtype
        )
    settings = GenerationSettings(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed
    )
    schedule = DraftSchedule(args.schedule, args.gamma)
    engine, baseline = build_engines(verifier, drafter, rule, schedule, settings, baseline=True)
    if baseline is None:  # method=auto: the method is autoregressive decoding itself
        baseline = engine
    label = method if method == "auto" else f"{method}-{args.schedule}-gamma{args.gamma}"
    return engine, baseline, verifier, label


def answer_question(
    engine: SpeculativeEngine, tokenizer, question: dict, turns: str = "all", output_ids: list | None = None
) -> dict:
    """Spec-Bench's ``choices[0]`` for one question: each turn answered in the conversation so far (each
    turn's generated ids are appended to ``output_ids`` when given)."""
    messages: list[dict[str, str]] = []
    choice = {
        "index": 0,
        "turns": [],
        "decoding_steps": [],
        "new_tokens": [],
        "wall_time": [],
        "accept_lengths": [],
    }
    for text in question["turns"][: 1 if turns == "first" else None]:
        messages.append({"role": "user", "content": text})
        ids, _ = encode_messages(tokenizer, messages)
        result = engine.generate([ids])[0]
        if output_ids is not None:
            output_ids.append(list(result.output_ids))
        output = tokenizer.decode(result.output_ids, skip_special_tokens=True).strip()
        messages.append({"role": "assistant", "content": output})
        choice["turns"].append(output)
        choice["decoding_steps"].append(len(result.rounds))
        choice["new_tokens"].append(len(result.output_ids))
        choice["wall_time"].append(result.wall_time)
        choice["accept_lengths"].extend(r.emitted for r in result.rounds)
    return choice


def run_benchmark(
    engine: SpeculativeEngine,
    baseline: SpeculativeEngine,
    tokenizer,
    questions: list[dict],
    model_ids: tuple[str, str] = ("method", "vanilla"),
    turns: str = "all",
    progress: bool = True,
) -> tuple[list[dict], list[dict]]:
    """Answers of the method and of the baseline (``model_ids`` name them), each question decoded by both
    in turn, alternating which goes first. Each row also holds ``output_ids`` (the generated ids per turn,
    not written to the answer files)."""
    first_ids, _ = encode_messages(tokenizer, [{"role": "user", "content": questions[0]["turns"][0]}])
    for each in (engine, baseline):
        warm_up(each, first_ids)
    answers: dict[str, list[dict]] = {"method": [], "baseline": []}
    order = [("method", engine), ("baseline", baseline)]
    for number, question in enumerate(questions):
        for name, each in order if number % 2 == 0 else order[::-1]:
            generated: list[list[int]] = []
            choice = answer_question(each, tokenizer, question, turns, generated)
            answers[name].append(
                {
                    "question_id": question["question_id"],
                    "category": question["category"],
                    "answer_id": uuid.uuid4().hex,
                    "model_id": model_ids[0] if name == "method" else model_ids[1],
                    "choices": [choice],
                    "tstamp": time.time(),
                    "output_ids": generated,
                }
            )
        if progress:
            last = answers["method"][-1]["choices"][0], answers["baseline"][-1]["choices"][0]
            speeds = [sum(c["new_tokens"]) / max(sum(c["wall_time"]), 1e-9) for c in last]
            print(
                f"[{number + 1}/{len(questions)}] {question['category']}: method {speeds[0]:.1f} tok/s, "
                f"baseline {speeds[1]:.1f} tok/s",
                file=sys.stderr,
            )
    for rows in answers.values():
        rows.sort(key=lambda row: row["question_id"])  # as Spec-Bench's reorg_answer_file
    return answers["method"], answers["baseline"]


def write_answers(path: Path, answers: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({k: v for k, v in row.items() if k != "output_ids"}, ensure_ascii=False) for row in answers
    ]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


# -- Spec-Bench's speed table ------------------------------------------------------------------------


def _select(rows: list[dict], task: str) -> list[dict]:
    if task == "overall":
        return rows
    if task == "mt_bench":
        return [r for r in rows if r["category"] in MT_BENCH_CATEGORIES]
    return [r for r in rows if r["category"] == task]


def speed(method_rows: list[dict], baseline_rows: list[dict], task: str) -> dict | None:
    """Spec-Bench's speed(): per-question tokens/s of each file, speedup of the means, mean accept length."""
    method, base = _select(method_rows, task), _select(baseline_rows, task)
    if not method or not base:
        return None
    speeds = [sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in method]
    base_speeds = [sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in base]
    accept = [a for r in method for a in r["choices"][0]["accept_lengths"]]
    return {
        "mean_accepted_tokens": float(np.mean(accept)) if accept else float("nan"),
        "tokens_per_s": float(np.mean(speeds)),
        "baseline_tokens_per_s": float(np.mean(base_speeds)),
        "speedup": float(np.mean(speeds) / np.mean(base_speeds)),
        "num_questions": len(method),
    }


def speed_table(method_rows: list[dict], baseline_rows: list[dict]) -> dict[str, dict]:
    """speed() for each of Spec-Bench's tasks present, and overall."""
    table = {}
    for task in [t for t, _ in TASKS] + ["overall"]:
        figures = speed(method_rows, baseline_rows, task)
        if figures is not None:
            table[task] = figures
    return table


def format_report(table: dict[str, dict], label: str) -> str:
    """speed.py's per-task blocks, then a leaderboard row (``-`` for tasks not in the run)."""
    lines = []
    for task, figures in table.items():
        lines += [
            f"{'=' * 30} Task:  {task} {'=' * 30}",
            f"#Mean accepted tokens:  {figures['mean_accepted_tokens']:.4f}",
            f"Tokens per second:  {figures['tokens_per_s']:.4f}",
            f"Tokens per second for the baseline:  {figures['baseline_tokens_per_s']:.4f}",
            f"Speedup ratio:  {figures['speedup']:.4f}",
        ]
    columns = [title for _, title in TASKS] + ["#Mean Accepted Tokens", "Overall"]
    cells = [f"{table[t]['speedup']:.2f}x" if t in table else "-" for t, _ in TASKS]
    overall = table.get("overall")
    cells += (
        [f"{overall['mean_accepted_tokens']:.2f}", f"{overall['speedup']:.2f}x"] if overall else ["-", "-"]
    )
    lines += [
        "",
        "| Models | " + " | ".join(columns) + " |",
        "| --- | " + " | ".join(":---:" for _ in columns) + " |",
        f"| {label} | " + " | ".join(cells) + " |",
    ]
    return "\n".join(lines)


# -- the result record -------------------------------------------------------------------------------


def _question_speed(row: dict) -> float:
    return sum(row["choices"][0]["new_tokens"]) / max(sum(row["choices"][0]["wall_time"]), 1e-9)


def _ratio_of_means(pairs) -> float:
    return statistics.mean(s for s, _ in pairs) / max(statistics.mean(b for _, b in pairs), 1e-9)


def record_rows(
    method_rows: list[dict], baseline_rows: list[dict], table: dict[str, dict], label: str, lossless: bool
) -> list[dict]:
    """Result-record rows of a run: the baseline's tokens/s, and the method's speedup (Spec-Bench's ratio of
    mean tokens/s, with the median per-question ratio and a bootstrap interval over questions), speedup per
    task, τ (#mean accepted tokens) and tokens/s. ``identical_outputs``: whether every turn's token ids equal
    the baseline's, for a greedy run of a lossless method (None otherwise: sampling or a lossy rule)."""
    reference = {row["question_id"]: row for row in baseline_rows}
    pairs = [(_question_speed(r), _question_speed(reference[r["question_id"]])) for r in method_rows]
    overall = table["overall"]
    speedup = figure(overall["speedup"], unit="x")
    if len(pairs) >= 2:
        speedup["median"] = statistics.median(s / max(b, 1e-9) for s, b in pairs)
        speedup["interval"] = list(bootstrap_interval(pairs, _ratio_of_means))
    taus = [statistics.mean(a) for r in method_rows if (a := r["choices"][0]["accept_lengths"])]
    figures = {"speedup": speedup, "tau": figure(overall["mean_accepted_tokens"], taus),
               "tokens_per_s": figure(overall["tokens_per_s"], [s for s, _ in pairs])}  # fmt: skip
    for task, values in table.items():
        if task != "overall":
            figures[f"speedup_{task}"] = figure(values["speedup"], unit="x")
    same = None
    if lossless and all("output_ids" in r for r in method_rows + baseline_rows):
        same = all(r["output_ids"] == reference[r["question_id"]]["output_ids"] for r in method_rows)
    base = {"setup": "autoregressive", "identical_outputs": True if lossless else None,
            "figures": {"tokens_per_s": figure(overall["baseline_tokens_per_s"],
                                               [b for _, b in pairs])}}  # fmt: skip
    return [base, {"setup": label, "figures": figures, "identical_outputs": same}]


def prompt_set(args: argparse.Namespace, questions: list[dict]) -> str:
    """The questions of the run in words: file, categories, subset and turns."""
    parts = ["spec_bench" if not args.questions else str(args.questions)]
    if args.categories:
        parts.append(f"categories {args.categories}")
    if args.limit is not None:
        parts.append(f"{len(questions)} questions"
                     + (f" (seed {args.seed_subset})" if args.seed_subset is not None else ""))  # fmt: skip
    parts.append("first turn" if args.turns == "first" else "all turns")
    return ", ".join(parts)


def _read_answers(path: str | Path) -> list[dict]:
    return [row for _, row in read_jsonl(path)]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_files:
        method_rows, baseline_rows = (_read_answers(p) for p in args.from_files)
        print(format_report(speed_table(method_rows, baseline_rows), Path(args.from_files[0]).stem))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    questions = load_questions(
        args.questions, expand_categories(args.categories), args.limit, args.seed_subset
    )
    if not questions:
        print("no questions selected", file=sys.stderr)
        return 2
    engine, baseline, verifier, label = build(args)
    model_id = args.model_id or verifier.name.rstrip("/").split("/")[-1].replace(" ", "-")
    dtype = str(verifier.model.dtype).removeprefix("torch.")
    suffix = f"{dtype}-temp-{args.temperature}"
    ids = (f"{model_id}-{label}-{suffix}", f"{model_id}-vanilla-{suffix}")
    method_rows, baseline_rows = run_benchmark(
        engine, baseline, verifier.tokenizer, questions, ids, args.turns
    )
    out = Path(args.out_dir or Path("outputs") / "spec_bench" / time.strftime("%Y-%m-%d_%H-%M-%S"))
    method_file, baseline_file = (out / f"{name}.jsonl" for name in ids)
    write_answers(method_file, method_rows)
    write_answers(baseline_file, baseline_rows)
    table = speed_table(method_rows, baseline_rows)
    (out / "speed.json").write_text(
        json.dumps({"method": label, "model_id": model_id, "tasks": table}, indent=2)
    )
    print(format_report(table, f"{label} ({model_id})"))
    print(f"\nanswers: {method_file}\n         {baseline_file}")
    lossless = args.temperature == 0.0 and (label == "auto" or bool(engine.rule.lossless))
    record_run(
        args,
        "spec_bench",
        record_rows(method_rows, baseline_rows, table, label, lossless),
        prompt_set(args, questions),
        len(questions),
        device=str(verifier.model.device),
        dtype=dtype,
        threads=torch.get_num_threads(),
        doc="docs/datasets.md#spec-bench-answer-files-and-table",
        notes=f"verifier {model_id}, drafter {args.drafter}"
        + (f" (K = {args.drafter_layers})" if args.drafter == "early-exit" else "")
        + f", {args.schedule} gamma {args.gamma}, {args.max_new_tokens} new tokens per turn, "
        f"temperature {args.temperature}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
