"""Side-by-side speed benchmarks on Spec-Bench questions, shared by the benchmark scripts.

Every method is a :class:`Runner` (``ids -> Decoded``); for each question the runners decode its first
turn one after another in one process, in an order that rotates from question to question, so drifts of
a shared machine hit all of them alike. Reported per Spec-Bench task: τ (tokens per verifier forward),
mean tokens/s over questions and the speedup against the autoregressive runner (Spec-Bench's speed.py
convention: ratio of the means), plus whether every output is token-identical to autoregressive decoding.
Answer files in Spec-Bench's format are written per runner.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.data.dataset_sources import question_file
from specbench.data.dataset_specs import MT_BENCH_CATEGORIES
from specbench.data.dataset_subsets import in_subset
from specbench.data.datasets import encode_messages
from specbench.data.prompts import read_jsonl
from specbench.results import add_record_options, record_run  # scripts import record_run from here
from specbench.results.record import bootstrap_interval, figure

if TYPE_CHECKING:  # pragma: no cover  (torch loads when a runner is built, so the parser stays torch-free)
    import torch

    from specbench.decoding import SpeculativeEngine

TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
TASK_TITLES = {
    "mt_bench": "MT", "translation": "Trans", "summarization": "Summ", "qa": "QA",
    "math_reasoning": "Math", "rag": "RAG",
}  # fmt: skip


# The flags several scripts take, with their help; a script's benchmark_parser(...) call names the ones it
# takes and their defaults.
COMMON_FLAGS: dict[str, dict[str, Any]] = {
    "questions": {"help": "Spec-Bench question.jsonl (or any prompt jsonl); default: Spec-Bench's"},
    "per_task": {"type": int, "help": "held-out questions per Spec-Bench task"},
    "per_category": {"type": int, "help": "prompts per category"},
    "num_prompts": {"type": int, "help": "prompts to decode"},
    "max_new_tokens": {"type": int, "help": "new tokens per answer"},
    "threads": {"type": int, "help": "torch CPU threads (1 is stable on a busy machine)"},
    "device": {"help": "cpu | cuda | auto"},
    "dtype": {"help": "auto (as runtime.dtype=auto) | float32 | bfloat16 | float16"},
    "seed": {"type": int, "help": "sampling seed"},
    "out_dir": {"help": "where answer files go (default: outputs/NAME/TIME)"},
}
_NOT_TAKEN = object()


def benchmark_parser(doc: str | None, **defaults: Any) -> argparse.ArgumentParser:
    """The parser every benchmark script starts from: its docstring as the description, the result-record
    options (``--no-record``, ``--results-dir``, ``--headline``) and each :data:`COMMON_FLAGS` flag named in
    ``defaults`` (``per_task=3`` adds ``--per-task`` with default 3; a dict such as
    ``dict(default=..., required=True, help=...)`` overrides more than the default). The script adds its own
    flags to the returned parser."""
    unknown = set(defaults) - set(COMMON_FLAGS)
    if unknown:
        raise ValueError(
            f"no common benchmark flag {sorted(unknown)}; add it to COMMON_FLAGS or to the script"
        )
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for key, value in defaults.items():
        options = {**COMMON_FLAGS[key], **(value if isinstance(value, dict) else {"default": value})}
        parser.add_argument(f"--{key.replace('_', '-')}", **options)
    add_record_options(parser)
    return parser


def task_of(category: str) -> str:
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


@dataclass
class Decoded:
    output_ids: list[int]
    wall_time: float
    steps: int  # verifier forwards in decoding (rounds)
    accept_lengths: list[int] = field(default_factory=list)  # tokens emitted per step
    drafted: list[int] = field(default_factory=list)  # drafts per round (speculative runners)
    accepted: list[int] = field(default_factory=list)  # of them accepted, per round
    draft_time: float = 0.0  # seconds drafting, all rounds
    verify_time: float = 0.0  # seconds in verification forwards, all rounds


@dataclass
class Runner:
    name: str
    run: Callable[[list[int]], Decoded]
    warm: Callable[[list[int]], None] | None = None


def engine_runner(name: str, engine: SpeculativeEngine) -> Runner:
    from specbench.evaluation import forgetting

    def run(ids: list[int]) -> Decoded:
        engine.reseed(engine.settings.seed)
        result = engine.generate([ids])[0]
        rounds = result.rounds
        return Decoded(
            result.output_ids, result.wall_time, len(rounds), [r.emitted for r in rounds],
            [r.drafted for r in rounds], [r.accepted for r in rounds], sum(r.draft_time for r in rounds),
            sum(r.verify_time for r in rounds),
        )  # fmt: skip

    def warm(ids: list[int]) -> None:
        with forgetting(engine.drafter):
            run(ids)

    return Runner(name, run, warm)


@dataclass
class Setup:
    """One row of a speed benchmark: its name, its drafter (None: autoregressive decoding) and draft schedule
    (None: the engine's default). Scripts list their rows as setups; :func:`setup_runners` builds them."""

    name: str
    drafter: Any = None
    schedule: Any = None


def setup_runners(model, setups: Sequence[Setup], **common: Any) -> list[Runner]:
    """An :func:`engine_runner` per setup, in order, on ``model`` with the shared engine arguments."""
    from specbench.decoding import SpeculativeEngine

    return [
        engine_runner(setup.name, SpeculativeEngine(model, setup.drafter, schedule=setup.schedule, **common))
        for setup in setups
    ]


def switched_runner(name: str, engine: SpeculativeEngine, switch: Callable[[], None]) -> Runner:
    """:func:`engine_runner` that calls ``switch()`` (e.g. puts a shared model on one of its forwards) before
    every decode, for rows that share one model in different configurations."""
    inner = engine_runner(name, engine)

    def run(ids: list[int]) -> Decoded:
        switch()
        return inner.run(ids)

    return Runner(name, run)


def verify_ms_in_turn(
    setups: dict[str, tuple[torch.nn.Module, Callable[[], None], int]], vocab: int, max_n: int, rounds: int
) -> dict[str, list[float]]:
    """Per setup (name -> (model, switch, cached tokens)), the median over ``rounds`` of the verifier
    forward's ms for n = 1..max_n new tokens; the setups take turns in every round, each switched on first."""
    from specbench.decoding.cost import measure_verify_ms

    timings: dict[str, list[list[float]]] = {name: [] for name in setups}
    for _ in range(rounds):
        for name, (model, switch, context) in setups.items():
            switch()
            timings[name].append(measure_verify_ms(model, vocab, max_n, context_len=context, repeats=3))
    return {
        name: [statistics.median(r[n] for r in rows) for n in range(max_n)] for name, rows in timings.items()
    }


def hf_runner(
    name: str, model, max_new_tokens: int, eos: Sequence[int], pad: int, **generate_kwargs
) -> Runner:
    """HF ``generate`` (greedy) with a forward counter on the verifier, e.g.
    ``prompt_lookup_num_tokens=10``."""
    import torch

    calls = {"n": 0}

    def count(module, args, kwargs):
        calls["n"] += 1

    model.register_forward_pre_hook(count, with_kwargs=True)

    def run(ids: list[int]) -> Decoded:
        calls["n"] = 0
        x = torch.tensor([ids], device=model.device)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                eos_token_id=list(eos), pad_token_id=pad, **generate_kwargs,
            )  # fmt: skip
        wall = time.perf_counter() - start
        return Decoded(out[0, len(ids):].tolist(), wall, calls["n"])

    return Runner(name, run)


def heldout_questions(per_task: int, path: str | Path | None = None, subset: str = "heldout",
                      fraction: float = 0.2) -> list[dict]:
    """The first ``per_task`` questions of each Spec-Bench task in the held-out part (the part no
    training data was sampled from: ``dataset=spec_bench dataset.subset=train`` is the rest); MT-bench
    questions are taken round-robin over its categories."""
    rows = [row for _, row in read_jsonl(Path(path) if path else question_file())]
    rows = [r for r in rows if in_subset("spec_bench", r["question_id"], subset, fraction)]
    chosen = []
    for task in TASKS:
        pool = [r for r in rows if task_of(r["category"]) == task]
        if task == "mt_bench":
            by_category = [[r for r in pool if r["category"] == c] for c in MT_BENCH_CATEGORIES]
            pool = [r for group in zip(*[g + [None] * len(pool) for g in by_category]) for r in group if r]
        chosen += pool[:per_task]
    return chosen


def first_turn_ids(tokenizer, question: dict) -> list[int]:
    return encode_messages(tokenizer, [{"role": "user", "content": question["turns"][0]}])[0]


def run_all(
    runners: list[Runner], tokenizer, questions: list[dict], progress: bool = True
) -> dict[str, list[dict]]:
    """Answers of every runner, per question, in rotating order; each runner warmed up first."""
    first = first_turn_ids(tokenizer, questions[0])
    for runner in runners:
        (runner.warm or runner.run)(first[: min(len(first), 64)])
    answers: dict[str, list[dict]] = {r.name: [] for r in runners}
    for number, question in enumerate(questions):
        ids = first_turn_ids(tokenizer, question)
        shift = number % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            decoded = runner.run(ids)
            answers[runner.name].append({
                "question_id": question["question_id"], "category": question["category"],
                "answer_id": uuid.uuid4().hex, "model_id": runner.name, "tstamp": time.time(),
                "output_ids": decoded.output_ids,
                "choices": [{
                    "index": 0,
                    "turns": [tokenizer.decode(decoded.output_ids, skip_special_tokens=True).strip()],
                    "decoding_steps": [decoded.steps], "new_tokens": [len(decoded.output_ids)],
                    "wall_time": [decoded.wall_time], "accept_lengths": decoded.accept_lengths,
                    "drafted": decoded.drafted, "accepted": decoded.accepted,
                    "draft_time": decoded.draft_time, "verify_time": decoded.verify_time,
                }],
            })  # fmt: skip
        if progress:
            speeds = {name: rows[-1]["choices"][0]["new_tokens"][0] / rows[-1]["choices"][0]["wall_time"][0]
                      for name, rows in answers.items()}  # fmt: skip
            line = ", ".join(f"{name} {value:.1f}" for name, value in speeds.items())
            print(f"[{number + 1}/{len(questions)}] {question['category']}: {line} tok/s", file=sys.stderr)
    return answers


def write_answer_files(out_dir: Path, answers: dict[str, list[dict]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in answers.items():
        path = out_dir / f"{name}.jsonl"
        lines = [
            json.dumps({k: v for k, v in row.items() if k != "output_ids"}, ensure_ascii=False)
            for row in rows
        ]
        path.write_text("\n".join(sorted(lines, key=lambda line: json.loads(line)["question_id"])) + "\n")


def _speed(row: dict) -> float:
    choice = row["choices"][0]
    return sum(choice["new_tokens"]) / max(sum(choice["wall_time"]), 1e-9)


def table(answers: dict[str, list[dict]], baseline: str) -> dict[str, dict[str, dict]]:
    """Per runner and task (and ``overall``): tau, tokens_per_s, speedup vs ``baseline``, identical share."""
    reference = {row["question_id"]: row for row in answers[baseline]}
    result: dict[str, dict[str, dict]] = {}
    for name, rows in answers.items():
        result[name] = {}
        for task in (*TASKS, "overall"):
            picked = [r for r in rows if task == "overall" or task_of(r["category"]) == task]
            if not picked:
                continue
            base = [reference[r["question_id"]] for r in picked]
            tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in picked)
            steps = sum(sum(r["choices"][0]["decoding_steps"]) for r in picked)
            speed = statistics.mean(_speed(r) for r in picked)
            ratios = [_speed(r) / max(_speed(b), 1e-9) for r, b in zip(picked, base)]
            result[name][task] = {
                "tau": tokens / steps if steps else 0.0,
                "tokens_per_s": speed,
                # Spec-Bench's speedup: mean tokens/s over mean baseline tokens/s (fast questions weigh more);
                # the median of the per-question ratios is the figure an outlier cannot move.
                "speedup": speed / statistics.mean(_speed(r) for r in base),
                "median_speedup": statistics.median(ratios),
                "identical": sum(r["output_ids"] == b["output_ids"] for r, b in zip(picked, base))
                / len(picked),
                "questions": len(picked),
            }
    return result


def format_table(figures: dict[str, dict[str, dict]]) -> str:
    """Spec-Bench's leaderboard layout: speedup per task, then τ and overall; plus tokens/s, the median
    per-question speedup and identity."""
    tasks = [t for t in TASKS if any(t in rows for rows in figures.values())]
    width = max(len(name) for name in figures) + 2
    header = f"{'method':<{width}}" + "".join(f"{TASK_TITLES[t]:>8}" for t in tasks)
    header += f"{'tau':>7}{'tok/s':>8}{'overall':>9}{'median':>8}{'same':>6}"
    lines = [header, "-" * len(header)]
    for name, rows in figures.items():
        cells = "".join(f"{rows[t]['speedup']:>7.2f}x" if t in rows else f"{'-':>8}" for t in tasks)
        overall = rows["overall"]
        lines.append(
            f"{name:<{width}}{cells}{overall['tau']:>7.2f}{overall['tokens_per_s']:>8.1f}"
            f"{overall['speedup']:>8.2f}x{overall['median_speedup']:>7.2f}x{overall['identical']:>6.0%}"
        )
    return "\n".join(lines)


def decode_and_report(runners: list[Runner], tokenizer, questions: list[dict], out: Path, name: str,
                      report: dict, args=None) -> dict[str, dict[str, dict]]:
    """Every runner on every question (:func:`run_all`), its answer files, ``OUT/NAME.json`` (``report`` and
    the figures), the printed table and, given the script's ``args`` (:func:`add_record_options`), its result
    record in results/; returns the figures (against the ``autoregressive`` runner)."""
    answers = run_all(runners, tokenizer, questions)
    figures = table(answers, "autoregressive")
    write_answer_files(out / "answers", answers)
    (out / f"{name}.json").write_text(json.dumps({**report, "figures": figures}, indent=2) + "\n")
    print(format_table(figures))
    print(f"answers and figures: {out}")
    if args is not None:
        record_speed_run(args, name, answers, questions, report)
    return figures


def record_speed_run(
    args, name: str, answers: dict[str, list[dict]], questions: list[dict], report: dict
) -> None:
    """The result record of a side-by-side speed run (:func:`speed_rows`) on held-out Spec-Bench questions."""
    greedy = float(report.get("temperature", 0.0) or 0.0) == 0.0
    record_run(args, name, speed_rows(answers, "autoregressive", greedy), "spec_bench heldout (first turn)",
               len(questions), device=str(report.get("device", "cpu")),
               dtype=str(report.get("dtype", "float32")), threads=report.get("threads"))  # fmt: skip


def _ratio_of_means(pairs: Sequence[tuple[float, float]]) -> float:
    """Spec-Bench's speedup of (speed, baseline speed) pairs: mean speed over mean baseline speed."""
    return statistics.mean(s for s, _ in pairs) / max(statistics.mean(b for _, b in pairs), 1e-9)


def speed_rows(
    answers: dict[str, list[dict]], baseline: str = "autoregressive", greedy: bool = True
) -> list[dict]:
    """Result-record rows of a :func:`run_all` run: per runner its speedup against ``baseline`` (Spec-Bench's
    ratio of mean tokens/s, with the median per-question ratio and a bootstrap interval over questions), τ
    and tokens/s; ``identical_outputs`` only for greedy runs (sampled outputs differ by design)."""
    reference = {row["question_id"]: row for row in answers[baseline]}
    rows = []
    for name, answered in answers.items():
        pairs = [(_speed(r), _speed(reference[r["question_id"]])) for r in answered]
        taus = [
            sum(r["choices"][0]["new_tokens"]) / max(sum(r["choices"][0]["decoding_steps"]), 1)
            for r in answered
        ]
        tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in answered)
        steps = sum(sum(r["choices"][0]["decoding_steps"]) for r in answered)
        figures = {"tokens_per_s": figure(statistics.mean(s for s, _ in pairs), [s for s, _ in pairs])}
        if name != baseline:
            speedup = figure(_ratio_of_means(pairs), unit="x")
            if len(pairs) >= 2:
                speedup["median"] = statistics.median(s / max(b, 1e-9) for s, b in pairs)
                speedup["interval"] = list(bootstrap_interval(pairs, _ratio_of_means))
            figures = {"speedup": speedup, "tau": figure(tokens / steps if steps else 0.0, taus), **figures,
                       **round_figures(answered)}
        same = all(r["output_ids"] == reference[r["question_id"]]["output_ids"] for r in answered)
        rows.append({"setup": name, "figures": figures, "identical_outputs": same if greedy else None})
    return rows


ACCEPTANCE_POSITIONS = 3


def acceptance_by_position(answered: list[dict], positions: int = ACCEPTANCE_POSITIONS) -> list[float | None]:
    """Per draft position k = 1..positions, the share of rounds that accepted draft k among the rounds that
    drafted it and accepted drafts 1..k−1 (None where no round got there)."""
    reached, kept = [0] * positions, [0] * positions
    for row in answered:
        choice = row["choices"][0]
        for drafted, accepted in zip(choice.get("drafted", []), choice.get("accepted", [])):
            for k in range(1, positions + 1):
                if drafted >= k and accepted >= k - 1:
                    reached[k - 1] += 1
                    kept[k - 1] += accepted >= k
    return [kept[i] / reached[i] if reached[i] else None for i in range(positions)]


def round_figures(answered: list[dict]) -> dict[str, dict]:
    """Per-position acceptance (``acc_pos{k}``) and the share of decoding time spent drafting
    (``draft_share``), for runners that record their rounds."""
    choices = [row["choices"][0] for row in answered]
    if not any(c.get("drafted") for c in choices):
        return {}
    out = {
        f"acc_pos{k + 1}": figure(a) for k, a in enumerate(acceptance_by_position(answered)) if a is not None
    }
    drafting = sum(c.get("draft_time", 0.0) for c in choices)
    total = drafting + sum(c.get("verify_time", 0.0) for c in choices)
    if total > 0:
        out["draft_share"] = figure(drafting / total)
    return out


def all_identical(figures: dict[str, dict[str, dict]]) -> bool:
    """Whether every row's outputs equal the baseline's (printed, for greedy runs)."""
    identical = all(rows["overall"]["identical"] == 1.0 for rows in figures.values())
    print("every output token-identical to autoregressive decoding:", identical)
    return identical


def out_dir(given: str | None, name: str) -> Path:
    """``--out-dir`` if given, else ``outputs/NAME/TIME`` (a new folder per run)."""
    return Path(given or f"outputs/{name}/{time.strftime('%Y%m%d-%H%M%S')}")


def embedded_verifier(device: str = "cpu", dtype: str = "float32"):
    """The embedded SmolLM2-135M-Instruct verifier, its EOS ids, pad id and the vocabulary p and q share."""
    from specbench.evaluation import eos_token_ids, pad_token_id
    from specbench.models import ModelSpec, load_verifier

    verifier = load_verifier(ModelSpec(kind="embedded"), device, dtype)
    eos = eos_token_ids(verifier.model, verifier.tokenizer)
    vocab = min(len(verifier.tokenizer), verifier.model.get_output_embeddings().weight.shape[0])
    return verifier, eos, pad_token_id(verifier.tokenizer, eos), vocab
