"""The early-exit drafter with a reduced draft vocabulary: its cost c, τ and speed, on the embedded SmolLM2-135M.

For each ``--sizes`` value (``full``: the whole vocabulary, the default drafter; ``K``: the K most frequent
response tokens of the ``--data`` task=synth dataset, counted as ``task=train method=eagle3`` counts them) the
demo's early-exit drafter (the verifier's first 4 layers, constant γ = 3, the ``sd`` rule) gets:

- c = one drafter step / one verifier step: a one-token forward over a ``--context``-token cache (the drafter's
  step includes expanding its logits and the engine's sampler), medians of ``--repeats`` timings taken in
  turn across every size and the verifier, so a drift of the shared machine hits all of them alike. A
  ``49152 (sliced)`` row times the whole vocabulary through the reduced-vocabulary path (body + every LM-head
  row): what the path itself costs, apart from the smaller LM head;
- τ (tokens per verifier forward), tokens/s and speedup vs autoregressive decoding on ``--per-task``
  held-out Spec-Bench questions per task (greedy: every output must be token-identical to autoregressive
  decoding; exit 1 otherwise), interleaved question by question (``harness.run_all``).

Also printed: the share of the data's response tokens each vocabulary covers, and whether the 8192-token
vocabulary counted here is the one the committed EAGLE-3 head saved (``--eagle-head``).

    python benchmarks/draft_vocab_c.py --data /work/data/synth_t1_p150 --per-task 1 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    embedded_verifier,
    engine_runner,
    heldout_questions,
    out_dir,
    run_all,
    table,
    write_answer_files,
)

from specbench.decoding import DraftSchedule, GenerationSettings, SpeculativeEngine
from specbench.decoding.cache import CachedModel
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.warping import Warping
from specbench.models.draft_vocab import DraftVocab, load_draft_vocab
from specbench.models.early_exit import early_exit_drafter
from specbench.models.pair import tokenizer_hash

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HEAD = ROOT / "checkpoints" / "eagle3-smollm2-135m" / "trained.pt"
EXIT_LAYERS, GAMMA = 4, 3  # conf/model/drafter/early-exit.yaml, the default schedule


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/work/data/synth_t1_p150", help="a task=synth dir of the verifier")
    parser.add_argument("--sizes", default="full,16384,8192,4096", help="full and/or draft vocabulary sizes")
    parser.add_argument("--eagle-head", default=str(DEFAULT_HEAD), help="an EAGLE-3 trained.pt to compare with")
    parser.add_argument("--per-task", type=int, default=1, help="held-out questions per Spec-Bench task (0: c only)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--context", type=int, default=256, help="cached tokens when a step is timed")
    parser.add_argument("--repeats", type=int, default=15, help="timings per step (medians)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", default=None, help="default: outputs/draft_vocab_c/TIME")
    return parser.parse_args(argv)


def drafter_step(drafter: ModelDrafter, context: list[int], pad: int):
    """One draft step of ``drafter`` after ``context`` (the cache holds all but its last token)."""
    state = BatchState.create([context], GAMMA, 10**6, [], pad, drafter.device)
    sampler = DraftSampler(Warping(), torch.Generator(device=drafter.device), DraftSchedule("constant", GAMMA))
    drafter.reset(1)
    drafter.prefill(state, None)
    keep, caps = drafter.cached.num_valid.clone(), torch.ones(1, dtype=torch.long, device=drafter.device)

    def step() -> None:
        drafter.propose(state, caps, sampler)  # one forward over the pending last token: one draft
        drafter.cached.keep(keep)

    return step


def verifier_step(model, vocab_size: int, context: list[int]):
    cached = CachedModel(model, vocab_size)
    cached.reset(1)
    cached.forward(torch.tensor([context[:-1]], device=cached.device))
    keep, last = cached.num_valid.clone(), torch.tensor([context[-1:]], device=cached.device)

    def step() -> None:
        cached.forward(last)
        cached.keep(keep)

    return step


@torch.no_grad()
def step_medians(steps: dict[str, object], repeats: int, inner: int = 3) -> dict[str, float]:
    """Median ms per call of every step, the steps timed in turn (``inner`` calls per timing)."""
    for step in steps.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(inner):
                step()
            times[name].append(1000.0 * (time.perf_counter() - start) / inner)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = out_dir(args.out_dir, "draft_vocab_c")
    verifier, eos, pad, vocab_size = embedded_verifier()
    tokenizer, model = verifier.tokenizer, verifier.model
    token_hash = tokenizer_hash(tokenizer)

    vocabs: dict[str, tuple[DraftVocab | None, float | None]] = {}
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        if size == "full":
            vocabs["full"] = (None, 1.0)
        else:
            vocab, info = load_draft_vocab(args.data, int(size), vocab_size, token_hash, "--sizes")
            vocabs[size] = (vocab, info["draft_vocab_coverage"])
    same_as_head = None
    if Path(args.eagle_head).is_file() and "8192" in vocabs:
        saved, _ = load_draft_vocab(args.eagle_head, None, vocab_size, token_hash, "--eagle-head")
        same_as_head = saved == vocabs["8192"][0]

    def drafter(name: str, vocab: DraftVocab | None) -> ModelDrafter:
        return ModelDrafter(early_exit_drafter(model, EXIT_LAYERS), vocab_size, f"early-exit-{name}", vocab)

    context = torch.randint(0, vocab_size, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    steps = {"verifier": verifier_step(model, vocab_size, context)}
    for name, (vocab, _) in vocabs.items():
        steps[name] = drafter_step(drafter(name, vocab), context, pad)
    steps[f"{vocab_size} (sliced)"] = drafter_step(drafter("sliced", DraftVocab.full(vocab_size)), context, pad)
    medians = step_medians(steps, args.repeats)
    print(f"verifier step: {medians['verifier']:.2f} ms (median of {args.repeats})", file=sys.stderr)

    figures: dict[str, dict] = {}
    if args.per_task > 0:
        settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
        common = {"settings": settings, "vocab_size": vocab_size, "eos_token_ids": eos, "pad_token_id": pad}
        runners = [engine_runner("autoregressive", SpeculativeEngine(model, None, **common))]
        for name, (vocab, _) in vocabs.items():
            engine = SpeculativeEngine(model, drafter(name, vocab), schedule=DraftSchedule("constant", GAMMA), **common)
            runners.append(engine_runner(name, engine))
        answers = run_all(runners, tokenizer, heldout_questions(args.per_task))
        figures = {name: rows["overall"] for name, rows in table(answers, "autoregressive").items()}
        write_answer_files(out / "answers", answers)

    rows = []
    for name in [*vocabs, f"{vocab_size} (sliced)"]:
        vocab, coverage = vocabs.get(name, (DraftVocab.full(vocab_size), 1.0))
        rows.append({
            "draft_vocab": name, "draft_vocab_size": vocab.size if vocab else vocab_size, "coverage": coverage,
            "draft_ms": medians[name], "verify_ms": medians["verifier"], "c": medians[name] / medians["verifier"],
            **{k: figures[name][k] for k in ("tau", "tokens_per_s", "speedup", "identical") if name in figures},
        })  # fmt: skip
    ar = figures.get("autoregressive")
    print(f"{'draft vocab':>15} {'coverage':>9} {'draft ms':>9} {'c':>6} {'tau':>6} {'tok/s':>7} {'vs AR':>7} {'same':>5}")
    for r in rows:
        decoded = (
            f"{r['tau']:>6.2f} {r['tokens_per_s']:>7.1f} {r['speedup']:>6.2f}x {r['identical']:>5.0%}"
            if "tau" in r else f"{'-':>6} {'-':>7} {'-':>7} {'-':>5}"
        )  # fmt: skip
        print(f"{r['draft_vocab']:>15} {r['coverage']:>9.4f} {r['draft_ms']:>9.2f} {r['c']:>6.3f} {decoded}")
    print(f"verifier step {medians['verifier']:.2f} ms" + (f"; autoregressive {ar['tokens_per_s']:.1f} tok/s" if ar else ""))
    if same_as_head is not None:
        print(f"8192-token vocabulary counted from {args.data} == the one {args.eagle_head} saved: {same_as_head}")
    report = {
        "data": args.data, "questions": len(heldout_questions(args.per_task)) if args.per_task else 0,
        "max_new_tokens": args.max_new_tokens, "context": args.context, "repeats": args.repeats,
        "threads": args.threads, "exit_layers": EXIT_LAYERS, "gamma": GAMMA, "rows": rows,
        "autoregressive": ar, "same_as_eagle_head": same_as_head,
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "draft_vocab_c.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"figures: {out}")
    identical = all(r.get("identical", 1.0) == 1.0 for r in rows)
    if figures:
        print("every output token-identical to autoregressive decoding:", identical)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
