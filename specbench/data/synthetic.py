"""Synthetic training data (methods.md §6): verifier samples with a loss mask over the generated tokens.

:func:`synthesize` samples from the verifier, per prompt of a prompt set (the chat template applied as
in eval), up to ``target_len`` tokens in all, and writes

- ``<out>/rows-shard{i}-of-{n}.jsonl``: one row per prompt, appended and flushed after every batch (a
  crashed or requeued job resumes from it), next to ``rows-shard{i}-of-{n}.settings.json`` (what made
  the rows; a rerun with other settings stops instead of mixing them);
- ``<out>/dataset`` (``<out>/dataset-shard{i}-of-{n}`` when ``num_shards`` > 1, so the jobs of an array
  may share one output dir): a ``datasets.DatasetDict`` with ``train`` and ``validation`` saved with
  ``save_to_disk``, and its metadata ``specbench_synth.json``.

A row: ``input_ids`` (prompt + generated ids), ``loss_mask`` (0 on the prompt, 1 on generated tokens,
EOS included; nothing is padded), ``prompt_len``, ``source_index`` (position in the whole prompt set),
``source_id`` (the prompt's id, as a string), ``response_index`` (0..``responses_per_prompt``-1: one
prompt may get several sampled responses) and ``finished_by_eos``.

:func:`load_synthetic` reads one or several such outputs (the shards of an array, or several runs of
one verifier) into one ``DatasetDict``, checking that they fit together and that every row is sound.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from specbench.data.datasets import DatasetSettings, encode_sample
from specbench.data.prompts import Prompt

if TYPE_CHECKING:  # imported lazily: ``datasets`` and the engine are slow to import
    from datasets import DatasetDict

    from specbench.models.loading import LoadedModel, ModelSpec

FORMAT = "specbench-synth"
FORMAT_VERSION = 1
METADATA_FILE = "specbench_synth.json"
DATASET_DIR = "dataset"
SPLITS = ("train", "validation")
COLUMNS = ("input_ids", "loss_mask", "prompt_len", "source_index", "source_id", "finished_by_eos")
OPTIONAL_COLUMNS = ("response_index",)  # absent in data written before responses_per_prompt (= 0)
# Identity keys that every part of a merged dataset must share (see :func:`run_identity`).
MERGE_KEYS = (
    "verifier",
    "model.verifier.path",
    "model.verifier.revision",
    "tokenizer_hash",
    "synth.temperature",
    "synth.top_k",
    "synth.top_p",
    "synth.target_len",
)

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


class SynthDataError(ValueError):
    """Synthetic data that is corrupt, does not fit together, or was made with other settings; the
    message names the file or key and the fix."""


@dataclass(frozen=True)
class SynthSettings:
    """The values of the ``synth`` config that decide what is sampled (``output_dir`` and ``resume``
    are arguments of :func:`synthesize`). Bad values raise ValueError naming the ``synth.*`` key."""

    target_len: int = 256
    max_prompt_len: int = 192
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 16
    validation_fraction: float = 0.05
    num_shards: int = 1
    shard_id: int = 0
    responses_per_prompt: int = 1
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.responses_per_prompt < 1:
            raise ValueError(f"synth.responses_per_prompt must be >= 1, got {self.responses_per_prompt}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"synth.max_new_tokens must be >= 1 or null, got {self.max_new_tokens}")
        if self.target_len < 2:
            raise ValueError(
                f"synth.target_len must be >= 2 (prompt + generated tokens), got {self.target_len}"
            )
        if self.max_prompt_len < 1:
            raise ValueError(f"synth.max_prompt_len must be >= 1, got {self.max_prompt_len}")
        if self.max_prompt_len >= self.target_len:
            raise ValueError(
                f"synth.max_prompt_len must be < synth.target_len={self.target_len} (room for at least "
                f"one generated token), got {self.max_prompt_len}"
            )
        if self.temperature < 0:
            raise ValueError(f"synth.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"synth.top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"synth.top_p must be in (0, 1], got {self.top_p}")
        if self.batch_size < 1:
            raise ValueError(f"synth.batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(f"synth.validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if self.num_shards < 1:
            raise ValueError(f"synth.num_shards must be >= 1, got {self.num_shards}")
        if not 0 <= self.shard_id < self.num_shards:
            raise ValueError(
                f"synth.shard_id must be in [0, synth.num_shards={self.num_shards}), got {self.shard_id}"
            )

    @classmethod
    def from_config(cls, node: Any) -> SynthSettings:
        """From a ``synth`` config node or mapping (other keys, e.g. ``output_dir``, are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: node[name] for name in names if name in node})


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


# -- files -------------------------------------------------------------------------------------------


def rows_path(out_dir: str | Path, shard_id: int = 0, num_shards: int = 1) -> Path:
    """``<out>/rows-shard{i}-of-{n}.jsonl``: the rows of one shard, appended batch by batch."""
    return Path(out_dir) / f"rows-shard{shard_id}-of-{num_shards}.jsonl"


def settings_path(out_dir: str | Path, shard_id: int = 0, num_shards: int = 1) -> Path:
    """``<out>/rows-shard{i}-of-{n}.settings.json``: the identity of the run that wrote the rows."""
    return Path(out_dir) / f"rows-shard{shard_id}-of-{num_shards}.settings.json"


def dataset_path(out_dir: str | Path, shard_id: int = 0, num_shards: int = 1) -> Path:
    """``<out>/dataset``, or ``<out>/dataset-shard{i}-of-{n}`` for one shard of several."""
    name = DATASET_DIR if num_shards == 1 else f"{DATASET_DIR}-shard{shard_id}-of-{num_shards}"
    return Path(out_dir) / name


def _write_json(path: Path, payload: Any) -> None:
    """Write atomically (a temp file renamed over ``path``)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_rows(path: str | Path, repair: bool = False) -> list[dict]:
    """The complete rows of a rows file, each checked with :func:`check_row`.

    A last line without its newline is a write torn by a killed job: it is dropped (and with
    ``repair`` cut from the file, so appends start on a clean line). A complete line that is not a
    sound row raises SynthDataError naming file and line.
    """
    return [row for _, row in _iter_rows(Path(path), repair)]


def _iter_rows(path: Path, repair: bool = False, target_len: int | None = None) -> Iterable[tuple[int, dict]]:
    """(line number, row) of a rows file, streamed (see :func:`read_rows`)."""
    complete, torn = 0, 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                torn = len(line)
                break
            complete += len(line)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise SynthDataError(
                    f"{path}:{number} is not valid JSON ({err.msg}); pass synth.resume=false to start over "
                    "(the file is kept aside) or choose another synth.output_dir"
                ) from err
            check_row(row, f"{path}:{number}", target_len)
            yield number, row
    if torn:
        print(f"warning: dropped a torn last line ({torn} bytes) of {path}", file=sys.stderr)
        if repair:
            with open(path, "r+b") as handle:
                handle.truncate(complete)


def check_row(row: Any, where: str, target_len: int | None = None) -> None:
    """Raise SynthDataError (naming ``where``) unless ``row`` is a sound synthetic row."""

    def bad(problem: str) -> SynthDataError:
        return SynthDataError(f"{where}: corrupt synthetic row: {problem}")

    if not isinstance(row, dict):
        raise bad(f"expected an object, got {type(row).__name__}")
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise bad(f"missing fields {missing}")
    ids, mask, prompt_len = row["input_ids"], row["loss_mask"], row["prompt_len"]
    if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
        raise bad("input_ids and loss_mask must be lists of the same length")
    if not isinstance(prompt_len, int) or not 1 <= prompt_len < len(ids):
        raise bad(f"prompt_len={prompt_len!r} leaves no generated token in {len(ids)} tokens")
    if mask != [0] * prompt_len + [1] * (len(ids) - prompt_len):
        raise bad("loss_mask must be 0 on the prompt_len prompt tokens and 1 on every generated token")
    if target_len is not None and len(ids) > target_len:
        raise bad(f"{len(ids)} tokens, more than target_len={target_len}")
    if not all(isinstance(t, int) and t >= 0 for t in ids):
        raise bad("input_ids must be non-negative integers")


# -- rows, splits, batches ---------------------------------------------------------------------------


def _unit_hash(text: str) -> float:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def in_validation(source_id: Any, fraction: float) -> bool:
    """Whether the row of prompt ``source_id`` belongs to the validation split (a stable hash)."""
    return _unit_hash(f"synth-validation:{source_id}") < fraction


def validation_ids(source_ids: Iterable[Any], fraction: float) -> set[str]:
    """The source ids (as strings) whose rows go to the validation split: :func:`in_validation`, and
    with ``fraction`` > 0 and at least 2 ids, at least one id in each split (those nearest the boundary
    move)."""
    if fraction <= 0:
        return set()
    scores = {str(i): _unit_hash(f"synth-validation:{i}") for i in source_ids}
    chosen = {key for key, score in scores.items() if score < fraction}
    if len(scores) >= 2 and not chosen:
        chosen = {min(scores, key=scores.__getitem__)}
    if len(scores) >= 2 and len(chosen) == len(scores):
        chosen.discard(max(scores, key=scores.__getitem__))
    return chosen


def split_rows(rows: Sequence[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    """(train, validation) rows by :func:`validation_ids` of their ``source_id`` (rows of one source id
    stay together)."""
    chosen = validation_ids((r["source_id"] for r in rows), fraction)
    train = [r for r in rows if str(r["source_id"]) not in chosen]
    validation = [r for r in rows if str(r["source_id"]) in chosen]
    return train, validation


def job_id(source_index: int, response_index: int, responses_per_prompt: int) -> int:
    """One number per (prompt, response): the source index itself when each prompt gets one response."""
    return source_index * responses_per_prompt + response_index


def batch_seed(seed: int, first_index: int) -> int:
    """The sampling seed of the batch whose first job (:func:`job_id`) is ``first_index`` (independent of
    what ran before it, so a resumed run draws the same numbers as an uninterrupted one)."""
    digest = hashlib.sha256(f"synth:{seed}:{first_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def plan_batches(lengths: Mapping[int, int], batch_size: int) -> list[list[int]]:
    """Batches of source indices, sorted by prompt length (then index) so a batch shares one budget."""
    order = sorted(lengths, key=lambda i: (lengths[i], i))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def make_row(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    target_len: int,
    eos_token_ids: Iterable[int],
    source_index: int,
    source_id: Any,
    response_index: int = 0,
) -> dict:
    """One row: the prompt and the generated ids cut to ``target_len`` tokens in all."""
    kept = list(output_ids[: max(target_len - len(prompt_ids), 0)])
    eos = set(eos_token_ids)
    return {
        "input_ids": list(prompt_ids) + kept,
        "loss_mask": [0] * len(prompt_ids) + [1] * len(kept),
        "prompt_len": len(prompt_ids),
        "source_index": int(source_index),
        "source_id": str(source_id),
        "response_index": int(response_index),
        "finished_by_eos": bool(kept) and kept[-1] in eos,
    }


@dataclass
class _Packed:
    """A row held in memory while a shard is sampled: int32 ids, the mask is rebuilt from prompt_len."""

    source_index: int
    source_id: str
    prompt_len: int
    finished_by_eos: bool
    ids: array
    response_index: int = 0

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> _Packed:
        return cls(
            int(row["source_index"]),
            str(row["source_id"]),
            int(row["prompt_len"]),
            bool(row["finished_by_eos"]),
            array("i", row["input_ids"]),
            int(row.get("response_index", 0)),
        )

    @property
    def key(self) -> tuple[int, int]:
        return (self.source_index, self.response_index)


# -- identity of a run -------------------------------------------------------------------------------


def run_identity(
    verifier_spec: ModelSpec,
    settings: SynthSettings,
    dataset: DatasetSettings | None = None,
    tokenizer_hash: str | None = None,
    verifier_name: str | None = None,
) -> dict[str, Any]:
    """What decides the rows (flat, keyed by config key): the verifier (spec, name, tokenizer hash),
    the sampling settings, ``target_len`` / ``max_prompt_len`` and the prompt set. A rerun into the
    same output dir must match it. ``tokenizer_hash`` / ``verifier_name`` left None (not known before
    the model loads) are left out, and so not compared.
    """
    identity: dict[str, Any] = {}
    if verifier_name is not None:
        identity["verifier"] = verifier_name
    if tokenizer_hash is not None:
        identity["tokenizer_hash"] = tokenizer_hash
    from specbench.models.sharding import PLACEMENT_FIELDS

    # Where the weights sit (device_map, offloading) does not change the rows: a resume may move them.
    identity.update(
        {
            f"model.verifier.{k}": v
            for k, v in dataclasses.asdict(verifier_spec).items()
            if k not in PLACEMENT_FIELDS
        }
    )
    for key in ("target_len", "max_prompt_len", "temperature", "top_k", "top_p", "seed"):
        identity[f"synth.{key}"] = getattr(settings, key)
    for key, default in (("responses_per_prompt", 1), ("max_new_tokens", None)):
        if getattr(settings, key) != default:  # absent at the default: identities of older runs still match
            identity[f"synth.{key}"] = getattr(settings, key)
    if dataset is not None:
        identity.update({f"dataset.{k}": v for k, v in dataclasses.asdict(dataset).items()})
    return json.loads(json.dumps(identity))  # as it reads back from JSON (tuples → lists)


def _differences(before: Mapping[str, Any], now: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """``key: before -> now`` for the keys that both have, with different values."""
    return [
        f"{key}: {before[key]!r} -> {now[key]!r}"
        for key in keys
        if key in before and key in now and before[key] != now[key]
    ]


def check_resumable(out_dir: str | Path, settings: SynthSettings, identity: Mapping[str, Any]) -> None:
    """Raise SynthDataError if ``out_dir`` holds rows of this shard made with other settings.

    Loads no model; only keys that ``identity`` has are compared (see :func:`run_identity`).
    """
    rows_file = rows_path(out_dir, settings.shard_id, settings.num_shards)
    if not rows_file.exists():
        return
    fix = "pass synth.resume=false to start over (the old rows are kept aside) or choose another synth.output_dir"
    record_file = settings_path(out_dir, settings.shard_id, settings.num_shards)
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
        saved = record["identity"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SynthDataError(
            f"synth.output_dir: {rows_file} exists but its settings file {record_file.name} is missing or "
            f"unreadable ({type(err).__name__}), so the rows cannot be checked against this run; {fix}"
        ) from err
    changed = _differences(saved, identity, sorted(identity))
    if changed:
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise SynthDataError(
            f"synth.output_dir: {rows_file} holds rows made with other settings ({shown}); {fix}"
        )


def _set_aside(paths: Iterable[Path]) -> list[Path]:
    """Rename existing ``paths`` to ``<name>.replaced-<time>`` (never delete rows)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for path in paths:
        if path.exists():
            target = path.with_name(f"{path.name}.replaced-{stamp}-{os.getpid()}")
            path.rename(target)
            moved.append(target)
    return moved


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
) -> SynthResult:
    """Sample this shard's rows from ``verifier`` into ``out_dir`` and save them as a DatasetDict.

    Prompts ``i`` with ``i % num_shards == shard_id`` are encoded like eval does
    (:func:`specbench.data.datasets.encode_sample`); those longer than ``max_prompt_len`` are skipped
    and counted. Batches of similar length share a budget of ``target_len`` minus their shortest prompt
    and each row is cut to ``target_len`` tokens; every batch is sampled with its own seed
    (:func:`batch_seed`) and its rows are flushed to the rows file before the next one. With ``resume``,
    rows already in the file (same settings, else SynthDataError) are kept and only missing prompts run.
    ``backend`` generates the responses (default: :class:`EngineBackend`, the verifier in this process).
    """
    from tqdm.auto import tqdm

    from specbench.evaluation import eos_token_ids, pad_token_id, shard_indices
    from specbench.models.pair import tokenizer_hash

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = verifier.tokenizer
    identity = run_identity(verifier.spec, settings, dataset, tokenizer_hash(tokenizer), verifier.name)
    rows_file = rows_path(out, settings.shard_id, settings.num_shards)
    record_file = settings_path(out, settings.shard_id, settings.num_shards)

    selected = shard_indices(len(prompts), settings.num_shards, settings.shard_id)
    encoded: dict[int, list[int]] = {}
    formats: set[str] = set()
    skipped: list[int] = []
    for index in selected:
        ids, used = encode_sample(tokenizer, prompts[index], prompt_format)
        formats.add(used)
        if 1 <= len(ids) <= settings.max_prompt_len:
            encoded[index] = ids
        else:
            skipped.append(index)

    responses = settings.responses_per_prompt
    jobs = {job_id(i, k, responses): (i, k) for i in encoded for k in range(responses)}
    done: dict[int, _Packed] = {}  # by job id
    if rows_file.exists() and resume:
        check_resumable(out, settings, identity)
        for number, row in _iter_rows(rows_file, repair=True, target_len=settings.target_len):
            index, response = row["source_index"], int(row.get("response_index", 0))
            job = job_id(index, response, responses)
            problem = None
            if job in done:
                problem = "is a duplicate"
            elif index not in encoded or response >= responses:
                problem = "is not a prompt of this shard"
            elif row["input_ids"][: row["prompt_len"]] != encoded[index]:
                problem = "has another prompt than this run encodes"
            if problem:
                raise SynthDataError(
                    f"{rows_file}:{number}: the row of source_index {index} (response {response}) {problem}; pass "
                    "synth.resume=false to start over (the old rows are kept aside) or choose another "
                    "synth.output_dir"
                )
            done[job] = _Packed.of(row)
    elif rows_file.exists() or record_file.exists():
        for moved in _set_aside([rows_file, record_file]):
            print(f"synth.resume=false: kept the earlier file as {moved}", file=sys.stderr)
    _write_json(record_file, {"format": FORMAT, "version": FORMAT_VERSION, "identity": identity})

    backend = backend or EngineBackend(verifier, settings)
    eos = eos_token_ids(verifier.model, tokenizer)
    batches = plan_batches({j: len(encoded[i]) for j, (i, _) in jobs.items()}, settings.batch_size)
    todo = [b for b in batches if any(i not in done for i in b)]
    if done:
        missing = sum(i not in done for b in todo for i in b)
        print(f"resuming {rows_file}: {len(done)} rows done, {missing} to sample")
    new_rows, new_tokens, wall = 0, 0, 0.0
    bar = tqdm(
        total=sum(i not in done for b in todo for i in b), desc="synth", unit="row", disable=not progress
    )
    with open(rows_file, "a", encoding="utf-8") as handle:
        for batch in todo:
            budgets = [settings.target_len - len(encoded[jobs[j][0]]) for j in batch]
            if settings.max_new_tokens is not None:
                budgets = [min(b, settings.max_new_tokens) for b in budgets]
            outputs, seconds = backend.generate(
                [encoded[jobs[j][0]] for j in batch], budgets, [batch_seed(settings.seed, j) for j in batch]
            )
            wall += seconds
            written = []
            for job, output_ids in zip(batch, outputs):
                if job in done:
                    continue  # a batch cut by a crash: its finished rows are kept as they were
                index, response = jobs[job]
                row = make_row(
                    encoded[index], output_ids, settings.target_len, eos, index, prompts[index].id,
                    response,
                )
                handle.write(json.dumps(row) + "\n")
                done[job] = _Packed.of(row)
                written.append(row)
                new_tokens += len(row["input_ids"]) - row["prompt_len"]
            handle.flush()
            os.fsync(handle.fileno())
            new_rows += len(written)
            bar.update(len(written))
            bar.set_postfix_str(f"{new_tokens / wall if wall > 0 else 0.0:.1f} tok/s")
            if on_batch is not None:
                on_batch([r["source_index"] for r in written], written)
    bar.close()

    rows = [done[i] for i in sorted(done)]
    metadata = _metadata(
        verifier, settings, dataset, identity, rows, skipped, selected, formats, len(prompts), eos,
        pad_token_id(tokenizer, eos),
    )
    metadata["backend"] = backend.describe()
    metadata.update(dict(extra_metadata or {}))
    target = dataset_path(out, settings.shard_id, settings.num_shards)
    save_dataset(rows, metadata, target)
    return SynthResult(target, metadata, new_rows=new_rows, new_generated_tokens=new_tokens, wall_time_s=wall)


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


# -- datasets ----------------------------------------------------------------------------------------


def _to_dataset(rows: Sequence[_Packed]) -> Any:
    """An Arrow-backed Dataset of packed rows (int32 ids, int8 mask), built without Python lists."""
    import datasets
    import numpy as np
    import pyarrow as pa

    lengths = np.array([len(r.ids) for r in rows], dtype=np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    values = (
        np.concatenate([np.frombuffer(r.ids, dtype=np.int32) for r in rows])
        if rows
        else np.zeros(0, np.int32)
    )
    prompt_len = np.array([r.prompt_len for r in rows], dtype=np.int32)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    mask = ((np.arange(values.size) - starts) >= np.repeat(prompt_len, lengths)).astype(np.int8)
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(values, type=pa.int32())),
            "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(mask, type=pa.int8())),
            "prompt_len": pa.array(prompt_len, type=pa.int32()),
            "source_index": pa.array([r.source_index for r in rows], type=pa.int64()),
            "source_id": pa.array([r.source_id for r in rows], type=pa.string()),
            "response_index": pa.array([r.response_index for r in rows], type=pa.int32()),
            "finished_by_eos": pa.array([r.finished_by_eos for r in rows], type=pa.bool_()),
        }
    )
    return datasets.Dataset(datasets.table.InMemoryTable(table))


def save_dataset(
    rows: Sequence[Mapping[str, Any]] | Sequence[_Packed], metadata: Mapping[str, Any], directory: str | Path
) -> Path:
    """Save ``rows`` (sorted by ``source_index``) as a DatasetDict (train / validation by
    ``metadata["validation_fraction"]``, see :func:`validation_ids`) with ``specbench_synth.json``;
    replaces ``directory`` atomically. Rows are not checked here (:func:`load_synthetic` checks them)."""
    import datasets

    directory = Path(directory)
    packed = sorted((r if isinstance(r, _Packed) else _Packed.of(r) for r in rows), key=lambda r: r.key)
    keys = [r.key for r in packed]
    if len(set(keys)) != len(keys):
        raise SynthDataError(f"{directory}: duplicate (source_index, response_index) in the rows to save")
    chosen = validation_ids((r.source_id for r in packed), float(metadata.get("validation_fraction", 0.0)))
    data = datasets.DatasetDict(
        {
            "train": _to_dataset([r for r in packed if r.source_id not in chosen]),
            "validation": _to_dataset([r for r in packed if r.source_id in chosen]),
        }
    )
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        # one shard for an empty split: datasets saves it with none, and then cannot load it
        data.save_to_disk(str(tmp), num_shards={k: 1 if len(v) == 0 else None for k, v in data.items()})
    finally:
        if bars:
            datasets.enable_progress_bars()
    _write_json(tmp / METADATA_FILE, dict(metadata))
    old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    if old.exists():
        shutil.rmtree(old)  # the previous build of the same rows (the rows file is the source of truth)
    return directory


def _dataset_dirs(path: Path) -> list[Path]:
    """The synth dataset dirs a user path names: a dataset dir itself, or an output dir with one or more."""
    if (path / METADATA_FILE).is_file():
        return [path]
    if not path.is_dir():
        raise SynthDataError(f"train.data: {str(path)!r} does not exist (expected a task=synth output dir)")
    found = sorted(
        p
        for p in path.iterdir()
        if p.is_dir()
        and (p.name == DATASET_DIR or p.name.startswith(f"{DATASET_DIR}-shard"))
        and (p / METADATA_FILE).is_file()
    )
    if found:
        return found
    rows_files = sorted(p.name for p in path.glob("rows-shard*.jsonl"))
    if rows_files:
        raise SynthDataError(
            f"train.data: {path} has {', '.join(rows_files)} but no finished dataset: the task=synth run "
            "stopped early; rerun it into the same synth.output_dir to finish (it resumes)"
        )
    raise SynthDataError(
        f"train.data: {path} is not a task=synth output (no {DATASET_DIR}/{METADATA_FILE} in it)"
    )


def _check_split(table: Any, where: str, target_len: int | None) -> None:
    """Vectorised :func:`check_row` over an Arrow table of synthetic rows."""
    import numpy as np
    import pyarrow as pa

    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise SynthDataError(f"{where}: corrupt synthetic dataset: missing columns {missing}")
    if table.num_rows == 0:
        return

    def lists(name: str) -> tuple[np.ndarray, np.ndarray]:
        column = table.column(name).combine_chunks()
        if not pa.types.is_list(column.type) and not pa.types.is_large_list(column.type):
            raise SynthDataError(f"{where}: corrupt synthetic dataset: column {name} is not a list")
        offsets = column.offsets.to_numpy()
        return np.diff(offsets), column.flatten().to_numpy(zero_copy_only=False)

    id_lengths, ids = lists("input_ids")
    mask_lengths, mask = lists("loss_mask")
    prompt_len = table.column("prompt_len").to_numpy()
    rows_bad = np.flatnonzero(id_lengths != mask_lengths)
    problem = "input_ids and loss_mask differ in length"
    if not rows_bad.size:
        rows_bad = np.flatnonzero((prompt_len < 1) | (prompt_len >= id_lengths))
        problem = "no generated token (prompt_len >= length) or prompt_len < 1"
    if not rows_bad.size:
        starts = np.repeat(np.cumsum(mask_lengths) - mask_lengths, mask_lengths)
        position = np.arange(mask.size) - starts
        expected = (position >= np.repeat(prompt_len, mask_lengths)).astype(mask.dtype)
        wrong = np.flatnonzero(mask != expected)
        rows_bad = np.unique(np.searchsorted(np.cumsum(mask_lengths), wrong, side="right"))
        problem = "loss_mask is not 0 on the prompt and 1 on the generated tokens"
    if not rows_bad.size and target_len is not None:
        rows_bad = np.flatnonzero(id_lengths > target_len)
        problem = f"more tokens than target_len={target_len}"
    if not rows_bad.size and ids.size and ids.min() < 0:
        rows_bad, problem = np.array([0]), "negative token ids"
    if rows_bad.size:
        raise SynthDataError(
            f"{where}: corrupt synthetic dataset: {problem} (row {int(rows_bad[0])}, {rows_bad.size} rows)"
        )


def _read_part(directory: Path) -> tuple[Any, dict]:
    import datasets

    meta_file = directory / METADATA_FILE
    try:
        metadata = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SynthDataError(f"{meta_file}: unreadable synth metadata ({type(err).__name__}: {err})") from err
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT or "identity" not in metadata:
        raise SynthDataError(f"{meta_file}: not {FORMAT} metadata")
    try:
        data = datasets.load_from_disk(str(directory))
    except Exception as err:  # datasets raises several kinds for a broken dir
        raise SynthDataError(
            f"{directory}: cannot load the saved dataset ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(data, datasets.DatasetDict) or set(data) != set(SPLITS):
        raise SynthDataError(
            f"{directory}: corrupt synthetic dataset: expected a DatasetDict with {list(SPLITS)}"
        )
    for split in SPLITS:
        _check_split(data[split].data.table, f"{directory}/{split}", metadata.get("target_len"))
    return data, metadata


def load_synthetic(paths: str | Path | Sequence[str | Path]) -> tuple[DatasetDict, dict]:
    """One DatasetDict (``train``, ``validation``) from task=synth outputs, and their metadata.

    ``paths``: an output dir (its ``dataset`` or ``dataset-shard*`` dirs), a dataset dir, or several of
    them (a list, or one comma-separated string). Parts must share verifier, tokenizer hash, sampling
    settings and ``target_len``, and no prompt (``source_index`` of one prompt set) may appear twice;
    every row is checked. Raises SynthDataError naming the file or key.
    """
    import datasets

    if isinstance(paths, (str, Path)):
        paths = [p for p in str(paths).split(",") if p.strip()]
    dirs: list[Path] = []
    for item in paths:
        for directory in _dataset_dirs(Path(str(item).strip()).expanduser()):
            if directory.resolve() not in [d.resolve() for d in dirs]:
                dirs.append(directory)
            else:
                raise SynthDataError(f"train.data: {directory} is named twice")
    if not dirs:
        raise SynthDataError("train.data: no task=synth output dir given")
    parts = [_read_part(d) for d in dirs]
    first_dir, (_, first) = dirs[0], parts[0]
    for directory, (_, metadata) in zip(dirs[1:], parts[1:]):
        changed = _differences(first["identity"], metadata["identity"], MERGE_KEYS)
        if changed:
            raise SynthDataError(
                f"train.data: {directory} does not fit {first_dir}: {'; '.join(changed)}; merge only outputs "
                "of one verifier, tokenizer, sampling settings and target_len"
            )
    seen: dict[tuple[str, int, int, int], Path] = {}
    for directory, (data, metadata) in zip(dirs, parts):
        prompt_set = json.dumps(
            {k: v for k, v in metadata["identity"].items() if k.startswith("dataset.")}, sort_keys=True
        )
        seed = metadata["identity"].get("synth.seed", 0)
        for split in SPLITS:
            responses = (
                data[split]["response_index"]
                if "response_index" in data[split].column_names
                else [0] * len(data[split])
            )
            for index, response in zip(data[split]["source_index"], responses):
                # Runs with other seeds sample other responses to the same prompts: they may be merged.
                key = (prompt_set, int(seed), int(index), int(response))
                if key in seen:
                    raise SynthDataError(
                        f"train.data: source_index {index} of one prompt set is in both {seen[key]} and "
                        f"{directory}/{split}: the same shard (or overlapping runs) was given twice"
                    )
                seen[key] = Path(f"{directory}/{split}")
    if len(parts) == 1:
        merged = parts[0][0]
    else:
        merged = datasets.DatasetDict(
            {split: datasets.concatenate_datasets([data[split] for data, _ in parts]) for split in SPLITS}
        )
    totals = (
        "rows",
        "train_rows",
        "validation_rows",
        "tokens",
        "generated_tokens",
        "finished_by_eos",
        "skipped_prompts",
    )
    summary = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        **{
            k: first.get(k)
            for k in (
                "verifier",
                "verifier_path",
                "verifier_revision",
                "tokenizer_hash",
                "sampling",
                "target_len",
                "eos_token_ids",
                "pad_token_id",
            )
        },
        **{k: sum(int(m.get(k, 0)) for _, m in parts) for k in totals},
        "paths": [str(d) for d in dirs],
        "parts": [m for _, m in parts],
    }
    return merged, summary
