"""The result record: one benchmark run, its exact command, commit, date, machine, prompts and figures.

A record holds one or more *rows*, one per setup the run compared side by side (e.g. autoregressive
decoding and three drafters). Every figure has a value and, where the benchmark has several questions, the
median of the per-question figures and a bootstrap interval over questions. Records are checked when
written and when read; a malformed one is a :class:`ResultRecordError` that names the file.
"""

from __future__ import annotations

import json
import random
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RECORD_SCHEMA = "specbench.result/1"
RESULTS_DIR = Path(__file__).resolve().parents[2] / "results"
MACHINE_FIELDS = ("cpu", "cores", "threads", "torch", "device", "dtype")
_REQUIRED = ("schema", "benchmark", "command", "commit", "date", "machine", "prompts", "rows")
_OPTIONAL = ("backfilled", "doc", "notes")
_ROW_REQUIRED = ("setup", "figures", "identical_outputs")
_ROW_OPTIONAL = ("headline", "notes")
_FIGURE_KEYS = ("value", "median", "interval", "unit")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.+-]*$")


class ResultRecordError(ValueError):
    """A result record that does not follow the schema; the message names the file and the problem."""


def bootstrap_interval(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float] = statistics.mean,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over ``values`` (resampled with replacement)."""
    if len(values) < 2:
        raise ValueError("a bootstrap interval needs at least two values")
    rng = random.Random(seed)
    draws = sorted(statistic(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return draws[int(tail * (resamples - 1))], draws[round((1.0 - tail) * (resamples - 1))]


def figure(value: float, per_question: Sequence[float] | None = None, unit: str = "",
           statistic: Callable[[Sequence[float]], float] = statistics.mean) -> dict[str, Any]:
    """A figure; with ``per_question`` values also their median and a 95 % bootstrap interval of
    ``statistic`` (the one that gave ``value``) over questions."""
    out: dict[str, Any] = {"value": float(value)}
    if per_question is not None and len(per_question) >= 2:
        out["median"] = float(statistics.median(per_question))
        out["interval"] = [float(x) for x in bootstrap_interval(per_question, statistic)]
    if unit:
        out["unit"] = unit
    return out


def make_record(
    benchmark: str,
    command: str,
    machine: dict[str, Any],
    prompts: dict[str, Any],
    rows: list[dict[str, Any]],
    commit: str,
    date: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A validated record (``date`` defaults to now, UTC)."""
    record = {
        "schema": RECORD_SCHEMA,
        "benchmark": benchmark,
        "command": command,
        "commit": commit,
        "date": date or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine,
        "prompts": prompts,
        "rows": rows,
        **extra,
    }
    validate_record(record)
    return record


def _fail(where: str, problem: str) -> None:
    raise ResultRecordError(f"{where}: {problem}")


def _check_figure(where: str, name: str, fig: Any) -> None:
    if not isinstance(fig, dict) or "value" not in fig:
        _fail(where, f"figure {name!r} must be an object with a 'value'")
    if unknown := sorted(set(fig) - set(_FIGURE_KEYS)):
        _fail(where, f"figure {name!r} has unknown keys {unknown}; allowed: {list(_FIGURE_KEYS)}")
    for key in ("value", "median"):
        if key in fig and (isinstance(fig[key], bool) or not isinstance(fig[key], (int, float))):
            _fail(where, f"figure {name!r}: {key} must be a number, got {fig[key]!r}")
    if "interval" in fig:
        low_high = fig["interval"]
        if (not isinstance(low_high, list) or len(low_high) != 2
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in low_high)
                or low_high[0] > low_high[1]):  # fmt: skip
            _fail(where, f"figure {name!r}: interval must be [low, high] numbers with low <= high")
    if "unit" in fig and not isinstance(fig["unit"], str):
        _fail(where, f"figure {name!r}: unit must be a string")


def _check_keys(where: str, node: Any, required: Sequence[str], optional: Sequence[str], what: str) -> None:
    """``node`` is an object with every ``required`` key and no key outside ``required`` + ``optional``."""
    if not isinstance(node, dict):
        _fail(where, f"{what} must be a JSON object")
    if missing := [k for k in required if k not in node]:
        _fail(where, f"missing keys {missing}")
    if unknown := sorted(set(node) - set(required) - set(optional)):
        _fail(where, f"unknown keys {unknown}; allowed: {list(required) + list(optional)}")


def _check_row(where: str, index: int, row: Any) -> None:
    at = f"{where}: rows[{index}]"
    _check_keys(at, row, _ROW_REQUIRED, _ROW_OPTIONAL, "a row")
    if not isinstance(row["setup"], str) or not row["setup"].strip():
        _fail(at, "setup must be a non-empty string")
    if not isinstance(row["figures"], dict) or not row["figures"]:
        _fail(at, "figures must be a non-empty object")
    for name, fig in row["figures"].items():
        _check_figure(at, name, fig)
    if row["identical_outputs"] not in (True, False, None):
        _fail(at, "identical_outputs must be true, false or null (not applicable: a lossy rule, sampling)")
    if "headline" in row and not isinstance(row["headline"], bool):
        _fail(at, "headline must be true or false")


def validate_record(record: Any, where: str = "result record") -> None:
    """Raise :class:`ResultRecordError` (prefixed with ``where``) unless ``record`` follows the schema."""
    _check_keys(where, record, _REQUIRED, _OPTIONAL, "a record")
    if record["schema"] != RECORD_SCHEMA:
        _fail(where, f"schema must be {RECORD_SCHEMA!r}, got {record['schema']!r}")
    if not isinstance(record["benchmark"], str) or not _NAME.match(record["benchmark"]):
        _fail(where, f"benchmark must be a lower-case name, got {record['benchmark']!r}")
    for key in ("command", "commit"):
        if not isinstance(record[key], str) or not record[key].strip():
            _fail(where, f"{key} must be a non-empty string")
    try:
        datetime.fromisoformat(str(record["date"]).replace("Z", "+00:00"))
    except ValueError:
        _fail(where, f"date must be ISO 8601 (2026-12-04T06:00:00Z), got {record['date']!r}")
    machine = record["machine"]
    if not isinstance(machine, dict) or any(k not in machine for k in MACHINE_FIELDS):
        _fail(where, f"machine must be an object with {list(MACHINE_FIELDS)}")
    prompts = record["prompts"]
    if not isinstance(prompts, dict) or not isinstance(prompts.get("set"), str):
        _fail(where, "prompts must be an object with 'set' (a name) and 'count'")
    if (
        not isinstance(prompts.get("count"), int)
        or isinstance(prompts.get("count"), bool)
        or prompts["count"] < 1
    ):
        _fail(where, "prompts.count must be a positive integer")
    if not isinstance(record["rows"], list) or not record["rows"]:
        _fail(where, "rows must be a non-empty list")
    for index, row in enumerate(record["rows"]):
        _check_row(where, index, row)
    setups = [row["setup"] for row in record["rows"]]
    if len(set(setups)) != len(setups):
        _fail(where, f"two rows share a setup name: {sorted(s for s in set(setups) if setups.count(s) > 1)}")
    if "backfilled" in record and not isinstance(record["backfilled"], bool):
        _fail(where, "backfilled must be true or false")


def record_path(record: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """``results/BENCHMARK/DATE-COMMIT.json`` (the date without separators, so names sort by time)."""
    stamp = re.sub(r"[^0-9T]", "", str(record["date"]))[:15]
    return results_dir / record["benchmark"] / f"{stamp}-{record['commit'][:10]}.json"


def write_record(record: dict[str, Any], results_dir: str | Path = RESULTS_DIR) -> Path:
    """Validate ``record`` and write it as a new file (never over an existing record); returns its path."""
    validate_record(record)
    target = record_path(record, Path(results_dir))
    target.parent.mkdir(parents=True, exist_ok=True)
    candidate, number = target, 1
    while candidate.exists():
        number += 1
        candidate = target.with_name(f"{target.stem}-{number}.json")
    partial = candidate.with_name(candidate.name + ".partial")
    partial.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    partial.replace(candidate)
    return candidate


def load_record(path: str | Path) -> dict[str, Any]:
    """Read and validate one record; a malformed file is a :class:`ResultRecordError` naming it."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResultRecordError(f"{path}: unreadable result record ({err}); fix or delete the file") from err
    validate_record(record, str(path))
    return record


def load_records(results_dir: str | Path = RESULTS_DIR) -> list[tuple[Path, dict[str, Any]]]:
    """Every record under ``results_dir`` (``*/*.json``), oldest first."""
    paths = sorted(Path(results_dir).glob("*/*.json"))
    records = [(path, load_record(path)) for path in paths]
    return sorted(records, key=lambda item: (_when(item[1]), _run_number(item[0]), str(item[0])))


def _run_number(path: Path) -> int:
    """Runs written with the same date and commit are ``STAMP-COMMIT.json``, ``STAMP-COMMIT-2.json``, ...
    in the order they were written."""
    parts = path.stem.split("-")
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 1


def _when(record: dict[str, Any]) -> datetime:
    when = datetime.fromisoformat(str(record["date"]).replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def latest_rows(
    records: Iterable[tuple[Path, dict[str, Any]]],
) -> list[tuple[Path, dict[str, Any], dict[str, Any]]]:
    """(path, record, row) for each (benchmark, setup): the row of its latest run, in first-seen order."""
    latest: dict[tuple[str, str], tuple[Path, dict[str, Any], dict[str, Any]]] = {}
    for path, record in records:
        for row in record["rows"]:
            latest[(record["benchmark"], row["setup"])] = (path, record, row)
    return sorted(latest.values(), key=lambda item: (item[1]["benchmark"], item[1]["rows"].index(item[2])))
