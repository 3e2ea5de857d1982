"""Model-free drafters vs autoregressive decoding and HF prompt lookup, on held-out Spec-Bench questions.

One process, interleaved: for each question (first turn, greedy, the embedded SmolLM2-135M-Instruct
verifier) autoregressive decoding, HF ``generate(prompt_lookup_num_tokens=10)`` (its defaults) and ``=4``,
and specbench's ``prompt-lookup``, ``ngram`` and ``suffix`` drafters, each with a constant draft length and
with ``schedule=cost_aware`` (a cost profile measured at the start of the run). Prints per task τ, tokens/s
and speedup vs autoregressive in Spec-Bench's layout, checks every output against autoregressive decoding,
writes Spec-Bench answer files and a JSON of the figures.

    python benchmarks/model_free.py --per-task 5 --max-new-tokens 128 --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    Setup,
    all_identical,
    benchmark_parser,
    decode_and_report,
    heldout_questions,
    hf_runner,
    out_dir,
    setup_runners,
)

from specbench.decoding import DraftSchedule, GenerationSettings
from specbench.decoding.cost import CostProfile, measure_verify_ms
from specbench.decoding.cost_aware import CostAwareSchedule
from specbench.drafters.ngram import NgramDrafter
from specbench.drafters.prompt_lookup import PromptLookupDrafter
from specbench.drafters.suffix import SuffixDrafter
from specbench.evaluation import eos_token_ids, pad_token_id
from specbench.models import ModelSpec, load_verifier


def parse_args(argv=None) -> argparse.Namespace:
    parser = benchmark_parser(
        __doc__, per_task=5, max_new_tokens=128, threads=1,
        out_dir={"default": None, "help": "default: outputs/model_free/TIME"},
    )  # fmt: skip
    parser.add_argument("--max-gamma", type=int, default=10, help="longest draft of the cost-aware rows")
    parser.add_argument(
        "--only", default=None, help="comma list of runner names to keep (plus autoregressive)"
    )
    return parser.parse_args(argv)


def lookup_drafters(max_gamma: int) -> dict[str, tuple]:
    """name -> (drafter factory, constant γ)."""
    return {
        "prompt-lookup": (lambda: PromptLookupDrafter(2, 10), 10),
        "ngram": (lambda: NgramDrafter(1, 5, num_speculative_tokens=max_gamma), 5),
        "suffix": (lambda: SuffixDrafter(num_speculative_tokens=max_gamma), max_gamma),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = out_dir(args.out_dir, "model_free")
    verifier = load_verifier(ModelSpec(kind="embedded"), "cpu", "float32")
    tokenizer, model = verifier.tokenizer, verifier.model
    eos = eos_token_ids(model, tokenizer)
    pad = pad_token_id(tokenizer, eos)
    vocab = min(len(tokenizer), model.get_output_embeddings().weight.shape[0])
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    common = {"settings": settings, "vocab_size": vocab, "eos_token_ids": eos, "pad_token_id": pad}

    started = time.perf_counter()
    verify_ms = measure_verify_ms(model, vocab, args.max_gamma + 1, context_len=384, repeats=7)
    profile = CostProfile(verify_ms, draft_ms=0.0, verifier=verifier.name, drafter="model-free",
                          threads=args.threads, context_len=384)
    print(profile.table(), f"\n(profile measured in {time.perf_counter() - started:.1f} s)", file=sys.stderr)

    lookups = [
        setup
        for name, (factory, gamma) in lookup_drafters(args.max_gamma).items()
        for setup in (Setup(f"{name}-g{gamma}", factory(), DraftSchedule("constant", gamma)),
                      Setup(f"{name}+cost", factory(), CostAwareSchedule(profile, args.max_gamma)))
    ]  # fmt: skip
    runners = [
        *setup_runners(model, [Setup("autoregressive")], **common),
        hf_runner("hf-pld-10", model, args.max_new_tokens, eos, pad, prompt_lookup_num_tokens=10,
                  max_matching_ngram_size=2),
        hf_runner("hf-pld-4", model, args.max_new_tokens, eos, pad, prompt_lookup_num_tokens=4,
                  max_matching_ngram_size=2),
        *setup_runners(model, lookups, **common),
    ]  # fmt: skip
    if args.only:
        keep = {"autoregressive", *args.only.split(",")}
        runners = [r for r in runners if r.name in keep]
    questions = heldout_questions(args.per_task)
    report = {"questions": len(questions), "max_new_tokens": args.max_new_tokens, "threads": args.threads,
              "device": "cpu", "dtype": "float32", "profile": profile.to_dict()}  # fmt: skip
    figures = decode_and_report(runners, tokenizer, questions, out, "model_free", report, args)
    return 0 if all_identical(figures) else 1


if __name__ == "__main__":
    sys.exit(main())
