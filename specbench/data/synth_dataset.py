"""Saved synthetic datasets: the ``datasets.DatasetDict`` files of ``task=synth`` and reading them back.

``<out>/dataset`` (``<out>/dataset-shard{i}-of-{n}`` when ``num_shards`` > 1, so the jobs of an array
may share one output dir, :func:`dataset_path`): a ``datasets.DatasetDict`` with ``train`` and
``validation`` saved with ``save_to_disk`` (:func:`save_dataset`), and its metadata ``specbench_synth.json``.
Its rows are :mod:`specbench.data.synth_rows`.

:func:`load_synthetic` reads one or several such outputs (the shards of an array, or several runs of
one verifier) into one ``DatasetDict``, checking that they fit together and that every row is sound.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.data.synth_archive import ARCHIVE_GLOB, archive_metadata
from specbench.data.synth_rows import (
    COLUMNS,
    FORMAT,
    FORMAT_VERSION,
    SynthDataError,
    _iter_rows,
    _Packed,
    _write_json,
    validation_ids,
)

if TYPE_CHECKING:  # imported lazily: ``datasets`` is slow to import
    from datasets import DatasetDict

METADATA_FILE = "specbench_synth.json"
DATASET_DIR = "dataset"
SPLITS = ("train", "validation")
# Identity keys that every part of a merged dataset must share (see
# :func:`specbench.pipelines.synthesize.run_identity`).
# What merged parts must share. Sampling settings may differ: the trainers' targets are the verifier's own
# distributions over each row (recomputed, or read from the feature cache), so how a row was sampled only
# decides which rows there are; a corpus tops up greedy answers with answers sampled at T > 0.
MERGE_KEYS = (
    "verifier",
    "model.verifier.path",
    "model.verifier.revision",
    "tokenizer_hash",
    "synth.target_len",
)


def dataset_path(out_dir: str | Path, shard_id: int = 0, num_shards: int = 1) -> Path:
    """``<out>/dataset``, or ``<out>/dataset-shard{i}-of-{n}`` for one shard of several."""
    name = DATASET_DIR if num_shards == 1 else f"{DATASET_DIR}-shard{shard_id}-of-{num_shards}"
    return Path(out_dir) / name


def _differences(before: Mapping[str, Any], now: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """``key: before -> now`` for the keys that both have, with different values."""
    return [
        f"{key}: {before[key]!r} -> {now[key]!r}"
        for key in keys
        if key in before and key in now and before[key] != now[key]
    ]


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
    ``metadata["validation_fraction"]``, see :func:`~specbench.data.synth_rows.validation_ids`) with
    ``specbench_synth.json``; replaces ``directory`` atomically. Rows are not checked here
    (:func:`load_synthetic` checks them)."""
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
    materialise(path)  # finished shards committed as archives, without their dataset dirs
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


def materialise(out_dir: Path) -> list[Path]:
    """Rebuild the dataset dir of every archive in ``out_dir`` that has none (or an older one); returns the
    dataset dirs of all archives. No model is loaded: the rows and metadata are in the archive's files."""
    built = []
    for archive in sorted(out_dir.glob(ARCHIVE_GLOB)):
        metadata = archive_metadata(archive)
        target = dataset_path(out_dir, int(metadata["shard_id"]), int(metadata["num_shards"]))
        stale = not _same_build(target / METADATA_FILE, metadata)
        if stale:
            if not os.access(out_dir, os.W_OK):
                raise SynthDataError(
                    f"{out_dir}: cannot rebuild {target.name} from {archive.name} (the dir is read-only); "
                    "copy the corpus dir somewhere writable and pass that"
                )
            rows = [_Packed.of(row) for _, row in _iter_rows(archive, target_len=metadata.get("target_len"))]
            save_dataset(rows, {**metadata, "rebuilt_from": archive.name}, target)
        built.append(target)
    return built


def _same_build(dataset_metadata: Path, metadata: dict[str, Any]) -> bool:
    """Whether the dataset dir's metadata is the archive's build (same creation stamp and row count)."""
    try:
        saved = json.loads(dataset_metadata.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return all(saved.get(key) == metadata.get(key) for key in ("created", "rows", "identity"))


def _check_split(table: Any, where: str, target_len: int | None) -> None:
    """Vectorised :func:`~specbench.data.synth_rows.check_row` over an Arrow table of synthetic rows."""
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

    dirs = _synthetic_dirs(paths)
    parts = [_read_part(d) for d in dirs]
    _check_mergeable(dirs, parts)
    if len(parts) == 1:
        merged = parts[0][0]
    else:
        merged = datasets.DatasetDict(
            {split: datasets.concatenate_datasets([data[split] for data, _ in parts]) for split in SPLITS}
        )
    first = parts[0][1]
    samplings = [m.get("sampling") for _, m in parts]
    summary = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        **{k: first.get(k) for k in _SHARED_KEYS},
        # one dict when the parts agree, else each distinct one in order
        "sampling": samplings[0] if all(x == samplings[0] for x in samplings) else _distinct(samplings),
        **{k: sum(int(m.get(k, 0)) for _, m in parts) for k in _SUMMED_KEYS},
        "paths": [str(d) for d in dirs],
        "parts": [m for _, m in parts],
    }
    return merged, summary


# Metadata a merge takes from its first part, and the counts it sums over the parts.
_SHARED_KEYS = (
    "verifier", "verifier_path", "verifier_revision", "tokenizer_hash", "sampling", "target_len",
    "eos_token_ids", "pad_token_id",
)  # fmt: skip
_SUMMED_KEYS = (
    "rows", "train_rows", "validation_rows", "tokens", "generated_tokens", "finished_by_eos",
    "skipped_prompts",
)  # fmt: skip


def _distinct(items: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _synthetic_dirs(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """The dataset dirs ``paths`` name (see :func:`load_synthetic`), each once."""
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
    return dirs


def _check_mergeable(dirs: Sequence[Path], parts: Sequence[tuple[Any, dict]]) -> None:
    """SynthDataError unless the parts share what MERGE_KEYS name and no response of a prompt is in two."""
    first_dir, (_, first) = dirs[0], parts[0]
    for directory, (_, metadata) in zip(dirs[1:], parts[1:]):
        changed = _differences(first["identity"], metadata["identity"], MERGE_KEYS)
        if changed:
            raise SynthDataError(
                f"train.data: {directory} does not fit {first_dir}: {'; '.join(changed)}; merge only outputs "
                "of one verifier, tokenizer and target_len"
            )
    seen: dict[tuple[str, str, int, int], Path] = {}
    for directory, (data, metadata) in zip(dirs, parts):
        prompt_set = json.dumps(
            {k: v for k, v in metadata["identity"].items() if k.startswith("dataset.")}, sort_keys=True
        )
        # Runs with other seeds or sampling settings sample other responses to the same prompts: they merge.
        identity = metadata["identity"]
        seed = json.dumps([identity.get(k) for k in ("synth.seed", "synth.temperature", "synth.top_k",
                                                      "synth.top_p")])  # fmt: skip
        for split in SPLITS:
            responses = (
                data[split]["response_index"]
                if "response_index" in data[split].column_names
                else [0] * len(data[split])
            )
            for index, response in zip(data[split]["source_index"], responses):
                key = (prompt_set, seed, int(index), int(response))
                if key in seen:
                    raise SynthDataError(
                        f"train.data: source_index {index} of one prompt set is in both {seen[key]} and "
                        f"{directory}/{split}: the same shard (or overlapping runs) was given twice"
                    )
                seen[key] = Path(f"{directory}/{split}")
