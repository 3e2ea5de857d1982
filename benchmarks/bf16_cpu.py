"""bf16 on a CPU: float32, plain bf16 kernels and the row-invariant bf16 forwards, side by side.

A CPU with native bf16 dot products (``avx512_bf16`` / AMX) runs the embedded SmolLM2-135M-Instruct faster in
bf16 than in float32, and a verification forward over a few tokens costs about what one token costs. But
with plain kernels, greedy speculative decoding in bf16 is not token-identical to autoregressive decoding:
a position's logits depend on how many positions share the forward. ``specbench.models.row_invariant``
removes that dependence (docs/engine.md#bf16-on-a-cpu-row-invariant-forwards). This script measures all
three in one process, on two verifiers (float32 and bf16; the bf16 one switched between its plain and its
row-invariant forwards before every run):

- **v(n)**: the verifier forward over n = 1..``--max-n`` new tokens after ``--context`` cached ones, in turn
  per forward, ``--rounds`` rounds, medians;
- **decoding**: per forward, autoregressive decoding, the committed EAGLE-3 head at each ``--gammas`` value
  and the suffix drafter with the cost-aware draft length (its profile measured for that forward),
  interleaved question by question on ``--per-task`` held-out Spec-Bench questions per task (greedy, exact
  ``sd`` rule). Each group's speedups and identity are against autoregressive decoding with the same
  forward; the last table puts every row against float32 autoregressive decoding.

Exit 1 when a float32 or row-invariant speculative output differs from its autoregressive decoding.

    python benchmarks/bf16_cpu.py --per-task 2 --max-new-tokens 64 --threads 1
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
from specbench.decoding.cost import CostProfile
from specbench.decoding.cost_aware import CostAwareSchedule
from specbench.drafters.eagle3_format import load_eagle3_drafter
from specbench.drafters.suffix import SuffixDrafter
from specbench.models.row_invariant import ROWWISE_ATTENTION, RowInvariantLinear
from specbench.models.small_batch_lm_head import SmallBatchLinear

DEFAULT_HEAD = Path(__file__).resolve().parents[1] / "checkpoints" / "eagle3-smollm2-135m" / "trained.pt"
FORWARDS = ("fp32", "bf16-plain", "bf16-rowinv")
MAX_GAMMA = 10


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--head", default=str(DEFAULT_HEAD), help="EAGLE-3 trained.pt")
    parser.add_argument("--per-task", type=int, default=2, help="held-out questions per task (0: v(n) only)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gammas", default="1,2", help="constant draft lengths of the EAGLE-3 rows")
    parser.add_argument("--max-n", type=int, default=MAX_GAMMA + 1)
    parser.add_argument("--context", default="256,1024", help="cached tokens before the v(n) forwards")
    parser.add_argument("--rounds", type=int, default=5, help="v(n) rounds per forward (medians)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", default=None, help="default: outputs/bf16_cpu/TIME")
    return parser.parse_args(argv)


def model_dtype(verifier) -> torch.dtype:
    return next(verifier.model.parameters()).dtype


def forward_switch(model: nn.Module):
    """``use(row_invariant)``: put the bf16 model's linear layers and attention on the row-invariant
    forwards or back on the plain ones (``nn.Linear``, SDPA)."""
    head = model.get_output_embeddings()
    body = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not head]

    def use(row_invariant: bool) -> None:
        for layer in body:
            layer.__class__ = RowInvariantLinear if row_invariant else nn.Linear
        head.__class__ = SmallBatchLinear if row_invariant else nn.Linear
        model.config._attn_implementation = ROWWISE_ATTENTION if row_invariant else "sdpa"

    return use


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = out_dir(args.out_dir, "bf16_cpu")
    fp32, eos, pad, vocab = embedded_verifier("cpu", "float32")
    bf16, *_ = embedded_verifier("cpu", "bfloat16")
    use = forward_switch(bf16.model)
    setups = {  # forward -> (verifier, what to switch before it runs)
        "fp32": (fp32, lambda: None),
        "bf16-plain": (bf16, lambda: use(False)),
        "bf16-rowinv": (bf16, lambda: use(True)),
    }
    contexts = [int(c) for c in args.context.split(",")]
    turns = {f"{f}@{c}": (v.model, switch, c) for c in contexts for f, (v, switch) in setups.items()}
    measured = verify_ms_in_turn(turns, vocab, args.max_n, args.rounds)
    verify_ms = {f"{f}@{c}": measured[f"{f}@{c}"] for f in FORWARDS for c in contexts}  # report order
    print("verifier forward over n new tokens, ms (v(n) = ms / the same forward's n = 1)")
    print("n  " + "".join(f"{key:>22}" for key in verify_ms))
    for n in range(args.max_n):
        cells = [f"{ms[n]:7.1f} v={ms[n] / ms[0]:4.2f}" for ms in verify_ms.values()]
        print(f"{n + 1:<2} " + "".join(f"{c:>22}" for c in cells))
    report = {"threads": args.threads, "contexts": contexts, "verify_ms": verify_ms}

    identical = True
    if args.per_task > 0:
        settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
        common = {"settings": settings, "vocab_size": vocab, "eos_token_ids": eos, "pad_token_id": pad}
        gammas = [int(g) for g in args.gammas.split(",") if g]
        groups: dict[str, list[str]] = {}
        runners = []
        for forward, (verifier, switch) in setups.items():
            switch()
            model = verifier.model
            profile = CostProfile(verify_ms[f"{forward}@{contexts[0]}"][:], draft_ms=0.0, verifier=verifier.name,
                                  drafter="model-free", threads=args.threads, context_len=contexts[0],
                                  dtype=str(model_dtype(verifier)))  # fmt: skip
            engines = {f"autoregressive {forward}": SpeculativeEngine(model, None, **common)}
            for gamma in gammas:
                engines[f"eagle3-g{gamma} {forward}"] = SpeculativeEngine(
                    model, load_eagle3_drafter(args.head, verifier, vocab),
                    schedule=DraftSchedule("constant", gamma), **common,
                )  # fmt: skip
            engines[f"suffix+cost {forward}"] = SpeculativeEngine(
                model, SuffixDrafter(num_speculative_tokens=MAX_GAMMA),
                schedule=CostAwareSchedule(profile, MAX_GAMMA), **common,
            )  # fmt: skip
            groups[forward] = list(engines)
            for name, engine in engines.items():
                runners.append(switched_runner(name, engine, switch))
        questions = heldout_questions(args.per_task)
        answers = run_all(runners, bf16.tokenizer, questions)
        write_answer_files(out / "answers", answers)
        report |= {"head": args.head, "questions": len(questions), "max_new_tokens": args.max_new_tokens,
                   "gammas": gammas, "figures": {}}  # fmt: skip
        for forward, names in groups.items():
            figures = table({n: answers[n] for n in names}, f"autoregressive {forward}")
            report["figures"][forward] = figures
            print(f"\n{forward}: against autoregressive decoding with the same forward")
            print(format_table(figures))
            if forward != "bf16-plain":
                identical &= all(rows["overall"]["identical"] == 1.0 for rows in figures.values())
        against_fp32 = table(answers, "autoregressive fp32")
        report["against_fp32"] = against_fp32
        print("\nevery row against float32 autoregressive decoding ('same': identical to the float32 outputs)")
        print(format_table(against_fp32))
        print("every float32 and row-invariant bf16 output identical to its autoregressive decoding:", identical)
    use(True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bf16_cpu.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"figures: {out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
