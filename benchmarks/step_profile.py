"""Where a decoding step goes: specbench's autoregressive engine next to transformers' ``generate``.

Per dtype, the embedded SmolLM2-135M-Instruct as ``benchmarks/peers.py`` loads it (specbench's loader, and a
plain-transformers copy of the same safetensors), greedy, 1 thread. Each decodes the same held-out questions
once under ``torch.profiler`` (after a warm-up), with named ranges around the model's body, its LM head, the
attention function and the KV cache update. Per generated token, the prompt's forward left out, in ms:

  forward     the model's body and LM head          attention   the attention function (inside forward)
  cache       the KV cache update (inside forward)  sampling    softmax / log-softmax / argmax / top-k ops
  outside     the rest of the step outside the model: the loop, its tensor ops, Python

The profiler adds a few µs per op to every figure, so compare the two rows, not the absolute times with
``peers.py``'s.

    python benchmarks/step_profile.py --per-category 1 --max-new-tokens 48 --threads 1
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import benchmark_parser, embedded_verifier, first_turn_ids, heldout_questions, record_run
from peers import plain_transformers_copy

from specbench.results.record import figure

RANGES = ("prefill", "forward", "lm_head", "attention", "cache")
SAMPLING_OPS = ("aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax", "aten::argmax",
                "aten::topk", "aten::sort", "aten::multinomial")  # fmt: skip


_PREFILL = {"on": False}  # inside a prompt's forward, whose ranges are counted apart from the steps'


def _ranged(name: str, function):
    def wrapped(*args, **kwargs):
        with record_function(f"prefill {name}" if _PREFILL["on"] else name):
            return function(*args, **kwargs)

    return wrapped


def _body(function):
    def wrapped(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or ids.shape[1] == 1:
            with record_function("forward"):
                return function(*args, **kwargs)
        _PREFILL["on"] = True
        try:
            with record_function("prefill"):
                return function(*args, **kwargs)
        finally:
            _PREFILL["on"] = False

    return wrapped


@contextmanager
def named_ranges(models):
    """Ranges around each model's body and LM head, the attention functions and the cache update."""
    from transformers.cache_utils import DynamicLayer
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    saved_update = DynamicLayer.update
    from specbench.models.row_invariant import ROWWISE_ATTENTION  # registers it

    saved_attention = {name: ALL_ATTENTION_FUNCTIONS[name] for name in ("sdpa", ROWWISE_ATTENTION)}
    DynamicLayer.update = _ranged("cache", saved_update)
    for name, function in saved_attention.items():
        ALL_ATTENTION_FUNCTIONS[name] = _ranged("attention", function)
    for model in models:
        model.model.forward = _body(model.model.forward)
        model.lm_head.forward = _ranged("lm_head", model.lm_head.forward)
    try:
        yield
    finally:
        DynamicLayer.update = saved_update
        for name in saved_attention:
            del ALL_ATTENTION_FUNCTIONS[name]  # the local override: the registered function shows again
        for model in models:
            del model.model.forward, model.lm_head.forward


def breakdown(decode, prompts: list[list[int]]) -> dict[str, float]:
    """ms per generated token of each part, ``decode(ids) -> number of new tokens`` run under the profiler;
    the prompts' forwards (more than one input token) are left out, the rest is the decoding steps."""
    decode(prompts[0][:32])  # warm-up
    with profile() as trace:
        begin, tokens = time.perf_counter(), sum(decode(ids) for ids in prompts)
        wall = time.perf_counter() - begin
    totals = {event.key: event for event in trace.key_averages()}
    ms = {name: totals[name].cpu_time_total / 1000 if name in totals else 0.0 for name in RANGES}
    sampling = sum(totals[op].self_cpu_time_total for op in SAMPLING_OPS if op in totals) / 1000
    forward = ms["forward"] + ms["lm_head"]
    step = 1000 * wall - ms["prefill"]
    parts = {"forward": forward, "attention": ms["attention"], "cache": ms["cache"], "sampling": sampling,
             "outside": step - forward - sampling, "step": step}  # fmt: skip
    return {name: value / max(tokens, 1) for name, value in parts.items()}


def rows_for(dtype: str, questions: list[dict], max_new_tokens: int) -> list[dict]:
    from specbench.decoding import GenerationSettings, SpeculativeEngine

    verifier, eos, pad, vocab = embedded_verifier("cpu", dtype)
    hf = plain_transformers_copy(verifier.model.dtype)
    settings = GenerationSettings(max_new_tokens=max_new_tokens)
    engine = SpeculativeEngine(verifier.model, None, settings=settings, vocab_size=vocab, eos_token_ids=eos,
                               pad_token_id=pad)  # fmt: skip
    prompts = [first_turn_ids(verifier.tokenizer, q) for q in questions]

    def hf_generate(ids: list[int]) -> int:
        x = torch.tensor([ids])
        out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                          max_new_tokens=max_new_tokens, eos_token_id=list(eos), pad_token_id=pad)
        return out.shape[1] - len(ids)

    def specbench_ar(ids: list[int]) -> int:
        return len(engine.generate([ids])[0].output_ids)

    rows = []
    with named_ranges([hf, verifier.model]):
        for name, decode in (("hf-generate", hf_generate), ("specbench-ar", specbench_ar)):
            parts = breakdown(decode, prompts)
            figures = {f"{part}_ms": figure(value, unit="ms") for part, value in parts.items()}
            rows.append({"setup": f"{dtype}: {name}", "figures": figures, "identical_outputs": None})
    return rows


def main(argv=None) -> int:
    parser = benchmark_parser(__doc__, per_category=1, max_new_tokens=48, threads=1)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma list, each run in turn")
    parser.add_argument("--notes", default="", help="appended to the record's notes (e.g. machine load)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    questions = heldout_questions(args.per_category)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    rows = [row for dtype in dtypes for row in rows_for(dtype, questions, args.max_new_tokens)]
    for row in rows:
        cells = "  ".join(f"{key} {value['value']:.2f}" for key, value in row["figures"].items())
        print(f"{row['setup']:<26} {cells}")
    notes = f"ms per generated token under torch.profiler, greedy, {args.max_new_tokens} new tokens "
    notes += args.notes
    record_run(args, "step_profile", rows, "spec_bench heldout (first turn)", len(questions),
               dtype=",".join(dtypes), threads=args.threads,
               doc="docs/benchmarks.md#where-a-step-goes", notes=notes.strip())  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
