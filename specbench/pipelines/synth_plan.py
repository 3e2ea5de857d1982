"""What a ``task=synth`` run is before it samples: its settings (``synth.*``), how its work splits into
batches (job ids, per-batch seeds), and its identity, which decides whether an output dir resumes it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.data.dataset_config import DatasetSettings
from specbench.data.synth_archive import archive_path
from specbench.data.synth_dataset import _differences
from specbench.data.synth_rows import (
    SynthDataError,
    rows_path,
    settings_path,
)

if TYPE_CHECKING:  # imported lazily: the engine is slow to import
    from specbench.models.loading import ModelSpec


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


def check_resumable(out_dir: str | Path, settings: SynthSettings, identity: Mapping[str, Any]) -> None:
    """Raise SynthDataError if ``out_dir`` holds rows of this shard made with other settings.

    Loads no model; only keys that ``identity`` has are compared (see :func:`run_identity`).
    """
    rows_file = rows_path(out_dir, settings.shard_id, settings.num_shards)
    archive = archive_path(out_dir, settings.shard_id, settings.num_shards)
    if not rows_file.exists() and not archive.exists():
        return
    rows_file = rows_file if rows_file.exists() else archive
    fix = (
        "pass synth.resume=false to start over (the old rows are kept aside) or choose another "
        "synth.output_dir"
    )
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
