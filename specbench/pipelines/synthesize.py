"""The ``task=synth`` pipeline (methods.md §6): sample training rows from the verifier, resumably.

:func:`synthesize` samples from the verifier, per prompt of a prompt set (the chat template applied as
in eval), up to ``target_len`` tokens in all, through a :class:`ResponseBackend` (the HF engine, or a
serving engine), and writes

- ``<out>/rows-shard{i}-of-{n}.jsonl``: one row per prompt (:mod:`specbench.data.synth_rows`), appended
  and flushed after every batch (a crashed or requeued job resumes from it), next to
  ``rows-shard{i}-of-{n}.settings.json`` (what made the rows, :func:`run_identity`; a rerun with other
  settings stops instead of mixing them, :func:`check_resumable`);
- ``<out>/dataset`` (``<out>/dataset-shard{i}-of-{n}`` when ``num_shards`` > 1): the saved DatasetDict
  and its metadata (:mod:`specbench.data.synth_dataset`, read back with
  :func:`~specbench.data.synth_dataset.load_synthetic`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from specbench.data.dataset_config import DatasetSettings
from specbench.data.datasets import encode_sample
from specbench.data.prompts import Prompt
from specbench.data.synth_archive import archive_path, write_archive
from specbench.data.synth_dataset import dataset_path, save_dataset
from specbench.data.synth_rows import (
    FORMAT,
    FORMAT_VERSION,
    _Packed,
    _write_json,
    make_row,
    rows_path,
    settings_path,
    validation_ids,
)
from specbench.pipelines.synth_plan import (
    SynthSettings,
    batch_seed,
    job_id,
    plan_batches,
    run_identity,
)
from specbench.pipelines.synth_resume import prior_rows

if TYPE_CHECKING:  # imported lazily: the engine is slow to import
    from specbench.models.loading import LoadedModel

# Called after each batch is written, with the source indices of its new rows and the rows.
SynthCallback = Callable[[list[int], list[dict]], None]


class ResponseBackend(Protocol):
    """What samples the responses of one batch for :func:`synthesize`: the HF engine by default
    (:class:`EngineBackend`), or a serving engine (``specbench.serving.openai_backend``).

    ``generate`` gets the prompts (token ids, chat template applied), each row's budget of new tokens and
    each row's seed (:func:`batch_seed` of its job id), and returns every row's generated ids (EOS
    included when the row ended there) and the batch's wall time in seconds.
    """

    def generate(
        self, prompts: list[list[int]], budgets: list[int], seeds: list[int]
    ) -> tuple[list[list[int]], float]: ...

    def describe(self) -> dict[str, Any]: ...


class EngineBackend:
    """specbench's own decoding loop (autoregressive, the verifier alone): one seed per batch, the first
    row's (so a batch draws what it drew before backends existed), and one budget, the largest."""

    def __init__(self, verifier: LoadedModel, settings: SynthSettings):
        from specbench.decoding.engine import GenerationSettings
        from specbench.decoding.schedules import DraftSchedule
        from specbench.evaluation import build_engines

        self.engine, _ = build_engines(
            verifier,
            None,
            None,
            DraftSchedule(),
            GenerationSettings(
                max_new_tokens=settings.target_len - 1,
                temperature=settings.temperature,
                top_k=settings.top_k,
                top_p=settings.top_p,
                seed=settings.seed,
            ),
            baseline=False,
        )

    def generate(
        self, prompts: list[list[int]], budgets: list[int], seeds: list[int]
    ) -> tuple[list[list[int]], float]:
        engine = self.engine
        engine.settings = dataclasses.replace(engine.settings, max_new_tokens=max(budgets))
        engine.reseed(seeds[0])
        results = engine.generate(prompts)
        return [r.output_ids for r in results], results[0].wall_time

    def describe(self) -> dict[str, Any]:
        return {"backend": "hf"}


@dataclass
class SynthResult:
    """What :func:`synthesize` made: the saved dataset, its metadata and this process's numbers."""

    dataset_dir: Path
    metadata: dict[str, Any]
    new_rows: int = 0
    new_generated_tokens: int = 0
    wall_time_s: float = 0.0  # decoding time of this process

    @property
    def tokens_per_s(self) -> float:
        return self.new_generated_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def summary(self) -> dict[str, float | int]:
        """Flat numbers for MLflow and Hydra sweeps."""
        m = self.metadata
        return {
            "rows": m["rows"],
            "train_rows": m["train_rows"],
            "validation_rows": m["validation_rows"],
            "tokens": m["tokens"],
            "generated_tokens": m["generated_tokens"],
            "finished_by_eos": m["finished_by_eos"],
            "skipped": m["skipped_prompts"],
            "resumed_rows": m["rows"] - self.new_rows,
            "new_rows": self.new_rows,
            "tokens_per_s": self.tokens_per_s,
            "wall_time_s": self.wall_time_s,
        }


# -- batches -----------------------------------------------------------------------------------------


# -- identity of a run -------------------------------------------------------------------------------


# -- sampling ----------------------------------------------------------------------------------------


def synthesize(
    verifier: LoadedModel,
    prompts: Sequence[Prompt],
    settings: SynthSettings,
    out_dir: str | Path,
    *,
    dataset: DatasetSettings | None = None,
    prompt_format: str = "auto",
    resume: bool = True,
    progress: bool = True,
    on_batch: SynthCallback | None = None,
    extra_metadata: Mapping[str, Any] | None = None,
    backend: ResponseBackend | None = None,
    compress: bool = False,
) -> SynthResult:
    """Sample this shard's rows from ``verifier`` into ``out_dir`` and save them as a DatasetDict.

    Prompts ``i`` with ``i % num_shards == shard_id`` are encoded like eval does
    (:func:`specbench.data.datasets.encode_sample`); those longer than ``max_prompt_len`` are skipped
    and counted. Batches of similar length share a budget of ``target_len`` minus their shortest prompt
    and each row is cut to ``target_len`` tokens; every batch is sampled with its own seed
    (:func:`batch_seed`) and its rows are flushed to the rows file before the next one. With ``resume``,
    rows already in the file (same settings, else SynthDataError) are kept and only missing prompts run.
    ``backend`` generates the responses (default: :class:`EngineBackend`, the verifier in this process).
    With ``compress`` a finished shard's rows file becomes a gzip archive
    (:mod:`specbench.data.synth_archive`); a shard whose archive exists is complete: its rows are read
    from it and nothing is sampled.
    """
    from specbench.evaluation import eos_token_ids, pad_token_id, shard_indices
    from specbench.models.pair import tokenizer_hash

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = verifier.tokenizer
    identity = run_identity(verifier.spec, settings, dataset, tokenizer_hash(tokenizer), verifier.name)
    rows_file = rows_path(out, settings.shard_id, settings.num_shards)
    record_file = settings_path(out, settings.shard_id, settings.num_shards)

    selected = shard_indices(len(prompts), settings.num_shards, settings.shard_id)
    encoded, formats, skipped = _encode_shard(
        tokenizer, prompts, selected, settings.max_prompt_len, prompt_format
    )

    responses = settings.responses_per_prompt
    jobs = {job_id(i, k, responses): (i, k) for i in encoded for k in range(responses)}
    done = prior_rows(out, settings, identity, encoded, jobs, resume)  # by job id
    _write_json(record_file, {"format": FORMAT, "version": FORMAT_VERSION, "identity": identity})

    backend = backend or EngineBackend(verifier, settings)
    eos = eos_token_ids(verifier.model, tokenizer)
    batches = plan_batches({j: len(encoded[i]) for j, (i, _) in jobs.items()}, settings.batch_size)
    todo = [b for b in batches if any(i not in done for i in b)]
    if done:
        missing = sum(i not in done for b in todo for i in b)
        print(f"resuming {rows_file}: {len(done)} rows done, {missing} to sample")
    sampled = _Sampling(backend, settings, prompts, encoded, jobs, eos, done)
    sampled.run(todo, rows_file, on_batch, progress)

    rows = [done[i] for i in sorted(done)]
    metadata = _metadata(
        verifier, settings, dataset, identity, rows, skipped, selected, formats, len(prompts), eos,
        pad_token_id(tokenizer, eos),
    )
    metadata["backend"] = backend.describe()
    metadata["throughput"] = sampled.throughput()
    metadata.update(dict(extra_metadata or {}))
    target = dataset_path(out, settings.shard_id, settings.num_shards)
    save_dataset(rows, metadata, target)
    if compress and rows_file.exists():
        write_archive(rows_file, archive_path(out, settings.shard_id, settings.num_shards), metadata)
    return SynthResult(
        target, metadata, new_rows=sampled.new_rows, new_generated_tokens=sampled.new_tokens,
        wall_time_s=sampled.wall,
    )  # fmt: skip


def _encode_shard(
    tokenizer, prompts: Sequence[Prompt], selected: Sequence[int], max_prompt_len: int, prompt_format: str
) -> tuple[dict[int, list[int]], set[str], list[int]]:
    """The shard's prompts encoded like eval does, by index; the formats used; the indices too long to
    keep."""
    encoded: dict[int, list[int]] = {}
    formats: set[str] = set()
    skipped: list[int] = []
    for index in selected:
        ids, used = encode_sample(tokenizer, prompts[index], prompt_format)
        formats.add(used)
        if 1 <= len(ids) <= max_prompt_len:
            encoded[index] = ids
        else:
            skipped.append(index)
    return encoded, formats, skipped


class _Sampling:
    """Samples batches of jobs with ``backend`` and appends their rows to the rows file, adding them to
    ``done``; counts the new rows, generated tokens and generation seconds."""

    def __init__(
        self, backend, settings: SynthSettings, prompts, encoded, jobs, eos, done: dict[int, _Packed]
    ):
        self.backend, self.settings, self.prompts, self.encoded = backend, settings, prompts, encoded
        self.jobs, self.eos, self.done = jobs, eos, done
        self.new_rows, self.new_tokens, self.wall = 0, 0, 0.0

    def throughput(self) -> dict[str, Any]:
        """This process's sampling numbers, for the metadata."""
        rate = round(self.new_tokens / self.wall, 2) if self.wall > 0 else None
        return {
            "new_rows": self.new_rows, "new_generated_tokens": self.new_tokens,
            "decoding_s": round(self.wall, 3), "tokens_per_s": rate, "batch_size": self.settings.batch_size,
        }  # fmt: skip

    def run(
        self, todo: Sequence[Sequence[int]], rows_file: Path, on_batch: SynthCallback | None, progress: bool
    ):
        """Sample every batch of ``todo`` into ``rows_file`` (appended), with a progress bar."""
        from tqdm.auto import tqdm

        if not todo:
            return
        total = sum(i not in self.done for b in todo for i in b)
        bar = tqdm(total=total, desc="synth", unit="row", disable=not progress)
        with open(rows_file, "a", encoding="utf-8") as handle:
            for batch in todo:
                written = self.batch(batch, handle)
                bar.update(len(written))
                bar.set_postfix_str(f"{self.new_tokens / self.wall if self.wall > 0 else 0.0:.1f} tok/s")
                if on_batch is not None:
                    on_batch([r["source_index"] for r in written], written)
        bar.close()

    def batch(self, batch: Sequence[int], handle) -> list[dict]:
        """Sample one batch of job ids, write its rows (flushed to disk) and return them."""
        settings, encoded, jobs = self.settings, self.encoded, self.jobs
        budgets = [settings.target_len - len(encoded[jobs[j][0]]) for j in batch]
        if settings.max_new_tokens is not None:
            budgets = [min(b, settings.max_new_tokens) for b in budgets]
        outputs, seconds = self.backend.generate(
            [encoded[jobs[j][0]] for j in batch], budgets, [batch_seed(settings.seed, j) for j in batch]
        )
        self.wall += seconds
        written = []
        for job, output_ids in zip(batch, outputs):
            if job in self.done:
                continue  # a batch cut by a crash: its finished rows are kept as they were
            index, response = jobs[job]
            row = make_row(
                encoded[index], output_ids, settings.target_len, self.eos, index, self.prompts[index].id,
                response,
            )  # fmt: skip
            handle.write(json.dumps(row) + "\n")
            self.done[job] = _Packed.of(row)
            written.append(row)
            self.new_tokens += len(row["input_ids"]) - row["prompt_len"]
        handle.flush()
        os.fsync(handle.fileno())
        self.new_rows += len(written)
        return written


def _metadata(
    verifier, settings, dataset, identity, rows, skipped, selected, formats, total, eos, pad_id
) -> dict:
    spec = verifier.spec
    chosen = validation_ids((r.source_id for r in rows), settings.validation_fraction)
    tokens = sum(len(r.ids) for r in rows)
    metadata: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "verifier": verifier.name,
        "verifier_kind": spec.kind,
        "verifier_path": spec.path,
        "verifier_revision": spec.revision,
        "verifier_spec": dataclasses.asdict(spec),
        "tokenizer_hash": identity["tokenizer_hash"],
        "tokenizer_size": len(verifier.tokenizer),
        "eos_token_ids": list(eos),
        "pad_token_id": pad_id,
        "dtype": str(verifier.model.dtype).removeprefix("torch."),
        "device": str(verifier.model.device),
        "seed": settings.seed,
        "sampling": {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p},
        "target_len": settings.target_len,
        "max_prompt_len": settings.max_prompt_len,
        "responses_per_prompt": settings.responses_per_prompt,
        "max_new_tokens": settings.max_new_tokens,
        "batch_size": settings.batch_size,
        "validation_fraction": settings.validation_fraction,
        "prompt_format": formats.pop() if len(formats) == 1 else ("mixed" if formats else "none"),
        "shard_id": settings.shard_id,
        "num_shards": settings.num_shards,
        "prompts_total": total,
        "prompts_in_shard": len(selected),
        "rows": len(rows),
        "train_rows": sum(r.source_id not in chosen for r in rows),
        "validation_rows": sum(r.source_id in chosen for r in rows),
        "tokens": tokens,
        "generated_tokens": tokens - sum(r.prompt_len for r in rows),
        "finished_by_eos": sum(r.finished_by_eos for r in rows),
        "skipped_prompts": len(skipped),
        "skipped_source_indices": skipped,
        "identity": identity,
    }
    if dataset is not None:
        metadata["dataset"] = {**dataclasses.asdict(dataset), **dataset.describe()}
        metadata["source_split"] = {
            "split": dataset.split,
            "subset": dataset.subset,
            "heldout_fraction": dataset.heldout_fraction,
        }
    return metadata
