"""A trained EAGLE-3 head (and a DFlash drafter, the suffix drafter and the fallback) vs autoregressive
decoding and the early-exit drafter, on held-out Spec-Bench questions.

One process, interleaved (``harness.run_all``): for each held-out question (first turn, the embedded
SmolLM2-135M-Instruct verifier) autoregressive decoding, the demo's early-exit drafter (first 4 layers,
γ = 3) and the EAGLE-3 head at each ``--gammas`` value, all with the exact ``sd`` rule. Greedy by default:
every speculative output must be token-identical to autoregressive decoding (exit 1 otherwise). With
``--temperature 1`` the rows sample (outputs then differ by design; τ and tokens/s are what count). The
head's cost c (its time per drafted token over the verifier's one-token forward) is measured first.
Speculative rows also record per-position acceptance (``acc_pos1..3``) and the share of decoding time spent
drafting.

    python benchmarks/eagle3.py --head checkpoints/eagle3-smollm2-135m/trained.pt --per-task 5 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    Setup,
    all_identical,
    benchmark_parser,
    embedded_verifier,
    format_table,
    heldout_questions,
    out_dir,
    record_speed_run,
    run_all,
    setup_runners,
    table,
    write_answer_files,
)

from specbench.decoding import DraftSchedule, GenerationSettings
from specbench.decoding.cost import CostProfile
from specbench.decoding.cost_aware import CostAwareSchedule
from specbench.decoding.model_drafter import ModelDrafter
from specbench.drafters.eagle3.format import load_eagle3_drafter
from specbench.drafters.fallback import suffix_then_eagle3
from specbench.drafters.suffix import SuffixDrafter
from specbench.evaluation import measure_profile
from specbench.models.early_exit import early_exit_drafter

DEFAULT_HEAD = Path(__file__).resolve().parents[1] / "checkpoints" / "eagle3-smollm2-135m" / "trained.pt"
FALLBACK_CAP = 10


def parse_args(argv=None) -> argparse.Namespace:
    parser = benchmark_parser(
        __doc__, per_task=5, max_new_tokens=128, threads=1, device="cpu", dtype="auto",
        out_dir={"default": None, "help": "default: outputs/eagle3/TIME"},
    )  # fmt: skip
    parser.add_argument(
        "--head", action="append", default=None,
        help="trained.pt of task=train method=eagle3; repeat it to compare heads in the same run (rows named "
        "by the head's folder); default: the committed head",
    )  # fmt: skip
    parser.add_argument(
        "--gammas",
        default="3,5",
        help="comma list of constant draft lengths for the head (empty: no head rows)",
    )
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--no-early-exit", action="store_true", help="leave out the early-exit row")
    parser.add_argument(
        "--fallback", default="",
        help="comma list of min_lookup_tokens values: a row per value for the suffix drafter with the "
        "(first) head as fallback (specbench.drafters.fallback, γ cap 10, head γ 1)",
    )  # fmt: skip
    parser.add_argument(
        "--fallback-schedules", default="constant",
        help="comma list of schedules for the --fallback chain rows: constant (γ cap 10) | cost_aware "
        "(chains trimmed by match length and the round costs: the v(n) measured first as a prior, learned "
        "from the run's own rounds; max_gamma 10) | cost_aware_profile (the same, priced by the measured "
        "v(n) alone)",
    )  # fmt: skip
    parser.add_argument(
        "--fallback-profile", default=None,
        help="a cost profile file (task=profile, or a previous run's eagle3.json 'fallback_profile') to "
        "price the cost_aware rows instead of one measured now: to test how learned costs recover from a "
        "bad profile",
    )  # fmt: skip
    parser.add_argument(
        "--suffix-cache",
        default=None,
        help="a suffix cache file (python -m specbench.drafters.suffix_seed): each --fallback row runs "
        "twice, its suffix drafter's global tree empty and seeded from the file (rows suffixed -seeded)",
    )
    parser.add_argument(
        "--fallback-widths", default="1",
        help="comma list of head tree widths for the --fallback rows (1: the head drafts a chain)",
    )  # fmt: skip
    parser.add_argument(
        "--trees", default="",
        help="comma list of WIDTHxGAMMA: a row per entry for the (first) head drafting trees, a chain of "
        "GAMMA drafts with its WIDTH - 1 next most likely tokens as leaves at each depth (docs/eagle3.md, "
        "tree drafts)",
    )  # fmt: skip
    parser.add_argument(
        "--suffix", action="store_true",
        help="add the suffix drafter alone (constant γ 10; its global tree seeded from --suffix-cache when "
        "given)",
    )  # fmt: skip
    parser.add_argument(
        "--dflash", action="append", default=None,
        help="a DFlash drafter (trained.pt of task=train method=dflash, or a z-lab layout directory): a row "
        "per --dflash-gammas value; repeat it to compare drafters (rows named by the drafter's folder)",
    )  # fmt: skip
    parser.add_argument("--dflash-gammas", default="7", help="comma list of constant γ for the --dflash rows")
    return parser.parse_args(argv)


def tree_shapes(text: str) -> list[tuple[int, int]]:
    """``"3x1,4x2"`` -> [(3, 1), (4, 2)] (width, γ)."""
    shapes = []
    for item in (t.strip() for t in text.split(",")):
        if item:
            width, _, gamma = item.partition("x")
            if not (width.isdigit() and gamma.isdigit()):
                raise SystemExit(f"--trees wants WIDTHxGAMMA entries such as 3x2, got {item!r}")
            shapes.append((int(width), int(gamma)))
    return shapes


def head_labels(heads: list[str]) -> dict[str, str]:
    """Each head's row label: its folder's name, or its number when two folders share a name."""
    labels = {path: Path(path).parent.name for path in heads}
    if len(set(labels.values())) < len(heads):
        labels = {path: str(number) for number, path in enumerate(heads)}
    return labels


def head_setups(args, verifier, vocab: int, heads: list[str], gammas: list[int]) -> list[Setup]:
    """Early exit (unless --no-early-exit) and a row per head and γ."""
    setups = []
    if not args.no_early_exit:
        drafter = ModelDrafter(early_exit_drafter(verifier.model, 4), vocab)
        setups.append(Setup("early-exit-4-g3", drafter, DraftSchedule("constant", 3)))
    labels = head_labels(heads)
    for path in heads:
        label = f"[{labels[path]}]" if len(heads) > 1 else ""
        for gamma in gammas:
            drafter = load_eagle3_drafter(path, verifier, vocab)
            setups.append(Setup(f"eagle3{label}-g{gamma}", drafter, DraftSchedule("constant", gamma)))
    return setups


def dflash_setups(args, verifier, vocab: int, profiles: dict) -> list[Setup]:
    """A row per --dflash drafter and --dflash-gammas value; each drafter's cost profile goes to
    ``profiles``."""
    from specbench.drafters.dflash.drafter import dflash_drafter

    setups = []
    for path in args.dflash or []:
        label = ""
        if len(args.dflash) > 1:
            label = f"[{Path(path).parent.name if Path(path).is_file() else Path(path).name}]"
        profiles[f"dflash{label}"] = measure_profile(
            verifier, dflash_drafter(path, verifier, vocab), vocab, max(dflash_gammas(args)) + 1,
            context_len=256, repeats=7,
        )  # fmt: skip
        print(f"dflash {path}:\n{profiles[f'dflash{label}'].table()}", file=sys.stderr)
        for gamma in dflash_gammas(args):
            drafter = dflash_drafter(path, verifier, vocab)
            setups.append(Setup(f"dflash{label}-g{gamma}", drafter, DraftSchedule("constant", gamma)))
    return setups


def dflash_gammas(args) -> list[int]:
    return [int(g) for g in args.dflash_gammas.split(",") if g.strip()] if args.dflash else []


def lookup_setups(args, verifier, vocab: int, head: str) -> list[Setup]:
    """The suffix drafter alone (--suffix) and the first head's tree rows (--trees)."""
    setups = []
    if args.suffix:
        seeded = {"cache_file": args.suffix_cache, "update_cache_file": False} if args.suffix_cache else {}
        drafter = SuffixDrafter(num_speculative_tokens=FALLBACK_CAP, **seeded)
        setups.append(
            Setup("suffix" + ("-seeded" if seeded else ""), drafter, DraftSchedule("constant", FALLBACK_CAP))
        )
    for width, gamma in tree_shapes(args.trees):
        drafter = load_eagle3_drafter(head, verifier, vocab, tree_width=width)
        setups.append(Setup(f"eagle3-tree-w{width}-g{gamma}", drafter, DraftSchedule("constant", gamma)))
    return setups


FALLBACK_SUFFIXES = {"constant": "", "cost_aware": "-ca", "cost_aware_profile": "-cap"}


def fallback_setups(args, verifier, vocab: int, head: str) -> tuple[list[Setup], CostProfile | None, dict]:
    """The suffix-then-head rows (--fallback × --fallback-widths × --fallback-schedules × seeded or not), the
    cost profile pricing their cost_aware schedules, and the learning schedules by row."""
    schedules = [name for name in (n.strip() for n in args.fallback_schedules.split(",")) if name]
    if unknown := sorted(set(schedules) - set(FALLBACK_SUFFIXES)):
        raise SystemExit(
            f"--fallback-schedules: unknown {unknown}; choose from {', '.join(FALLBACK_SUFFIXES)}"
        )
    fallback_profile, learning, setups = None, {}, []
    if args.fallback and {"cost_aware", "cost_aware_profile"} & set(
        schedules
    ):  # v(n) up to the longest chain
        if args.fallback_profile:
            fallback_profile = read_profile(args.fallback_profile)
        else:
            fallback_profile = measure_profile(
                verifier, None, vocab, FALLBACK_CAP + 1, context_len=256, repeats=7
            )
        print(f"verification costs for the cost_aware rows:\n{fallback_profile.table()}", file=sys.stderr)
    for least in [int(m) for m in args.fallback.split(",") if m.strip()]:
        for width in [int(w) for w in args.fallback_widths.split(",") if w.strip()]:
            for name in schedules if width == 1 else ["constant"]:  # trees are not trimmed
                for seed in [None, args.suffix_cache] if args.suffix_cache else [None]:
                    schedule = (
                        DraftSchedule("constant", FALLBACK_CAP)
                        if name == "constant"
                        else CostAwareSchedule(
                            fallback_profile, FALLBACK_CAP, learn_costs=name == "cost_aware"
                        )
                    )
                    label = (f"suffix+eagle3-m{least}" + (f"-w{width}" if width > 1 else "")
                             + FALLBACK_SUFFIXES[name] + ("-seeded" if seed else ""))
                    if name == "cost_aware":
                        learning[label] = schedule
                    suffix = {"num_speculative_tokens": FALLBACK_CAP, "cache_file": seed}
                    drafter = suffix_then_eagle3(
                        head, verifier, vocab, min_lookup_tokens=least, suffix=suffix, tree_width=width
                    )
                    setups.append(Setup(label, drafter, schedule))
    return setups, fallback_profile, learning  # fmt: skip


def print_costs(heads: list[str], profiles: dict, learning: dict, args) -> None:
    for path in heads:
        print(
            f"head cost c = {profiles[path].c:.3f} (time per drafted token / one-token verifier forward): "
            f"{path}"
        )
    gamma = max(dflash_gammas(args), default=0)
    for name, cost in ((n, p.c) for n, p in profiles.items() if n.startswith("dflash")):
        print(f"{name} cost c = {cost:.3f} per drafted token at γ {gamma} (one forward drafts them all: "
              f"{cost * gamma:.2f} one-token verifier forwards per round)")  # fmt: skip
    for label, s in learning.items():
        verify, _ = s.costs.relative()
        print(f"{label}: v(n) learned over {s.costs.rounds} rounds "
              f"(load x{s.costs.load_scale:.2f} the profile's): "
              + " ".join(f"{v:.2f}" for v in verify))  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.suffix_cache and not Path(args.suffix_cache).is_file():
        raise SystemExit(f"--suffix-cache {args.suffix_cache}: no such file; write one with "
                         "python -m specbench.drafters.suffix_seed SYNTH_DIR --out FILE")  # fmt: skip
    torch.set_num_threads(args.threads)
    out = out_dir(args.out_dir, "eagle3")
    verifier, eos, pad, vocab = embedded_verifier(args.device, args.dtype)
    tokenizer, model = verifier.tokenizer, verifier.model
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    gammas = [int(g) for g in args.gammas.split(",") if g.strip()]

    heads = args.head or [str(DEFAULT_HEAD)]
    profiles = {}
    for path in heads:
        profiles[path] = measure_profile(
            verifier, load_eagle3_drafter(path, verifier, vocab), vocab, max(gammas, default=1) + 1,
            context_len=256, repeats=7,
        )  # fmt: skip
        print(f"{path}:\n{profiles[path].table()}", file=sys.stderr)
    setups = [Setup("autoregressive"), *head_setups(args, verifier, vocab, heads, gammas)]
    setups += dflash_setups(args, verifier, vocab, profiles)
    setups += lookup_setups(args, verifier, vocab, heads[0])
    fallback, fallback_profile, learning = fallback_setups(args, verifier, vocab, heads[0])
    runners = setup_runners(
        model, setups + fallback, settings=settings, vocab_size=vocab, eos_token_ids=eos, pad_token_id=pad
    )
    questions = heldout_questions(args.per_task)
    answers = run_all(runners, tokenizer, questions)
    figures = table(answers, "autoregressive")
    write_answer_files(out / "answers", answers)
    report = {
        "head": heads[0], "heads": heads, "dflash": args.dflash, "suffix_cache": args.suffix_cache,
        "questions": len(questions), "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature, "threads": args.threads, "device": str(model.device),
        "dtype": str(model.dtype), "profile": profiles[heads[0]].to_dict(),
        "fallback_profile": fallback_profile.to_dict() if fallback_profile else None,
        "profiles": {path: p.to_dict() for path, p in profiles.items()},
        "figures": figures,
        "learned_costs": {label: s.costs.relative()[0] for label, s in learning.items()},
    }  # fmt: skip
    (out / "eagle3.json").write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(figures))
    print_costs(heads, profiles, learning, args)
    print(f"answers and figures: {out}")
    record_speed_run(args, "eagle3", answers, questions, report)
    if args.temperature > 0:
        return 0
    return 0 if all_identical(figures) else 1


def read_profile(path: str) -> CostProfile:
    """A task=profile file, or the ``fallback_profile`` a previous run of this benchmark recorded."""
    try:
        data = json.loads(Path(path).read_text())
        if isinstance(data, dict) and isinstance(data.get("fallback_profile"), dict):
            return CostProfile.from_dict(data["fallback_profile"], f"the fallback_profile of {path!r}")
        return CostProfile.from_dict(data, repr(path))
    except (OSError, ValueError) as err:
        raise SystemExit(f"--fallback-profile: {err}") from err


if __name__ == "__main__":
    sys.exit(main())
