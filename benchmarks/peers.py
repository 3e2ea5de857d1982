"""specbench against the transformers peers a user would pick, on the same model and the same prompts.

One process, 1 thread by default, greedy, held-out Spec-Bench questions (``dataset.subset=heldout``: the
suffix drafter's seed cache and the EAGLE-3 head were built from the train split). Per dtype the embedded
SmolLM2-135M-Instruct is loaded twice: once by specbench's loader and once by plain transformers
(``AutoModelForCausalLM.from_pretrained`` of the same safetensors copy; no specbench code touches that copy or
how it decodes). Interleaved per question in rotating order (``harness.run_all``):

  hf-generate        transformers ``generate`` (greedy): the baseline of every speedup
  hf-prompt-lookup   ``generate(prompt_lookup_num_tokens=10)``
  hf-assisted-ee4    ``generate(assistant_model=...)`` with an early-exit drafter (the first 4 layers, final
                     norm and LM head of the same checkpoint as a separate transformers model; HF's default
                     assistant settings: 20 tokens, constant schedule, confidence threshold 0.4)
  specbench-ar       specbench's engine without a drafter
  specbench-default  the default drafter (``conf/model/drafter/suffix-eagle3-smollm2.yaml``: suffix tree, the
                     EAGLE-3 head as fallback) under the default schedule (conf/config.yaml's ``schedule``;
                     cost_aware: priced by this machine's cached cost profile, ``--default-schedule``)
  specbench-default-S  the same drafter under schedule S (``--compare-schedule S``)
  specbench-tree     ``conf/model/drafter/suffix-pl-eagle3-smollm2.yaml``: the suffix drafter's and HF-style
                     prompt lookup's chains merged into one tree per round, the head as fallback
                     (``--no-tree`` leaves it out)

Reported per row and Spec-Bench task: speedup against ``hf-generate``, against ``hf-prompt-lookup`` and
against ``specbench-ar`` (ratio of mean tokens/s, with the median per-question ratio), τ, identical-output
counts (against HF generate and against specbench's AR), per-position acceptance and the share of drafting
rounds that accept nothing (HF rows: rounds read from the verifier's forward calls). The record goes to
results/peers/.

    python benchmarks/peers.py --per-category 3 --max-new-tokens 96 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    TASK_TITLES,
    TASKS,
    Decoded,
    Runner,
    acceptance_by_position,
    benchmark_parser,
    embedded_verifier,
    engine_runner,
    heldout_questions,
    out_dir,
    record_run,
    run_all,
    task_of,
    write_answer_files,
)

from specbench.results.record import bootstrap_interval, figure

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DRAFTER = ROOT / "conf" / "model" / "drafter" / "suffix-eagle3-smollm2.yaml"
TREE_DRAFTER = ROOT / "conf" / "model" / "drafter" / "suffix-pl-eagle3-smollm2.yaml"
BASELINE, LOOKUP, AR, DEFAULT = "hf-generate", "hf-prompt-lookup", "specbench-ar", "specbench-default"
TREE = "specbench-tree"
POSITIONS = 5


def parse_args(argv=None) -> argparse.Namespace:
    parser = benchmark_parser(
        __doc__, per_category={"default": 3, "help": "held-out questions per Spec-Bench task"},
        max_new_tokens=96, threads=1, questions=None,
        out_dir={"default": None, "help": "default: outputs/peers/TIME"},
    )  # fmt: skip
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma list, each run in turn")
    parser.add_argument("--lookup-tokens", type=int, default=10, help="HF prompt_lookup_num_tokens")
    parser.add_argument(
        "--assistant-layers", type=int, default=4, help="K of HF assisted generation's early exit"
    )
    parser.add_argument("--no-assisted", action="store_true", help="leave out the HF assisted-generation row")
    parser.add_argument("--no-tree", action="store_true", help="leave out the specbench-tree row")
    parser.add_argument("--notes", default="", help="appended to the record's notes (e.g. machine load)")
    parser.add_argument("--default-schedule", choices=SCHEDULES, default=configured_schedule(),
                        help="specbench-default's schedule (default: conf/config.yaml's)")  # fmt: skip
    parser.add_argument("--compare-schedule", choices=SCHEDULES, action="append", default=[],
                        help="add a specbench-default-S row with schedule S (repeatable)")  # fmt: skip
    return parser.parse_args(argv)


SCHEDULES = ("constant", "cost_aware")


def configured_schedule() -> str:
    """The ``schedule`` group that conf/config.yaml picks by default."""
    defaults = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())["defaults"]
    return next(d["schedule"] for d in defaults if isinstance(d, dict) and "schedule" in d)


def plain_transformers_copy(dtype: torch.dtype, layers: int | None = None):
    """The embedded checkpoint loaded by transformers alone (its first ``layers`` layers: an early-exit
    model)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    from specbench.models.embedded import embedded_model_dir  # where the safetensors copy lies, nothing more

    path = embedded_model_dir()
    config = AutoConfig.from_pretrained(path)
    if layers is not None:
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers]
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # an early exit leaves the later layers' weights unused: a long load report
    try:
        model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype)
    finally:
        logging.set_verbosity(verbosity)
    return model.eval().requires_grad_(False)


def hf_rounds_runner(name: str, model, max_new_tokens: int, eos, pad, **generate_kwargs) -> Runner:
    """transformers ``generate`` with a hook on the verifier's forwards, each a round: its input is the tokens
    the cache lacks (the prompt, or the last token) and then the drafts; how far the next round's committed
    length moved, − 1, is how many of them it accepted."""
    forwards: list[tuple[int, int]] = []  # (position of the forward's first token, its width)

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        forwards.append((int(kwargs["position_ids"][0, 0]), int(ids.shape[1])))

    model.register_forward_pre_hook(hook, with_kwargs=True)

    @torch.no_grad()
    def run(ids: list[int]) -> Decoded:
        forwards.clear()
        x = torch.tensor([ids])
        begin = time.perf_counter()
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=list(eos), pad_token_id=pad,
                             **generate_kwargs)  # fmt: skip
        wall = time.perf_counter() - begin
        output = out[0, len(ids):].tolist()
        # committed length before each forward: the prompt, then one past the cache (the last token is
        # uncached)
        known = [len(ids)] + [start + 1 for start, _ in forwards[1:]]
        drafted = [start + width - length for (start, width), length in zip(forwards, known)]
        after = known[1:] + [len(ids) + len(output)]
        accepted = [max(0, min(d, b - a - 1)) for d, a, b in zip(drafted, known, after)]
        return Decoded(output, wall, len(forwards), [a + 1 for a in accepted], drafted, accepted)

    return Runner(name, run)


def preset_drafter_runner(
    name: str, preset_path: Path, verifier, vocab: int, common: dict, schedule_name: str = "constant"
) -> Runner:
    """A ``suffix_then_eagle3`` drafter preset (its params and head path) as a runner: under its default
    constant γ, or ``cost_aware`` with that γ as the most it drafts, priced by this machine's cached cost
    profile (measured on first use, as ``schedule.profile: null`` does; conf/schedule/cost_aware.yaml)."""
    from specbench.decoding import DraftSchedule, SpeculativeEngine
    from specbench.decoding.cost_aware import CostAwareSchedule
    from specbench.decoding.cost_cache import machine_profile
    from specbench.drafters.fallback import suffix_then_eagle3
    from specbench.evaluation import PROFILE_CONTEXT, measure_profile

    preset = yaml.safe_load(preset_path.read_text())
    params = dict(preset["params"])
    params["path"] = str(ROOT / params["path"])
    drafter = suffix_then_eagle3(verifier=verifier, vocab_size=vocab, **params)
    gamma = int(preset["default_gamma"])
    schedule = DraftSchedule("constant", gamma)
    if schedule_name == "cost_aware":
        profile = machine_profile(measure_profile, verifier, drafter, vocab, gamma + 1, PROFILE_CONTEXT)
        schedule = CostAwareSchedule(profile, gamma)
    return engine_runner(name, SpeculativeEngine(verifier.model, drafter, schedule=schedule, **common))


def runners_for(dtype: str, args) -> tuple[list[Runner], object]:
    from specbench.decoding import GenerationSettings, SpeculativeEngine

    verifier, eos, pad, vocab = embedded_verifier("cpu", dtype)
    torch_dtype = verifier.model.dtype
    common = {"settings": GenerationSettings(max_new_tokens=args.max_new_tokens), "vocab_size": vocab,
              "eos_token_ids": eos, "pad_token_id": pad}  # fmt: skip
    hf = plain_transformers_copy(torch_dtype)
    runners = [
        hf_rounds_runner(BASELINE, hf, args.max_new_tokens, eos, pad),
        hf_rounds_runner(
            LOOKUP, hf, args.max_new_tokens, eos, pad, prompt_lookup_num_tokens=args.lookup_tokens
        ),
    ]
    if not args.no_assisted:
        assistant = plain_transformers_copy(torch_dtype, args.assistant_layers)
        runners.append(hf_rounds_runner(f"hf-assisted-ee{args.assistant_layers}", hf, args.max_new_tokens,
                                        eos, pad, assistant_model=assistant))  # fmt: skip
    runners.append(engine_runner(AR, SpeculativeEngine(verifier.model, None, **common)))
    for name, schedule in ((DEFAULT, args.default_schedule),
                           *((f"{DEFAULT}-{s}", s) for s in args.compare_schedule)):  # fmt: skip
        runners.append(preset_drafter_runner(name, DEFAULT_DRAFTER, verifier, vocab, common, schedule))
    if not args.no_tree:
        runners.append(preset_drafter_runner(TREE, TREE_DRAFTER, verifier, vocab, common))
    return runners, verifier.tokenizer


def _speed(row: dict) -> float:
    choice = row["choices"][0]
    return sum(choice["new_tokens"]) / max(sum(choice["wall_time"]), 1e-9)


def _ratio(pairs) -> float:
    return statistics.mean(s for s, _ in pairs) / max(statistics.mean(b for _, b in pairs), 1e-9)


def speedup_figure(rows: list[dict], base: dict[int, dict]) -> dict:
    pairs = [(_speed(r), _speed(base[r["question_id"]])) for r in rows]
    out = figure(_ratio(pairs), unit="x")
    if len(pairs) >= 2:
        out["median"] = statistics.median(s / max(b, 1e-9) for s, b in pairs)
        out["interval"] = list(bootstrap_interval(pairs, _ratio))
    return out


def total_time_ratio(rows: list[dict], base: dict[int, dict]) -> float:
    """How much faster than ``base`` over the whole set: its total time per token over this row's (so long
    prompts and long answers weigh what they cost, unlike a mean of per-question speeds)."""
    def per_token(picked: list[dict]) -> float:
        wall = sum(sum(r["choices"][0]["wall_time"]) for r in picked)
        return wall / max(sum(sum(r["choices"][0]["new_tokens"]) for r in picked), 1)

    return per_token([base[r["question_id"]] for r in rows]) / max(per_token(rows), 1e-12)


def zero_accept_share(rows: list[dict]) -> float | None:
    """Of the rounds that drafted something, the share that accepted nothing."""
    drafting = [
        a for r in rows for d, a in zip(r["choices"][0]["drafted"], r["choices"][0]["accepted"]) if d > 0
    ]
    return sum(a == 0 for a in drafting) / len(drafting) if drafting else None


def ours(name: str) -> bool:
    """A specbench row with a drafter: held to specbench-ar's outputs."""
    return name.startswith("specbench-") and name != AR


def row_figures(name: str, rows: list[dict], by_name: dict[str, dict[int, dict]]) -> dict:
    """A runner's figures over ``rows`` (one task or all): speedups, τ, tokens/s, identical counts,
    acceptance."""
    tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in rows)
    rounds = sum(sum(r["choices"][0]["decoding_steps"]) for r in rows)
    figures = {"speedup": speedup_figure(rows, by_name[BASELINE]), "tau": figure(tokens / max(rounds, 1)),
               "tokens_per_s": figure(statistics.mean(_speed(r) for r in rows),
                                      [_speed(r) for r in rows])}  # fmt: skip
    if name != LOOKUP:
        figures["vs_hf_prompt_lookup"] = speedup_figure(rows, by_name[LOOKUP])
        figures["total_time_vs_hf_prompt_lookup"] = figure(total_time_ratio(rows, by_name[LOOKUP]), unit="x")
    if ours(name):
        figures["vs_specbench_ar"] = speedup_figure(rows, by_name[AR])
    for ref, key in ((BASELINE, "same_as_hf_generate"), (AR, "same_as_specbench_ar")):
        same = sum(r["output_ids"] == by_name[ref][r["question_id"]]["output_ids"] for r in rows)
        figures[key] = figure(same, unit=f"/{len(rows)}")
    if name not in (BASELINE, AR):
        for k, value in enumerate(acceptance_by_position(rows, POSITIONS)):
            if value is not None:
                figures[f"acc_pos{k + 1}"] = figure(value)
        if (share := zero_accept_share(rows)) is not None:
            figures["zero_accept_rounds"] = figure(share)
    return figures


def figures_by_task(answers: dict[str, list[dict]]) -> dict[str, dict[str, dict]]:
    by_name = {name: {r["question_id"]: r for r in rows} for name, rows in answers.items()}
    out: dict[str, dict[str, dict]] = {}
    for name, rows in answers.items():
        out[name] = {"overall": row_figures(name, rows, by_name)}
        for task in TASKS:
            picked = [r for r in rows if task_of(r["category"]) == task]
            if picked:
                out[name][task] = row_figures(name, picked, by_name)
    return out


def format_figures(dtype: str, figures: dict[str, dict[str, dict]]) -> str:
    tasks = [t for t in TASKS if t in figures[BASELINE]]
    width = max(len(n) for n in figures) + 2
    head = f"{dtype:<{width}}" + "".join(f"{TASK_TITLES[t]:>7}" for t in tasks)
    head += (
        f"{'all':>7}{'median':>8}{'vs PL':>7}{'PL tot':>7}{'tau':>6}{'tok/s':>7}{'=HF':>5}{'=AR':>5}"
        f"{'acc0':>6}"
    )
    lines = [head, "-" * len(head)]
    for name, rows in figures.items():
        cells = "".join(f"{rows[t]['speedup']['value']:>6.2f}x" for t in tasks)
        o = rows["overall"]
        lookup = o.get("vs_hf_prompt_lookup", {"value": 1.0})["value"]
        total = o.get("total_time_vs_hf_prompt_lookup", {"value": 1.0})["value"]
        zero = f"{o['zero_accept_rounds']['value']:>6.2f}" if "zero_accept_rounds" in o else f"{'-':>6}"
        lines.append(f"{name:<{width}}{cells}{o['speedup']['value']:>6.2f}x"
                     f"{o['speedup'].get('median', 1.0):>7.2f}x{lookup:>6.2f}x{total:>6.2f}x"
                     f"{o['tau']['value']:>6.2f}{o['tokens_per_s']['value']:>7.1f}"
                     f"{int(o['same_as_hf_generate']['value']):>5}"
                     f"{int(o['same_as_specbench_ar']['value']):>5}{zero}")  # fmt: skip
    titles = "".join(f"{TASK_TITLES[t]:>7}" for t in tasks)
    lines.append(f"{'against specbench-ar':<{width}}{titles}{'all':>7}")
    for name, rows in figures.items():
        if ours(name):
            cells = "".join(f"{rows[t]['vs_specbench_ar']['value']:>6.2f}x" for t in [*tasks, "overall"])
            lines.append(f"{name:<{width}}{cells}")
    return "\n".join(lines)


def record_rows(dtype: str, figures: dict[str, dict[str, dict]]) -> list[dict]:
    """One row per runner: its overall figures plus ``speedup_TASK`` / ``vs_hf_prompt_lookup_TASK`` per
    task."""
    rows = []
    for name, by_task in figures.items():
        row = dict(by_task["overall"])
        for task, fig in by_task.items():
            if task != "overall":
                row[f"speedup_{task}"] = fig["speedup"]
                if "vs_hf_prompt_lookup" in fig:
                    row[f"vs_hf_prompt_lookup_{task}"] = fig["vs_hf_prompt_lookup"]
                    row[f"total_time_vs_hf_prompt_lookup_{task}"] = fig["total_time_vs_hf_prompt_lookup"]
                if "vs_specbench_ar" in fig:
                    row[f"vs_specbench_ar_{task}"] = fig["vs_specbench_ar"]
        reference = "same_as_specbench_ar" if ours(name) else "same_as_hf_generate"
        count = row[reference]
        rows.append({"setup": f"{dtype}: {name}", "figures": row,
                     "identical_outputs": count["value"] == int(count["unit"][1:]),
                     "notes": "identical_outputs: against "
                              + ("specbench-ar" if ours(name) else BASELINE)})  # fmt: skip
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = out_dir(args.out_dir, "peers")
    questions = heldout_questions(args.per_category, args.questions)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    rows, report = [], {"questions": [q["question_id"] for q in questions],
                        "max_new_tokens": args.max_new_tokens, "threads": args.threads,
                        "figures": {}}  # fmt: skip
    for dtype in dtypes:
        runners, tokenizer = runners_for(dtype, args)
        answers = run_all(runners, tokenizer, questions)
        write_answer_files(out / dtype / "answers", answers)
        figures = figures_by_task(answers)
        report["figures"][dtype] = figures
        print(format_figures(dtype, figures))
        rows += record_rows(dtype, figures)
        del runners
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"answers and figures: {out}")
    notes = (f"embedded SmolLM2-135M-Instruct, {args.max_new_tokens} new tokens, greedy; speedup against HF "
             "generate on a second, plain-transformers copy; hf-prompt-lookup: "
             f"prompt_lookup_num_tokens={args.lookup_tokens}; hf-assisted: early exit "
             f"K={args.assistant_layers}, HF default assistant settings. {args.notes}").strip()  # fmt: skip
    record_run(args, "peers", rows, "spec_bench heldout (first turn)", len(questions), dtype=",".join(dtypes),
               threads=args.threads,
               doc="docs/benchmarks.md#peers-transformers-generate-prompt-lookup-assisted",
               notes=notes)  # fmt: skip
    lossless = all(r["identical_outputs"] for r in rows if ours(r["setup"].split(": ", 1)[1]))
    print("specbench rows with a drafter token-identical to specbench-ar:", lossless)
    return 0 if lossless else 1


if __name__ == "__main__":
    sys.exit(main())
