"""Run a decoding engine over prompts and measure it against autoregressive decoding (usable without Hydra)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specbench.decoding.engine import GenerationSettings, SampleResult, SpeculativeEngine
from specbench.decoding.metrics import summarize
from specbench.decoding.rules import VerificationRule
from specbench.decoding.schedules import DraftSchedule
from specbench.models.loading import LoadedModel
from specbench.models.pair import shared_vocab_size

WARMUP_TOKENS = 4

# Called after each batch with (indices of its prompts, method results, baseline results or None).
BatchCallback = Callable[[list[int], list[SampleResult], "list[SampleResult] | None"], None]


@dataclass
class RunResult:
    """Per-sample results of one engine over a prompt set and its decoding wall time (sum over batches)."""

    results: list[SampleResult]
    wall_time: float

    @property
    def new_tokens(self) -> int:
        return sum(len(r.output_ids) for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0


@dataclass
class Comparison:
    """A method run, the autoregressive baseline run (if any) and the flat metrics of the method."""

    method: RunResult
    baseline: RunResult | None
    metrics: dict


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Union of the tokenizer's EOS id and the model generation config's EOS id(s), sorted."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos is not None:
        ids.update(int(t) for t in config_eos)
    return sorted(ids)


def pad_token_id(tokenizer: PreTrainedTokenizerBase, eos_ids: Sequence[int]) -> int:
    """The tokenizer's pad id, else the first EOS id, else 0."""
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return int(eos_ids[0]) if eos_ids else 0


def build_engines(
    verifier: LoadedModel,
    drafter: LoadedModel | None,
    rule: VerificationRule | None,
    schedule: DraftSchedule,
    settings: GenerationSettings,
    baseline: bool = True,
) -> tuple[SpeculativeEngine, SpeculativeEngine | None]:
    """The method's engine and, if ``baseline`` and there is a drafter, an autoregressive engine of the verifier.

    Both use the shared vocabulary (checked by :func:`shared_vocab_size`), the same EOS / pad ids and settings.
    Without a drafter the method is itself autoregressive decoding and no baseline engine is built.
    """
    tokenizer = verifier.tokenizer
    if drafter is not None:
        vocab = shared_vocab_size(verifier.model, drafter.model, tokenizer, drafter.tokenizer)
    else:
        vocab = min(len(tokenizer), verifier.model.get_output_embeddings().weight.shape[0])
    eos = eos_token_ids(verifier.model, tokenizer)
    common = {
        "schedule": schedule,
        "settings": settings,
        "vocab_size": vocab,
        "eos_token_ids": eos,
        "pad_token_id": pad_token_id(tokenizer, eos),
    }
    engine = SpeculativeEngine(verifier.model, drafter.model if drafter else None, rule, **common)
    reference = SpeculativeEngine(verifier.model, None, None, **common) if baseline and drafter else None
    return engine, reference


def batched(items: Sequence, size: int) -> Iterator[list[int]]:
    """Index lists of consecutive batches of at most ``size`` items."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    for start in range(0, len(items), size):
        yield list(range(start, min(start + size, len(items))))


@contextmanager
def _short_generation(engine: SpeculativeEngine, max_new_tokens: int) -> Iterator[None]:
    saved = engine.settings
    engine.settings = dataclasses.replace(saved, max_new_tokens=min(max_new_tokens, saved.max_new_tokens))
    try:
        yield
    finally:
        engine.settings = saved


def warm_up(engine: SpeculativeEngine, prompt: list[int], max_new_tokens: int = WARMUP_TOKENS) -> None:
    """One short generation (kernels, allocator, caches), then reseed so the measured run is reproducible."""
    with _short_generation(engine, max_new_tokens):
        engine.generate([prompt])
    engine.reseed(engine.settings.seed)


def evaluate(
    engine: SpeculativeEngine, prompt_ids: Sequence[list[int]], batch_size: int = 1, progress: bool = True
) -> RunResult:
    """Decode every prompt in batches; wall time is the sum of the batches' decoding times."""
    results: list[SampleResult] = []
    wall = 0.0
    for indices in tqdm(
        list(batched(prompt_ids, batch_size)), desc="decode", unit="batch", disable=not progress
    ):
        batch = engine.generate([prompt_ids[i] for i in indices])
        wall += batch[0].wall_time
        results.extend(batch)
    return RunResult(results, wall)


def compare(
    engine: SpeculativeEngine,
    prompt_ids: Sequence[list[int]],
    baseline: SpeculativeEngine | None = None,
    batch_size: int = 1,
    warmup: bool = True,
    progress: bool = True,
    on_batch: BatchCallback | None = None,
) -> Comparison:
    """Run ``engine`` and, if given, the autoregressive ``baseline`` over the same prompts in this process.

    The two alternate batch by batch (and which goes first alternates), so slow drifts of the machine hit
    both alike; each is warmed up first. Metrics are :func:`summarize`'s, with ``speedup`` against the
    baseline's tokens/s; an engine without a drafter is autoregressive decoding itself (speedup 1.0).
    """
    if not prompt_ids:
        raise ValueError("no prompts to decode")
    engines = [engine] + ([baseline] if baseline is not None else [])
    if warmup:
        for each in engines:
            warm_up(each, prompt_ids[0])
    runs = [RunResult([], 0.0) for _ in engines]
    batches = list(batched(prompt_ids, batch_size))
    for number, indices in enumerate(tqdm(batches, desc="decode", unit="batch", disable=not progress)):
        prompts = [prompt_ids[i] for i in indices]
        order = range(len(engines)) if number % 2 == 0 else reversed(range(len(engines)))
        outputs: dict[int, list[SampleResult]] = {}
        for which in order:
            outputs[which] = engines[which].generate(prompts)
            runs[which].results.extend(outputs[which])
            runs[which].wall_time += outputs[which][0].wall_time
        if on_batch is not None:
            on_batch(indices, outputs[0], outputs.get(1))
    method_run = runs[0]
    baseline_run = runs[1] if baseline is not None else None
    if baseline_run is not None:
        reference_speed = baseline_run.tokens_per_s
    elif engine.drafter is None:
        reference_speed = method_run.tokens_per_s
    else:
        reference_speed = None
    metrics = summarize(method_run.results, method_run.wall_time, baseline_tokens_per_s=reference_speed)
    if baseline_run is not None:
        metrics.update(_baseline_metrics(method_run, baseline_run, engine.warping.greedy))
    return Comparison(method_run, baseline_run, metrics)


def _baseline_metrics(method: RunResult, baseline: RunResult, greedy: bool) -> dict:
    stats = summarize(baseline.results, baseline.wall_time)
    metrics = {
        "baseline_new_tokens": stats["new_tokens"],
        "baseline_wall_time_s": stats["wall_time_s"],
    }
    if greedy:
        same = sum(m.output_ids == b.output_ids for m, b in zip(method.results, baseline.results))
        metrics["baseline_match_rate"] = same / len(method.results)
    return metrics
