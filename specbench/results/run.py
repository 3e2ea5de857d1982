"""What a benchmark script calls to keep its run as a record: two shared command-line options and
:func:`record_run`, which fills in the command, commit, date and machine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specbench.results.machine import describe_machine, git_commit, this_command
from specbench.results.record import RESULTS_DIR, make_record, write_record


def add_record_options(parser: argparse.ArgumentParser) -> None:
    """``--no-record`` and ``--results-dir`` (default: the project's results/)."""
    parser.add_argument("--no-record", action="store_true", help="do not keep this run as a result record")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR),
                        help="where the run's result record goes "
                        "(default: the project's results/)")  # fmt: skip
    parser.add_argument("--headline", default="",
                        help="comma list of setup names (rows) to mark for the README's "
                        "results table")  # fmt: skip


def headline_setups(args: argparse.Namespace) -> list[str]:
    """The ``--headline`` setup names."""
    return [name.strip() for name in (getattr(args, "headline", "") or "").split(",") if name.strip()]


def record_run(
    args: argparse.Namespace,
    benchmark: str,
    rows: list[dict[str, Any]],
    prompt_set: str,
    prompt_count: int,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
    **extra: Any,
) -> Path | None:
    """Write this run's record (unless ``--no-record``) and print where; returns its path."""
    if getattr(args, "no_record", False):
        return None
    for row in rows:
        if row["setup"] in headline_setups(args):
            row["headline"] = True
    if unknown := sorted(set(headline_setups(args)) - {row["setup"] for row in rows}):
        print(f"warning: --headline names no row of this run: {unknown}")
    record = make_record(
        benchmark,
        this_command(),
        describe_machine(device, dtype, threads),
        {"set": prompt_set, "count": int(prompt_count)},
        rows,
        commit=git_commit(),
        **extra,
    )
    path = write_record(record, getattr(args, "results_dir", None) or RESULTS_DIR)
    print(f"result record: {path}")
    return path
