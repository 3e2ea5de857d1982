"""Time to first answer of ``launch.py``, each measured in fresh subprocesses (median of ``--runs``):

1. import of the launch path (``launch`` and every task module),
2. a config error (``schedule.gamma=0`` on the tiny-random pair): the one-line error and exit 2,
3. a tiny-random eval (8 demo prompts x 64 tokens, with its baseline) without tracking, and
4. the same with MLflow tracking into a throwaway SQLite store (created before the timed runs).

    python benchmarks/startup.py [--runs 3] [--skip-eval]

Targets (this 2-core CPU machine): config error <= 3 s, tiny eval <= 10 s. The eval's own
decoding time (printed by the eval) is shown next to its total, so what is startup and what is decoding
stays visible.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import benchmark_parser  # torch-free, as this script must stay

from specbench.results import record_run
from specbench.results.record import figure

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random"]
IMPORT_LAUNCH_PATH = (
    "import launch, specbench.tasks.eval, specbench.tasks.train, specbench.tasks.synth, "
    "specbench.tasks.report"
)
DECODE_LINE = re.compile(r"new tokens in ([0-9.]+) s(?: \(\+ baseline ([0-9.]+) s\))?")


def timed(args: list[str], env: dict[str, str], expect: int) -> tuple[float, str]:
    """(wall seconds, stdout) of one subprocess; its exit status must be ``expect``."""
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != expect:
        command = " ".join(args)
        raise SystemExit(f"{command} exited {proc.returncode} (expected {expect}):\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def decoding_seconds(stdout: str) -> float | None:
    found = DECODE_LINE.search(stdout)
    return None if found is None else float(found.group(1)) + float(found.group(2) or 0.0)


def main() -> None:
    parser = benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="subprocesses per measurement (median)")
    parser.add_argument("--skip-eval", action="store_true", help="only the import and the config error")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="specbench-startup-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{scratch / 'mlflow.db'}"}
    env.pop("HYDRA_FULL_ERROR", None)
    launch = [sys.executable, str(ROOT / "launch.py")]
    cases = [
        ("import of the launch path", [sys.executable, "-c", IMPORT_LAUNCH_PATH], 0, False),
        ("config error (schedule.gamma=0)", [*launch, *TINY, "schedule.gamma=0"], 2, False),
    ]  # fmt: skip
    if not args.skip_eval:
        cases += [
            ("tiny-random eval, tracking=none", [*launch, *TINY, "tracking=none"], 0, True),
            ("tiny-random eval, MLflow (SQLite)", [*launch, *TINY], 0, True),
        ]
        # creates and migrates the SQLite store once, outside the timed runs
        warm = [*launch, *TINY, "gen.max_new_tokens=1", "dataset.limit=1"]
        warm.append(f"hydra.run.dir={scratch / 'warm'}")
        timed(warm, env, 0)
    print(f"{'measurement':<36} {'median s':>9} {'runs (s)':<28} decoding s (median)")
    rows = []
    for case, (label, command, expect, is_eval) in enumerate(cases):
        walls, decodes = [], []
        for run in range(args.runs):
            run_dir = scratch / f"case{case}-run{run}"  # a fresh dir: an eval would resume from an old one
            extra = [f"hydra.run.dir={run_dir}"] if command[:2] == launch else []
            wall, stdout = timed([*command, *extra], env, expect)
            walls.append(wall)
            if is_eval and decoding_seconds(stdout) is not None:
                decodes.append(decoding_seconds(stdout))
        shown = ", ".join(f"{w:.2f}" for w in walls)
        decode = f"{statistics.median(decodes):.2f}" if decodes else "-"
        print(f"{label:<36} {statistics.median(walls):>9.2f} {shown:<28} {decode}")
        rows.append(record_row(label, walls, decodes))
    prompts = ("no prompts: import and config error only (--skip-eval)", 1) if args.skip_eval else (
        "demo (the tiny-random eval's prompts)", 8)  # fmt: skip
    record_run(args, "startup", rows, *prompts, device="cpu", dtype="float32", doc="docs/configuration.md",
               notes=f"median of {args.runs} fresh subprocess(es) per measurement; targets on a 2-core CPU: "
               "config error <= 3 s, tiny eval <= 10 s")  # fmt: skip


def record_row(label: str, walls: list[float], decodes: list[float]) -> dict:
    """A result-record row of one measurement: the median wall seconds (and the eval's own decoding
    seconds); every run's seconds in its notes. No outputs to compare (identical_outputs: null)."""
    figures = {"seconds": figure(statistics.median(walls), unit="s")}
    if decodes:
        figures["decoding_seconds"] = figure(statistics.median(decodes), unit="s")
    notes = "runs (s): " + ", ".join(f"{w:.2f}" for w in walls)
    return {"setup": label, "figures": figures, "identical_outputs": None, "notes": notes}


if __name__ == "__main__":
    main()
