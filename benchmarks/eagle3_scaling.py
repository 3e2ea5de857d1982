"""The data-scaling curve of EAGLE-3 heads (issue 48): τ on held-out Spec-Bench questions against the target
tokens each head was trained on, SFT and on-policy distillation (OPD) as two lines.

Every ``RUNS/<name>/trained.pt`` whose name starts with ``sft-`` or ``opd-`` (what
``scripts/train_scaling.sh`` writes) decodes the held-out questions with the exact ``sd`` rule, greedy, as
a chain of ``--gamma`` drafts and as a ``--tree`` (WIDTHxGAMMA), interleaved with autoregressive decoding in
one process (``harness.run_all``). ``--head`` adds other heads (the committed one, say) as reference points.
Each row records the head's training tokens (``train_tokens``: the generated tokens of the rows it trained
on), its steps and objective, so the record alone redraws the plot: ``--plot-only RECORD...`` does that,
and draws the rows of several records (heads evaluated in separate runs) as one curve.
Greedy outputs must equal autoregressive decoding's (exit 1 otherwise).

    python benchmarks/eagle3_scaling.py --runs runs/scaling --dtype bfloat16 --per-task 3 \
        --max-new-tokens 64 --threads 1 --head checkpoints/eagle3-smollm2-135m/trained.pt \
        --plot docs/img/eagle3_scaling.png
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    Setup,
    all_identical,
    benchmark_parser,
    embedded_verifier,
    format_table,
    heldout_questions,
    out_dir,
    record_run,
    run_all,
    setup_runners,
    speed_rows,
    table,
    write_answer_files,
)

from specbench.results.record import figure

OBJECTIVES = {"sft": "sft", "opd": "opd"}  # run-name prefix -> objective


@dataclass
class Head:
    label: str  # row prefix: the run's folder name
    path: Path
    objective: str  # sft | opd | reference
    train_tokens: int | None  # generated tokens of the rows it trained on (None: not recorded)
    steps: int | None


def parse_args(argv=None):
    parser = benchmark_parser(
        __doc__, per_task=3, max_new_tokens=64, threads=1, device="cpu", dtype="bfloat16",
        out_dir={"default": None, "help": "default: outputs/eagle3_scaling/TIME"},
    )  # fmt: skip
    parser.add_argument("--runs", default="runs/scaling", help="folder of scripts/train_scaling.sh's runs")
    parser.add_argument("--head", action="append", default=[], help="another trained.pt: a reference point")
    parser.add_argument("--gamma", type=int, default=3, help="chain rows: constant γ")
    parser.add_argument("--tree", default="2x3", help="tree rows: WIDTHxGAMMA ('' for none)")
    parser.add_argument("--plot", default=None, help="write the plot (PNG) here")
    parser.add_argument("--plot-only", nargs="+", default=None, metavar="RECORD",
                        help="redraw --plot from these eagle3_scaling records (their rows on one plot)")
    return parser.parse_args(argv)


def read_head(path: Path, objective: str | None = None) -> Head:
    import torch

    meta = torch.load(path, map_location="cpu", weights_only=False).get("specbench", {})
    tokens = meta.get("train_generated_tokens")
    return Head(path.parent.name, path, objective or str(meta.get("objective") or "sft"),
                int(tokens) if tokens is not None else None, meta.get("global_step"))  # fmt: skip


def scaling_heads(runs: Path, extra: list[str]) -> list[Head]:
    """The sft-* and opd-* heads under ``runs`` (by objective, then tokens), then the ``extra`` ones."""
    found = []
    for path in sorted(runs.glob("*/trained.pt")):
        prefix = path.parent.name.split("-", 1)[0]
        if prefix in OBJECTIVES:
            found.append(read_head(path, OBJECTIVES[prefix]))
    found.sort(key=lambda h: (h.objective, h.train_tokens or 0))
    return found + [read_head(Path(p), "reference") for p in extra]


def tree_shape(text: str) -> tuple[int, int] | None:
    if not text:
        return None
    width, _, gamma = text.partition("x")
    if not (width.isdigit() and gamma.isdigit()):
        raise SystemExit(f"--tree wants WIDTHxGAMMA such as 2x3, got {text!r}")
    return int(width), int(gamma)


def setups_for(heads: list[Head], args, verifier, vocab: int) -> tuple[list[Setup], dict[str, Head]]:
    from specbench.decoding import DraftSchedule
    from specbench.drafters.eagle3.format import load_eagle3_drafter

    setups, owner = [Setup("autoregressive")], {}
    tree = tree_shape(args.tree)
    for head in heads:
        shapes = [("chain", 1, args.gamma)] + ([("tree", *tree)] if tree else [])
        for kind, width, gamma in shapes:
            name = f"{head.label}-{kind}-g{gamma}" + (f"-w{width}" if width > 1 else "")
            drafter = load_eagle3_drafter(str(head.path), verifier, vocab, tree_width=width)
            setups.append(Setup(name, drafter, DraftSchedule("constant", gamma)))
            owner[name] = head
    return setups, owner


def annotate(rows: list[dict], owner: dict[str, Head]) -> list[dict]:
    """Each head row gets its training tokens and steps as figures, its objective as notes."""
    for row in rows:
        head = owner.get(row["setup"])
        if head is None:
            continue
        if head.train_tokens is not None:
            row["figures"]["train_tokens"] = figure(head.train_tokens)
        if head.steps is not None:
            row["figures"]["train_steps"] = figure(head.steps)
        row["notes"] = f"objective {head.objective}; {head.path}"
    return rows


def curve_lines(records: list[dict]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(objective, shape) -> sorted (training tokens, τ) points of every head row in ``records`` (records of
    one curve taken in several runs, e.g. sizes trained in different sessions, plot as one)."""
    lines: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for record in records:
        for row in record["rows"]:
            figures, notes = row["figures"], row.get("notes", "")
            if "train_tokens" not in figures or "tau" not in figures:
                continue
            objective = notes.split(";")[0].removeprefix("objective ").strip()
            shape = "tree" if "-tree-" in row["setup"] else "chain"
            point = (figures["train_tokens"]["value"], figures["tau"]["value"])
            lines.setdefault((objective, shape), []).append(point)
    return {key: sorted(set(points)) for key, points in lines.items()}


def plot(records: list[dict], path: Path) -> None:
    """τ against training tokens (log x): a line per objective and shape, reference heads as stars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = curve_lines(records)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"sft": ("tab:blue", "SFT"), "opd": ("tab:orange", "on-policy (OPD)"), "reference": ("0.3", "")}
    for (objective, shape), points in sorted(lines.items()):
        color, name = styles.get(objective, ("tab:green", objective))
        xs, ys = zip(*points)
        if objective == "reference":
            marker = "*" if shape == "chain" else "P"
            ax.plot(xs, ys, marker, color=color, ms=11, label=f"committed head, {shape}")
        else:
            ax.plot(xs, ys, "-o" if shape == "chain" else "--s", color=color, label=f"{name}, {shape}")
    ax.set_xscale("log")
    ax.set_xlabel("target tokens trained on (log scale)")
    ax.set_ylabel("τ (tokens per verifier forward)")
    machine = records[0]["machine"]
    ax.set_title(f"EAGLE-3 head on SmolLM2-135M: held-out Spec-Bench, greedy, {machine['dtype']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot_only:
        if not args.plot:
            raise SystemExit("--plot-only RECORD... needs --plot PNG")
        plot([json.loads(Path(r).read_text()) for r in args.plot_only], Path(args.plot))
        return 0
    heads = scaling_heads(Path(args.runs), args.head)
    if not heads:
        raise SystemExit(f"no sft-*/trained.pt or opd-*/trained.pt under {args.runs} and no --head: "
                         "run bash scripts/train_scaling.sh first")  # fmt: skip
    import torch

    from specbench.decoding import GenerationSettings

    torch.set_num_threads(args.threads)
    out = out_dir(args.out_dir, "eagle3_scaling")
    verifier, eos, pad, vocab = embedded_verifier(args.device, args.dtype)
    setups, owner = setups_for(heads, args, verifier, vocab)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, temperature=0.0)
    runners = setup_runners(verifier.model, setups, settings=settings, vocab_size=vocab, eos_token_ids=eos,
                            pad_token_id=pad)  # fmt: skip
    questions = heldout_questions(args.per_task)
    answers = run_all(runners, verifier.tokenizer, questions)
    figures = table(answers, "autoregressive")
    write_answer_files(out / "answers", answers)
    print(format_table(figures))
    rows = annotate(speed_rows(answers, "autoregressive", greedy=True), owner)
    dtype = str(verifier.model.dtype).removeprefix("torch.")
    path = record_run(args, "eagle3_scaling", rows, "spec_bench heldout (first turn)", len(questions),
                      device=str(verifier.model.device), dtype=dtype, threads=args.threads)  # fmt: skip
    if args.plot and path is not None:
        plot([json.loads(Path(path).read_text())], Path(args.plot))
    return 0 if all_identical(figures) else 1


if __name__ == "__main__":
    sys.exit(main())
