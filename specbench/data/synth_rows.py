"""The rows of synthetic training data (methods.md §6): their format, their files and their splits.

A row: ``input_ids`` (prompt + generated ids), ``loss_mask`` (0 on the prompt, 1 on generated tokens,
EOS included; nothing is padded), ``prompt_len``, ``source_index`` (position in the whole prompt set),
``source_id`` (the prompt's id, as a string), ``response_index`` (0..``responses_per_prompt``-1: one
prompt may get several sampled responses) and ``finished_by_eos``.

``task=synth`` (:func:`specbench.pipelines.synthesize.synthesize`) appends them to
``<out>/rows-shard{i}-of-{n}.jsonl`` (:func:`rows_path`), flushed after every batch (a crashed or
requeued job resumes from it), next to ``rows-shard{i}-of-{n}.settings.json`` (:func:`settings_path`:
what made the rows; a rerun with other settings stops instead of mixing them). The saved
``datasets.DatasetDict`` they end in is :mod:`specbench.data.synth_dataset`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sys
import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "specbench-synth"
FORMAT_VERSION = 1
COLUMNS = ("input_ids", "loss_mask", "prompt_len", "source_index", "source_id", "finished_by_eos")
OPTIONAL_COLUMNS = ("response_index",)  # absent in data written before responses_per_prompt (= 0)


class SynthDataError(ValueError):
    """Synthetic data that is corrupt, does not fit together, or was made with other settings; the
    message names the file or key and the fix."""


# -- files -------------------------------------------------------------------------------------------


def rows_path(out_dir: str | Path, shard_id: int = 0, num_shards: int = 1) -> Path:
    """``<out>/rows-shard{i}-of-{n}.jsonl``: the rows of one shard, appended batch by batch."""
    return Path(out_dir) / f"rows-shard{shard_id}-of-{num_shards}.jsonl"


def settings_path(out_dir: str | Path, shard_id: int = 0, num_shards: int = 1) -> Path:
    """``<out>/rows-shard{i}-of-{n}.settings.json``: the identity of the run that wrote the rows."""
    return Path(out_dir) / f"rows-shard{shard_id}-of-{num_shards}.settings.json"


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
    if path.name.endswith(".gz"):
        yield from _iter_archive(path, target_len)
        return
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


def _iter_archive(path: Path, target_len: int | None) -> Iterable[tuple[int, dict]]:
    """(line number, row) of a finished shard's gzip archive; a truncated or corrupt archive, or a bad
    line in it, raises SynthDataError naming the file and line (a finished shard has no torn line)."""
    number = 0
    try:
        with gzip.open(path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.endswith(b"\n"):
                    raise SynthDataError(f"{path}:{number}: the last line of a finished shard is cut off")
                row = json.loads(line)
                check_row(row, f"{path}:{number}", target_len)
                yield number, row
    except (OSError, EOFError, zlib.error, json.JSONDecodeError) as err:
        raise SynthDataError(
            f"{path}:{number + 1}: the compressed shard is truncated or corrupt "
            f"({type(err).__name__}: {err}); the other shards are not affected: restore this file "
            "(git checkout -- FILE) or delete it with its .metadata.json and rerun its synth.shard_id to "
            "sample it again"
        ) from err


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


# -- rows, splits ------------------------------------------------------------------------------------


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
