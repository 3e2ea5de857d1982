"""EAGLE-3 draft vocabulary size vs drafting cost c and coverage, on the embedded SmolLM2-135M-Instruct verifier.

For each ``--sizes`` value K the K most frequent response tokens of a ``task=synth`` dataset (the same rule
``task=train method=eagle3`` uses) make the draft vocabulary; printed per K: the share of the data's response
tokens it covers (an upper bound on the head's step-0 agreement), the head's trainable parameters (LM head
trained / frozen) and its measured cost c = time per drafted token / one-token verifier forward, timed in real
decoding (``measure_profile``). The head's weights do not change its cost, so untrained heads are timed; τ
needs a trained head per K (see docs/eagle3.md for the one trained here).

    python benchmarks/eagle3_vocab.py --data /work/data/synth_t1_p150 --sizes 4096,8192,16384,49152 --threads 1

With ``--work DIR`` it measures τ too: for each K it trains a head with the embedded head's recipe
(``TRAIN_RECIPE``, ``--train-steps`` steps; ``task=train method=eagle3`` through ``launch.py``, the feature
cache in ``DIR/features_k{K}``, the head in ``DIR/k{K}``; a size whose ``trained.pt`` exists is not
retrained, so the run resumes), then decodes held-out Spec-Bench questions greedily with every head,
interleaved with autoregressive decoding in one process, and prints per K: coverage, c, the validation
agreement of draft step 0, τ, speedup vs autoregressive and the share of token-identical outputs:

    python benchmarks/eagle3_vocab.py --data /work/data/synth_t1_p150 --sizes 4096,8192,16384 \
        --work /work/data/vocab_sweep --train-steps 300 --per-task 2 --max-new-tokens 64 --threads 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import embedded_verifier, engine_runner, heldout_questions, run_all, table

from specbench.data.synth_dataset import load_synthetic
from specbench.decoding import DraftSchedule, GenerationSettings, SpeculativeEngine
from specbench.drafters.eagle3 import Eagle3Drafter
from specbench.drafters.eagle3_format import load_eagle3_drafter
from specbench.drafters.eagle3_head import Eagle3Head
from specbench.evaluation import measure_profile
from specbench.models.draft_vocab import draft_vocab_for

ROOT = Path(__file__).resolve().parents[1]
# The embedded head's recipe (docs/eagle3.md) less its step count: only the vocabulary size differs per run.
TRAIN_RECIPE = [
    "task=train", "method=eagle3", "model/drafter=eagle3", "train.feature_top_k=64", "train.ttt_chain_fraction=0.25",
    "train.freeze_lm_head=true", "train.init_layer=verifier_last", "train.batch_size=4", "train.lr_start=5e-4",
    "train.lr_end=2e-5", "train.warmup_steps=20", "train.val_every_steps=100", "train.val_prompts=2",
    "train.checkpoint_every_steps=100", "runtime.dtype=float32", "tracking=none",
]  # fmt: skip


def train_head(data: str, work: Path, size: int | None, steps: int, threads: int) -> Path:
    """``DIR/k{K}/trained.pt``, trained now unless it exists (``size`` None: the full vocabulary)."""
    name = f"k{size}" if size else "kfull"
    head = work / name / "trained.pt"
    if head.exists():
        return head
    overrides = [
        *TRAIN_RECIPE, f"train.data={data}", f"train.draft_vocab_size={size if size else 'null'}",
        f"train.max_steps={steps}", f"train.feature_cache={work / f'features_{name}'}",
        f"train.output_dir={work / name}", f"runtime.num_threads={threads}",
    ]  # fmt: skip
    print(f"training {name}: launch.py {' '.join(overrides)}", file=sys.stderr)
    with open(work / f"{name}.log", "a") as log:
        done = subprocess.run([sys.executable, str(ROOT / "launch.py"), *overrides], cwd=ROOT, stdout=log,
                              stderr=subprocess.STDOUT, check=False)  # fmt: skip
    if done.returncode != 0 or not head.exists():
        raise SystemExit(f"training {name} failed (exit {done.returncode}); see {work / f'{name}.log'}")
    return head


def measure_tau(verifier, eos: list[int], pad: int, vocab_size: int, heads: dict[int, Path], gamma: int,
                per_task: int, max_new_tokens: int) -> dict[int, dict]:  # fmt: skip
    """Greedy decoding of held-out questions with each head and autoregressively, interleaved: the
    overall figures of :func:`harness.table` per vocabulary size."""
    common = {
        "settings": GenerationSettings(max_new_tokens=max_new_tokens), "vocab_size": vocab_size,
        "eos_token_ids": eos, "pad_token_id": pad,
    }  # fmt: skip
    runners = [engine_runner("autoregressive", SpeculativeEngine(verifier.model, None, **common))]
    for size, path in heads.items():
        drafter = load_eagle3_drafter(path, verifier, vocab_size)
        engine = SpeculativeEngine(verifier.model, drafter, schedule=DraftSchedule("constant", gamma), **common)
        runners.append(engine_runner(f"k{size}", engine))
    answers = run_all(runners, verifier.tokenizer, heldout_questions(per_task))
    figures = table(answers, "autoregressive")
    return {size: figures[f"k{size}"]["overall"] for size in heads}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a task=synth output dir of the embedded verifier")
    parser.add_argument("--sizes", default="4096,8192,16384,49152")
    parser.add_argument("--gamma", type=int, default=3, help="draft length the drafter is timed at")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--work", default=None, help="train a head per size here and measure its τ")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--per-task", type=int, default=2, help="held-out questions per Spec-Bench task")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    verifier, eos, pad, vocab_size = embedded_verifier()
    data, _ = load_synthetic(args.data)
    work = Path(args.work) if args.work else None
    if work:
        work.mkdir(parents=True, exist_ok=True)
    rows, heads = [], {}
    for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
        vocab, coverage = draft_vocab_for(data, None if size >= vocab_size else size, vocab_size)
        head = Eagle3Head.for_verifier(verifier.model, vocab).float().eval()
        lm_head = head.lm_head.weight.numel()
        trained = head.num_parameters(trainable_only=True)
        profile = measure_profile(verifier, Eagle3Drafter(head), vocab_size, args.gamma + 1, repeats=5)
        rows.append({
            "draft_vocab_size": vocab.size, "coverage": coverage, "params_lm_head_trained": trained,
            "params_lm_head_frozen": trained - lm_head, "draft_ms": profile.draft_ms,
            "verify_ms_1": profile.verify_ms[0], "c": profile.c,
        })  # fmt: skip
        print(f"K={vocab.size}: coverage {coverage:.4f}, c {profile.c:.3f}", file=sys.stderr)
        if work:
            path = train_head(args.data, work, None if size >= vocab_size else size, args.train_steps, args.threads)
            heads[vocab.size] = path
            metrics = json.loads((path.parent / "train_metrics.json").read_text())
            rows[-1].update(head=str(path), steps=metrics["global_step"],
                            val_acc_step0=metrics.get("final_val_acc_step0"))  # fmt: skip
    if heads:
        measured = measure_tau(verifier, eos, pad, vocab_size, heads, args.gamma, args.per_task, args.max_new_tokens)
        for row in rows:
            row.update(measured[row["draft_vocab_size"]])
    print(f"{'K':>6} {'coverage':>9} {'params (LM head trained / frozen)':>34} {'draft ms':>9} {'c':>6}")
    for r in rows:
        params = f"{r['params_lm_head_trained'] / 1e6:.1f} M / {r['params_lm_head_frozen'] / 1e6:.1f} M"
        print(f"{r['draft_vocab_size']:>6} {r['coverage']:>9.4f} {params:>34} {r['draft_ms']:>9.2f} {r['c']:>6.3f}")
    if heads:
        print(f"\ntrained {args.train_steps} steps, greedy, γ {args.gamma}, {args.per_task} held-out questions per task")
        print(f"{'K':>6} {'val acc0':>9} {'tau':>6} {'speedup':>8} {'outputs = AR':>13}")
        for r in rows:
            print(f"{r['draft_vocab_size']:>6} {r['val_acc_step0']:>9.3f} {r['tau']:>6.2f} {r['speedup']:>7.2f}x "
                  f"{r['identical']:>12.0%}")  # fmt: skip
    if args.json_out:
        with open(args.json_out, "w") as handle:
            json.dump(rows, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
