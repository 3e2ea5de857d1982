"""Time to first answer: the launch path and config validation import neither torch, transformers, mlflow
nor lightning, and the torch-free checks give the library's verdicts (benchmarks/startup.py times them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT

HEAVY = ("torch", "transformers", "mlflow", "lightning")
TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random"]


def python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False,
        timeout=120,
    )  # fmt: skip


def heavy_imports(stderr: str) -> set[str]:
    """Top-level packages among the modules ``python -X importtime`` reports as imported."""
    lines = [line for line in stderr.splitlines() if line.startswith("import time:")]
    names = {line.rsplit("|", 1)[-1].strip() for line in lines}
    return {name for name in names if name in HEAVY}


def test_the_launch_path_imports_no_heavy_library():
    code = (
        "import sys, json; sys.argv = ['launch.py']; import launch, specbench.tasks.eval, "
        "specbench.tasks.train, specbench.tasks.synth, specbench.tasks.report, specbench.tracking.callbacks, "
        "specbench.tasks.sweep_tables; "
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == []


@pytest.mark.parametrize(
    "overrides",
    [
        [*TINY],  # a valid eval config: everything validate() checks
        [*TINY, "method=static_en"],
        [*TINY, "task=synth"],
        [*TINY, "task=train", "method=diversed", "dataset=spec_bench", "dataset.categories=[translation]"],
    ],
)
def test_validation_imports_no_heavy_library(overrides):
    code = (
        "import sys, json; sys.path.insert(0, 'tests'); from helpers import compose_config; "
        "import specbench.config; "
        "from specbench.config.validate import validate, validate_synth, validate_train; "
        f"cfg = compose_config({overrides!r}); kind = cfg.task._target_.rsplit('.', 1)[-1]; "
        "check = {'SynthTask': validate_synth, 'TrainTask': validate_train}.get(kind, validate); "
        "plan = check(cfg); "
        f"print(json.dumps([plan.method, [m for m in {list(HEAVY)!r} if m in sys.modules]]))"
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    method, heavy = json.loads(proc.stdout)
    assert heavy == [] and method in ("sd", "static_ensemble", "auto", "diversed")


def test_a_config_error_from_launch_imports_no_heavy_library(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "launch.py"), *TINY, "schedule.gamma=0",
         f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "Config error: schedule.gamma must be >= 1, got 0" in proc.stderr
    assert heavy_imports(proc.stderr) == set()


# The torch-free checks (specbench/values.py) and the library's constructors agree on every value.
BAD_VALUES = [
    ("schedule", {"name": "sometimes"}),
    ("schedule", {"gamma": 0}),
    ("schedule", {"gamma": 4, "max_gamma": 3}),
    ("schedule", {"confidence_threshold": 1.5}),
    ("gen", {"max_new_tokens": 0}),
    ("gen", {"temperature": -0.1}),
    ("gen", {"top_k": -1}),
    ("gen", {"top_p": 0.0}),
    ("gen", {"top_p": 1.01}),
    ("lossy", {"lenience": 0.0}),
    ("lossy", {"lenience": 1.2}),
    ("static_ensemble", {"draft_weight": -0.1, "pool": "linear"}),
    ("static_ensemble", {"draft_weight": 1.1, "pool": "linear"}),
    ("static_ensemble", {"draft_weight": 0.3, "pool": "geometric"}),
    ("cascade", {"deferral": "maybe", "alpha": 0.1}),
    ("cascade", {"deferral": "chow", "alpha": -1.0}),
    ("cascade", {"deferral": "token", "alpha": 1.5}),
    ("typical", {"epsilon": 0.0, "delta": 0.3}),
    ("typical", {"epsilon": 1.5, "delta": 0.3}),
    ("typical", {"epsilon": 0.09, "delta": 0.0}),
    ("device", {"name": "tpu"}),
    ("device", {"name": "cuda:x"}),
    ("dtype", {"name": "int3"}),
]
GOOD_VALUES = [
    ("schedule", {"name": "dynamic", "gamma": 2, "max_gamma": 8}),
    ("gen", {"temperature": 0.7, "top_k": 20, "top_p": 0.9}),
    ("lossy", {"lenience": 1.0}),
    ("static_ensemble", {"draft_weight": 1.0, "pool": "log_linear"}),
    ("cascade", {"deferral": "token", "alpha": 1.0}),
    ("cascade", {"deferral": "opt", "alpha": 3.0}),
    ("typical", {"epsilon": 1.0, "delta": 2.0}),
    ("device", {"name": "cpu"}),
    ("device", {"name": "auto"}),
    ("dtype", {"name": "bf16"}),
    ("dtype", {"name": "auto"}),
]
CONFIG_KEY = re.compile(r"\b(schedule|gen|method)\.\w+")
SCHEDULE = {"name": "constant", "gamma": 3, "max_gamma": 16, "confidence_threshold": 0.4}
GEN = {"max_new_tokens": 8, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}


def verdicts(what: str, values: dict) -> tuple[str | None, str | None]:
    """(error of the torch-free check, error of the library), None where the value was accepted."""
    from specbench import values as checks
    from specbench.decoding.engine import GenerationSettings
    from specbench.decoding.methods import build_rule
    from specbench.decoding.schedules import DraftSchedule
    from specbench.models.devices import resolve_device, resolve_dtype

    def error(call, *args, **kwargs):
        try:
            call(*args, **kwargs)
        except ValueError as err:
            return str(err)
        return None

    if what == "schedule":
        merged = {**SCHEDULE, **values}
        return error(checks.check_schedule, **merged), error(DraftSchedule, **merged)
    if what == "gen":
        merged = {**GEN, **values}
        return error(checks.check_generation, **merged), error(GenerationSettings, **merged)
    if what == "device":
        return error(checks.check_device, values["name"]), error(resolve_device, values["name"])
    if what == "dtype":
        return error(checks.check_dtype, values["name"]), error(resolve_dtype, values["name"], "cpu")
    from specbench.method_names import check_rule_params

    return error(check_rule_params, what, values), error(build_rule, what, **values)


@pytest.mark.parametrize(("what", "values"), BAD_VALUES, ids=[f"{w}-{v}" for w, v in BAD_VALUES])
def test_torch_free_checks_refuse_what_the_library_refuses(what, values):
    ours, library = verdicts(what, values)
    assert ours is not None and library is not None, (ours, library)
    if what not in ("device", "dtype"):  # both messages name the same key
        assert CONFIG_KEY.search(ours).group() == CONFIG_KEY.search(library).group(), (ours, library)


@pytest.mark.parametrize(("what", "values"), GOOD_VALUES, ids=[f"{w}-{v}" for w, v in GOOD_VALUES])
def test_torch_free_checks_accept_what_the_library_accepts(what, values):
    assert verdicts(what, values) == (None, None)


def test_the_startup_benchmark_prints_its_timings(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--runs", "1", "--skip-eval",
         "--results-dir", str(tmp_path)],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, check=False,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "import of the launch path" in proc.stdout and "config error" in proc.stdout
    # its result record: one row per measurement, the median seconds printed
    from specbench.results.record import load_records

    [(path, record)] = load_records(tmp_path)
    assert record["benchmark"] == "startup" and f"result record: {path}" in proc.stdout
    assert [row["setup"] for row in record["rows"]] == [
        "import of the launch path",
        "config error (schedule.gamma=0)",
    ]
    for row in record["rows"]:
        printed = next(line for line in proc.stdout.splitlines() if line.startswith(row["setup"]))
        assert (
            printed.split()[-3] == f"{row['figures']['seconds']['value']:.2f}"
            and row["identical_outputs"] is None
        )
