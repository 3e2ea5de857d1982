"""EAGLE-3 draft vocabulary size vs drafting cost c and coverage, on the embedded SmolLM2-135M-Instruct verifier.

For each ``--sizes`` value K the K most frequent response tokens of a ``task=synth`` dataset (the same rule
``task=train method=eagle3`` uses) make the draft vocabulary; printed per K: the share of the data's response
tokens it covers (an upper bound on the head's step-0 agreement), the head's trainable parameters (LM head
trained / frozen) and its measured cost c = time per drafted token / one-token verifier forward, timed in real
decoding (``measure_profile``). The head's weights do not change its cost, so untrained heads are timed; τ
needs a trained head per K (see docs/eagle3.md for the one trained here).

    python benchmarks/eagle3_vocab.py --data /work/data/synth_t1_p150 --sizes 4096,8192,16384,49152 --threads 1
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from specbench.data.synth_dataset import load_synthetic
from specbench.drafters.draft_vocab import draft_vocab_for
from specbench.drafters.eagle3 import Eagle3Drafter, Eagle3Head
from specbench.evaluation import measure_profile
from specbench.models import ModelSpec, load_verifier


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a task=synth output dir of the embedded verifier")
    parser.add_argument("--sizes", default="4096,8192,16384,49152")
    parser.add_argument("--gamma", type=int, default=3, help="draft length the drafter is timed at")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    verifier = load_verifier(ModelSpec(kind="embedded"), "cpu", "float32")
    vocab_size = min(len(verifier.tokenizer), verifier.model.get_output_embeddings().weight.shape[0])
    data, _ = load_synthetic(args.data)
    rows = []
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
    print(f"{'K':>6} {'coverage':>9} {'params (LM head trained / frozen)':>34} {'draft ms':>9} {'c':>6}")
    for r in rows:
        params = f"{r['params_lm_head_trained'] / 1e6:.1f} M / {r['params_lm_head_frozen'] / 1e6:.1f} M"
        print(f"{r['draft_vocab_size']:>6} {r['coverage']:>9.4f} {params:>34} {r['draft_ms']:>9.2f} {r['c']:>6.3f}")
    if args.json_out:
        with open(args.json_out, "w") as handle:
            json.dump(rows, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
