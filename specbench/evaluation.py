"""Run a decoding engine over prompts and measure it against autoregressive decoding (usable without
Hydra)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specbench.decoding.cost import CostProfile
from specbench.decoding.cost_aware import CostAwareSchedule
from specbench.decoding.cost_cache import MEASURE, machine_profile
from specbench.decoding.engine import GenerationSettings, RoundRecord, SampleResult, SpeculativeEngine
from specbench.decoding.metrics import summarize
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.protocol import Drafter
from specbench.decoding.rules import VerificationRule
from specbench.decoding.schedules import DraftSchedule
from specbench.drafters.sd2 import SD2Drafter
from specbench.drafters.steering import SteeredDrafter
from specbench.models.loading import LoadedModel, pair_vocab_size

WARMUP_TOKENS = 4
PROFILE_CONTEXT = 256  # cached tokens before the timed verifier forwards of a cost profile

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
    drafter: LoadedModel | Drafter | None,
    rule: VerificationRule | None,
    schedule: DraftSchedule,
    settings: GenerationSettings,
    baseline: bool = True,
    steering: SteeredDrafter | None = None,
    profile: CostProfile | str | None = None,
) -> tuple[SpeculativeEngine, SpeculativeEngine | None]:
    """The method's engine and, if ``baseline`` and there is a drafter, an autoregressive engine of the
    verifier.

    ``drafter``: a loaded model (decoded by a :class:`ModelDrafter`, or by an :class:`SD2Drafter` when
    ``steering`` is given), any :class:`Drafter`, or None. Both engines use the shared vocabulary (checked
    by :func:`shared_vocab_size`), the same EOS / pad ids and settings. Without a drafter the method is
    itself autoregressive decoding and no baseline engine is built. ``schedule.name == "cost_aware"``
    becomes a :class:`CostAwareSchedule` priced by ``profile`` (None: this machine's cached profile, measured
    on first use; ``"measure"``: measured now and cached; :mod:`specbench.decoding.cost_cache`).
    """
    tokenizer = verifier.tokenizer
    vocab = pair_vocab_size(verifier, drafter)
    drafter_impl: Drafter | None = drafter if isinstance(drafter, Drafter) else None
    if isinstance(drafter, LoadedModel):
        width = drafter.spec.tree_width
        if steering is not None:
            drafter_impl = SD2Drafter(steering, vocab, drafter.name, drafter.draft_vocab, tree_width=width)
        else:
            drafter_impl = ModelDrafter(
                drafter.model, vocab, drafter.name, drafter.draft_vocab, tree_width=width
            )
    elif steering is not None:
        raise ValueError("SD² steering needs a model drafter")
    eos = eos_token_ids(verifier.model, tokenizer)
    common = {
        "schedule": schedule,
        "settings": settings,
        "vocab_size": vocab,
        "eos_token_ids": eos,
        "pad_token_id": pad_token_id(tokenizer, eos),
    }
    if schedule.name == "cost_aware" and drafter_impl is not None and not isinstance(profile, CostProfile):
        n, refresh = schedule.max_gamma + 1, profile == MEASURE
        profile = machine_profile(measure_profile, verifier, drafter_impl, vocab, n, PROFILE_CONTEXT, refresh)
        common["schedule"] = CostAwareSchedule(profile, schedule.max_gamma, schedule.learn_costs)
    engine = SpeculativeEngine(verifier.model, drafter_impl, rule, **common)
    reference = SpeculativeEngine(verifier.model, None, None, **common) if baseline and drafter_impl else None
    return engine, reference


def measure_profile(
    verifier: LoadedModel,
    drafter: Drafter | None,
    vocab_size: int,
    max_n: int,
    context_len: int = PROFILE_CONTEXT,
    repeats: int = 7,
    prompts: Sequence[list[int]] | None = None,
) -> CostProfile:
    """Measure v(n) for n = 1..max_n and the drafter's time per drafted token on this machine.

    The drafter is timed in real decoding (constant γ = max_n − 1, 32 new tokens) of ``prompts`` (default:
    the first two bundled demo prompts, so lookup drafters find something to propose). ``meta`` records its
    draft vocabulary size (None: the full vocabulary).
    """
    import torch

    from specbench.decoding.cost import measure_verify_ms

    verify_ms = measure_verify_ms(verifier.model, vocab_size, max_n, context_len=context_len, repeats=repeats)
    draft_ms, drafted = 0.0, 0
    if drafter is not None:
        if prompts is None:
            from specbench.data.dataset_config import dataset_settings
            from specbench.data.datasets import encode_sample, load_dataset_prompts

            demo = load_dataset_prompts(dataset_settings({"name": "demo"}))[:2]
            prompts = [encode_sample(verifier.tokenizer, p, "auto")[0] for p in demo]
        eos = eos_token_ids(verifier.model, verifier.tokenizer)
        engine = SpeculativeEngine(
            verifier.model, drafter, None, DraftSchedule("constant", max(max_n - 1, 1)),
            GenerationSettings(max_new_tokens=32), vocab_size, eos, pad_token_id(verifier.tokenizer, eos),
        )  # fmt: skip
        with forgetting(drafter):
            warm_up(engine, list(prompts[0]))
            rounds = [r for p in prompts for r in engine.generate([list(p)])[0].rounds if r.drafted > 0]
        drafted = sum(r.drafted for r in rounds)
        draft_ms = 1000.0 * sum(r.draft_time for r in rounds) / drafted if drafted else 0.0
    return CostProfile(
        verify_ms, draft_ms, batch_size=1, context_len=context_len, device=str(verifier.model.device),
        dtype=str(verifier.model.dtype).removeprefix("torch."), verifier=verifier.name,
        drafter=getattr(drafter, "name", "none") if drafter is not None else "none",
        threads=torch.get_num_threads(), meta={
            "drafted_tokens_timed": drafted, "repeats": repeats,
            "draft_vocab_size": drafter.describe().get("draft_vocab_size") if drafter is not None else None,
        },
    )  # fmt: skip


def batched(items: Sequence, size: int) -> Iterator[list[int]]:
    """Index lists of consecutive batches of at most ``size`` items."""
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    for start in range(0, len(items), size):
        yield list(range(start, min(start + size, len(items))))


@contextmanager
def forgetting(drafter: Drafter | None) -> Iterator[None]:
    """Generations inside the block leave no trace in what ``drafter`` remembers across requests (the
    suffix drafter's global tree): warm-ups and timing runs must not show it answers it will be asked for."""
    memory = drafter.memory_state() if drafter is not None else None
    try:
        yield
    finally:
        if drafter is not None:
            drafter.restore_memory(memory)


@contextmanager
def _short_generation(engine: SpeculativeEngine, max_new_tokens: int) -> Iterator[None]:
    saved = engine.settings
    engine.settings = dataclasses.replace(saved, max_new_tokens=min(max_new_tokens, saved.max_new_tokens))
    try:
        yield
    finally:
        engine.settings = saved


def warm_up(engine: SpeculativeEngine, prompt: list[int], max_new_tokens: int = WARMUP_TOKENS) -> None:
    """One short generation (kernels, allocator, caches), then reseed so the measured run is reproducible.
    A drafter that remembers requests (the suffix drafter's global tree) forgets this one: it must not
    know the start of the answer to the first prompt before decoding it."""
    with forgetting(engine.drafter), _short_generation(engine, max_new_tokens):
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


def shard_indices(count: int, num_shards: int = 1, shard_id: int = 0) -> list[int]:
    """Positions ``i`` in ``range(count)`` with ``i % num_shards == shard_id``.

    Deterministic, every position in exactly one shard, and strided, so shards of a category-sorted
    prompt set (Spec-Bench) get a similar mix and similar lengths.
    """
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        raise ValueError(f"need num_shards >= 1 and 0 <= shard_id < num_shards, got {shard_id}/{num_shards}")
    return list(range(shard_id, count, num_shards))


# --- summary metrics from saved samples (samples.jsonl), so a resumed run recomputes them exactly ---

SAVED_FIELDS = ("output_ids", "rounds", "round_stats", "wall_time_s", "batch_rows")


def saved_timing(result: SampleResult, batch_rows: int) -> dict:
    """The per-sample fields :func:`summarize_samples` needs besides ``output_ids`` and ``rounds``.

    ``wall_time_s`` is the decoding wall time of the sample's batch and ``batch_rows`` its size, so
    Σ wall_time_s / batch_rows over the samples is the run's decoding time; ``round_stats`` holds, per
    round, what :class:`RoundRecord` has beyond ``[drafted, accepted]``.
    """
    stats = {
        "emitted": [r.emitted for r in result.rounds],
        "draft_forwards": [r.draft_forwards for r in result.rounds],
        "draft_time": [r.draft_time for r in result.rounds],
        "verify_time": [r.verify_time for r in result.rounds],
    }
    if any(r.mean_draft_weight is not None for r in result.rounds):
        stats["draft_weight"] = [r.mean_draft_weight for r in result.rounds]
    if any(r.draft_weights is not None for r in result.rounds):
        stats["draft_weights"] = [r.draft_weights for r in result.rounds]  # per drafted position
    if all(r.verifier_logp is not None for r in result.rounds):
        stats["verifier_logp"] = [r.verifier_logp for r in result.rounds]
    return {"wall_time_s": result.wall_time, "batch_rows": batch_rows, "round_stats": stats}


def result_from_row(row: dict) -> SampleResult:
    """Rebuild the :class:`SampleResult` of a saved sample (prompt ids are not saved)."""
    missing = [key for key in SAVED_FIELDS if key not in row]
    if missing:
        raise ValueError(f"sample {row.get('id')!r} lacks {missing} (written by an older specbench?)")
    stats = row["round_stats"]
    weights = stats.get("draft_weight") or [None] * len(row["rounds"])
    position_weights = stats.get("draft_weights") or [None] * len(row["rounds"])
    logps = stats.get("verifier_logp") or [None] * len(row["rounds"])  # absent in rows of older runs
    rounds = [
        RoundRecord(
            drafted=drafted,
            accepted=accepted,
            emitted=emitted,
            draft_time=draft_time,
            verify_time=verify_time,
            draft_forwards=forwards,
            mean_draft_weight=weight,
            draft_weights=position_weight,
            verifier_logp=logp,
        )
        for (drafted, accepted), emitted, forwards, draft_time, verify_time, weight, position_weight, logp
        in zip(
            row["rounds"],
            stats["emitted"],
            stats["draft_forwards"],
            stats["draft_time"],
            stats["verify_time"],
            weights,
            position_weights,
            logps,
        )
    ]
    return SampleResult(
        prompt_ids=[],
        output_ids=list(row["output_ids"]),
        rounds=rounds,
        wall_time=row["wall_time_s"],
        finished_by_eos=bool(row.get("finished_by_eos", False)),
    )


def summarize_samples(
    rows: Sequence[dict], greedy: bool, autoregressive: bool = False, profile: CostProfile | None = None
) -> dict:
    """:func:`compare`'s metrics recomputed from saved samples (those of several runs into one dir).

    The decoding time is Σ ``wall_time_s / batch_rows``; with baseline fields on every row
    (``baseline_new_tokens``, ``baseline_wall_time_s``) the speedup is against the baseline's
    tokens/s, for an ``autoregressive`` method against itself (1.0). tokens/s of a resumed run thus
    mixes the timings of both processes, each sample counted once.
    """
    if not rows:
        raise ValueError("no samples to summarize")
    results = [result_from_row(row) for row in rows]
    wall = sum(row["wall_time_s"] / row["batch_rows"] for row in rows)
    has_baseline = all("baseline_wall_time_s" in row and "baseline_new_tokens" in row for row in rows)
    reference = None
    if has_baseline:
        base_tokens = sum(row["baseline_new_tokens"] for row in rows)
        base_wall = sum(row["baseline_wall_time_s"] / row["batch_rows"] for row in rows)
        reference = base_tokens / base_wall if base_wall > 0 else None
    elif autoregressive:
        tokens = sum(len(r.output_ids) for r in results)
        reference = tokens / wall if wall > 0 else None
    metrics = summarize(results, wall, baseline_tokens_per_s=reference, profile=profile)
    if has_baseline:
        metrics["baseline_new_tokens"] = base_tokens
        metrics["baseline_wall_time_s"] = base_wall
        if greedy and all("matches_baseline" in row for row in rows):
            metrics["baseline_match_rate"] = sum(bool(row["matches_baseline"]) for row in rows) / len(rows)
    return metrics
