"""The verifier's LM head on a CPU: ``F.linear`` against the small-batch head, in v(n) and in decoding speed.

Every model specbench loads gets ``specbench.models.small_batch_lm_head`` on its LM head: for 2..64 rows
of float32 on a CPU it computes ``(W @ xᵀ)ᵀ`` instead of ``F.linear``. This script measures what that does
on the embedded SmolLM2-135M-Instruct, switching the one verifier's LM head between the two forwards:

- **v(n)**: the verifier forward over n = 1..``--max-n`` new tokens after 256 cached ones, ``--rounds``
  rounds taken in turn with each head (``specbench.decoding.cost.measure_verify_ms``), medians over rounds;
- **decoding**: autoregressive decoding and the committed EAGLE-3 head (γ = ``--gamma``, greedy, exact
  ``sd`` rule), each with both heads, interleaved question by question on ``--per-task`` held-out
  Spec-Bench questions per task (``harness.run_all``). Speedups are against autoregressive decoding with
  ``F.linear``; every output must be token-identical to it (exit 1 otherwise).

    python benchmarks/verify_cost.py --per-task 2 --max-new-tokens 64 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    all_identical,
    embedded_verifier,
    format_table,
    heldout_questions,
    out_dir,
    run_all,
    switched_runner,
    table,
    verify_ms_in_turn,
    write_answer_files,
)

from specbench.decoding import DraftSchedule, GenerationSettings, SpeculativeEngine
from specbench.drafters.eagle3_format import load_eagle3_drafter
from specbench.models.small_batch_lm_head import SmallBatchLinear

DEFAULT_HEAD = Path(__file__).resolve().parents[1] / "checkpoints" / "eagle3-smollm2-135m" / "trained.pt"
HEADS = {"F.linear": nn.Linear, "small-batch": SmallBatchLinear}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--head", default=str(DEFAULT_HEAD), help="EAGLE-3 trained.pt for the decoding rows")
    parser.add_argument("--per-task", type=int, default=2, help="held-out questions per task (0: v(n) only)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--max-n", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7, help="v(n) rounds per head (medians)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", default=None, help="default: outputs/verify_cost/TIME")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = out_dir(args.out_dir, "verify_cost")
    verifier, eos, pad, vocab = embedded_verifier()
    model, lm_head = verifier.model, verifier.model.get_output_embeddings()
    if not isinstance(lm_head, SmallBatchLinear):
        raise SystemExit(
            "the loaded verifier's LM head is not the small-batch one; see specbench.models.loading"
        )

    def use(head: str) -> None:
        lm_head.__class__ = HEADS[head]

    setups = {head: (model, lambda head=head: use(head), 256) for head in HEADS}
    verify_ms = verify_ms_in_turn(setups, vocab, args.max_n, args.rounds)
    one = verify_ms["F.linear"][0]
    print("n  " + "  ".join(f"{head:>22}" for head in HEADS))
    for n in range(args.max_n):
        cells = [f"{verify_ms[h][n]:8.1f} ms  v={verify_ms[h][n] / one:5.2f}" for h in HEADS]
        print(f"{n + 1:<2} " + "  ".join(f"{c:>22}" for c in cells))
    report = {"threads": args.threads, "context_len": 256, "verify_ms": verify_ms}

    identical = True
    if args.per_task > 0:
        settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
        common = {"settings": settings, "vocab_size": vocab, "eos_token_ids": eos, "pad_token_id": pad}
        runners = []
        for head in HEADS:
            engines = {
                f"autoregressive ({head})": SpeculativeEngine(model, None, **common),
                f"eagle3-g{args.gamma} ({head})": SpeculativeEngine(
                    model, load_eagle3_drafter(args.head, verifier, vocab),
                    schedule=DraftSchedule("constant", args.gamma), **common,
                ),
            }  # fmt: skip
            for name, engine in engines.items():
                runners.append(switched_runner(name, engine, lambda head=head: use(head)))
        questions = heldout_questions(args.per_task)
        answers = run_all(runners, verifier.tokenizer, questions)
        figures = table(answers, "autoregressive (F.linear)")
        write_answer_files(out / "answers", answers)
        print(format_table(figures))
        identical = all_identical(figures)
        report |= {"head": args.head, "questions": len(questions), "max_new_tokens": args.max_new_tokens,
                   "gamma": args.gamma, "figures": figures}  # fmt: skip
    use("small-batch")
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify_cost.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"figures: {out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
