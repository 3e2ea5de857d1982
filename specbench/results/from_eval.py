"""Keep a ``task=eval`` run (``python launch.py ...``) as a result record: its metrics.json and samples.jsonl
give the method's row and the autoregressive baseline's, with per-prompt spread; its command is
``python launch.py`` with the run's overrides. Run it in the checkout that made the run::

    python -m specbench.results.from_eval outputs/2026-12-04/05-26-28-358fac --benchmark demo --headline
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from specbench.results.machine import describe_machine, git_commit
from specbench.results.record import (
    RESULTS_DIR,
    ResultRecordError,
    bootstrap_interval,
    figure,
    make_record,
    write_record,
)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResultRecordError(
            f"{path}: not a finished eval run's file ({err}); pass a task=eval output dir"
        ) from err


def _samples(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResultRecordError(f"{path}: unreadable samples ({err})") from err


def _overall_speedup(samples: list[dict[str, Any]]) -> float:
    """The eval's speedup over ``samples``: total tokens over total time, against the baseline's."""
    fast = sum(len(s["output_ids"]) for s in samples) / max(sum(s["wall_time_s"] for s in samples), 1e-9)
    base = sum(s["baseline_new_tokens"] for s in samples) / max(
        sum(s["baseline_wall_time_s"] for s in samples), 1e-9
    )
    return fast / max(base, 1e-9)


def eval_rows(metrics: dict[str, Any], samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The method's row (speedup with the median per-prompt ratio and a bootstrap interval, τ, acceptance,
    tokens/s) and, when the baseline ran, the autoregressive row."""
    setup = (
        f"{metrics['method']} ({metrics['schedule']}, gamma={metrics['gamma']}), drafter {metrics['drafter']}"
    )
    if metrics["method"] == "auto":
        setup = "autoregressive"
    figures: dict[str, Any] = {}
    with_baseline = "baseline_tokens_per_s" in metrics and all("baseline_wall_time_s" in s for s in samples)
    if with_baseline and metrics["method"] != "auto":
        speedup = figure(metrics["speedup"], unit="x")
        if len(samples) >= 2:
            speedup["median"] = sorted(s["tokens_per_s"] / s["baseline_tokens_per_s"] for s in samples)[
                len(samples) // 2
            ]
            speedup["interval"] = list(bootstrap_interval(samples, _overall_speedup))
        figures["speedup"] = speedup
    if metrics["method"] != "auto":
        figures["tau"] = figure(metrics["tau"])
        figures["acceptance"] = figure(metrics["acceptance_rate"])
    figures["tokens_per_s"] = figure(metrics["tokens_per_s"], [s["tokens_per_s"] for s in samples])
    same = metrics.get("baseline_match_rate")
    rows = [{"setup": setup, "figures": figures, "identical_outputs": None if same is None else same == 1.0}]
    if with_baseline and metrics["method"] != "auto":
        base = figure(metrics["baseline_tokens_per_s"], [s["baseline_tokens_per_s"] for s in samples])
        rows.insert(
            0, {"setup": "autoregressive", "figures": {"tokens_per_s": base}, "identical_outputs": True}
        )
    return rows


def record_from_eval(run_dir: str | Path, benchmark: str = "eval", headline: bool = False) -> dict[str, Any]:
    """The record of the eval run in ``run_dir`` (its metrics.json, samples.jsonl, .hydra/overrides.yaml)."""
    run = Path(run_dir)
    metrics = _read_json(run / "metrics.json")
    samples = _samples(run / "samples.jsonl")
    try:
        overrides = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text(encoding="utf-8")) or []
    except (OSError, yaml.YAMLError) as err:
        raise ResultRecordError(
            f"{run}/.hydra/overrides.yaml: unreadable ({err}); was this run made by launch.py?"
        ) from err
    rows = eval_rows(metrics, samples)
    if headline:
        rows[-1]["headline"] = True
    subset = metrics.get("dataset_subset")
    return make_record(
        benchmark,
        " ".join(["python launch.py", *overrides]),
        describe_machine(metrics["device"], metrics["dtype"], metrics.get("num_threads")),
        {"set": metrics["dataset"] + (f" ({subset})" if subset and subset != "all" else ""),
         "count": int(metrics["num_samples"])},
        rows,
        commit=git_commit(),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specbench.results.from_eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("run_dir", help="a task=eval output dir (holds metrics.json and samples.jsonl)")
    parser.add_argument("--benchmark", default="eval", help="the record's benchmark name (default: eval)")
    parser.add_argument("--headline", action="store_true", help="show the method's row in the README table")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    try:
        path = write_record(record_from_eval(args.run_dir, args.benchmark, args.headline), args.results_dir)
    except ResultRecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"result record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
