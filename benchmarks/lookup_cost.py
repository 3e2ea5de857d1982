"""Lookup cost of the model-free drafters: propose + commit time per round and row.

Each drafter is driven through the Drafter interface with a real BatchState, as the engine drives it: a
prompt of the given context length, then rounds in which each row gains the accepted part of its proposal
plus one token. Only the drafter's own calls are timed (not the BatchState bookkeeping the engine does
anyway). Texts: ``random`` (uniform over a 32k vocabulary: lookups rarely match) and ``repetitive``
(spans of earlier text copied again and again: long matches, the expensive case for suffix trees), plus
``looping`` (one short passage repeated: every suffix matches, the worst case) with ``--worst-case``.

    .venv/bin/python benchmarks/lookup_cost.py                 # contexts 256, 1k, 4k; batch 1 and 4
    .venv/bin/python benchmarks/lookup_cost.py --rounds 50 --contexts 4096 --batch 1

Prints one row per drafter, text, context and batch size: median and p90 milliseconds per round and row,
and the prefill time per row (indexing the prompt, once per request).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping
from specbench.drafters.ngram import NgramDrafter
from specbench.drafters.prompt_lookup import PromptLookupDrafter
from specbench.drafters.suffix import SuffixDrafter, arctic_available

VOCAB, EOS, PAD = 32000, 2, 0
SAMPLER = DraftSampler(Warping(), torch.Generator().manual_seed(0), DraftSchedule())


def text(kind: str, length: int, rng: random.Random) -> list[int]:
    if kind == "looping":
        passage = [rng.randrange(3, VOCAB) for _ in range(40)]
        return (passage * (length // 40 + 1))[:length]
    copy_rate = {"random": 0.0, "repetitive": 0.5}[kind]
    out: list[int] = []
    while len(out) < length:
        if out and rng.random() < copy_rate:
            start = rng.randrange(len(out))
            out.extend(out[start : start + rng.randint(4, 32)])
        else:
            out.append(rng.randrange(3, VOCAB))
    return out[:length]


def drafters() -> dict[str, callable]:
    made = {
        "prompt-lookup (HF: n<=2, k=10)": lambda: PromptLookupDrafter(),
        "prompt-lookup (Spec-Bench: n<=3, k=10)": lambda: PromptLookupDrafter.spec_bench(),
        "ngram (vLLM: n=5, k=5)": lambda: NgramDrafter(),
        "ngram (n in [1, 5], k=10)": lambda: NgramDrafter(1, 5, 10),
        "suffix (python)": lambda: SuffixDrafter(backend="python"),
    }
    if arctic_available():
        made["suffix (arctic C++)"] = lambda: SuffixDrafter(backend="arctic")
    return made


def measure(
    make, kind: str, context: int, batch: int, rounds: int, gamma: int, seed: int
) -> tuple[list[float], float]:
    """Per-round-and-row seconds of propose + commit, and prefill seconds per row."""
    rng = random.Random(seed)
    full = [text(kind, context + rounds * (gamma + 1), rng) for _ in range(batch)]
    state = BatchState.create([row[:context] for row in full], gamma, 10**9, [EOS], PAD, "cpu")
    drafter = make()
    t0 = time.perf_counter()
    drafter.reset(batch)
    drafter.prefill(state, None)
    prefill = (time.perf_counter() - t0) / batch
    done = [context] * batch
    caps = torch.full((batch,), gamma, dtype=torch.long)
    accepted = torch.zeros(batch, dtype=torch.long)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        proposal = drafter.propose(state, caps, SAMPLER)
        t1 = time.perf_counter()
        new_rows = []
        for b in range(batch):
            drafted = proposal.tokens[b, : int(proposal.lengths[b])].tolist()
            truth = full[b][done[b] : done[b] + len(drafted) + 1]
            n = 0
            while n < len(drafted) and drafted[n] == truth[n]:
                n += 1
            new_rows.append(truth[: n + 1])
            done[b] += n + 1
            accepted[b] = n
        state.append(new_rows)
        t2 = time.perf_counter()
        drafter.commit(state, None, accepted)
        t3 = time.perf_counter()
        times.append(((t1 - t0) + (t3 - t2)) / batch)
    return times, prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--gamma", type=int, default=10, help="caps per row and round (drafts at most)")
    parser.add_argument("--worst-case", action="store_true", help="also the 'looping' text")
    parser.add_argument("--only", default="", help="only drafters whose name contains this text")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    kinds = ["random", "repetitive"] + (["looping"] if args.worst_case else [])
    print(f"propose + commit per round and row (ms); {args.rounds} rounds, caps {args.gamma}")
    header = (
        f"{'drafter':<40} {'text':<11} {'context':>7} {'batch':>5} {'median':>8} {'p90':>8} "
        f"{'prefill/row':>11}"
    )
    print(header)
    print("-" * len(header))
    for name, make in drafters().items():
        if args.only not in name:
            continue
        for kind in kinds:
            for context in args.contexts:
                for batch in args.batch:
                    times, prefill = measure(make, kind, context, batch, args.rounds, args.gamma, args.seed)
                    median = statistics.median(times) * 1e3
                    p90 = statistics.quantiles(times, n=10)[-1] * 1e3
                    print(
                        f"{name:<40} {kind:<11} {context:>7} {batch:>5} {median:>8.3f} {p90:>8.3f} "
                        f"{prefill * 1e3:>11.2f}"
                    )


if __name__ == "__main__":
    main()
