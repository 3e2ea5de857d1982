"""The commands the project is known by (README, "The commands it is known by"), run as typed.

Each test takes its command from the README block (so the page and the tests cannot drift) and adds only
knobs that size the run (fewer tokens and prompts, tiny models where the command names none, output dirs);
the method, schedule, launcher and report choices are the README's.
"""

from __future__ import annotations

import json
import shlex

import pytest
from helpers import ROOT, compose_config, design_card, launch

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError
from specbench.config.validate import validate, validate_train
from specbench.method_names import TRAINED_METHODS

TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random", "runtime.num_threads=1"]
QUICK = ["gen.max_new_tokens=4", "dataset.limit=1", "eval.warmup=false"]


TRAIN, SWEEP, SLURM_SWEEP, REPORT = design_card()


def test_the_card_holds_the_four_commands():
    assert TRAIN == ["task=train", "method=diversed"]
    assert SWEEP[0] == "-m" and "method.draft_weight=0.1,0.3" in SWEEP and "method=static_ensemble" in SWEEP
    assert SLURM_SWEEP == [*SWEEP, "hydra/launcher=submitit_slurm"]
    assert REPORT == ["task=report", "task.parent_run_id=last"]


# ---- 1. task=train method=diversed -----------------------------------------------------------------------


def test_train_diversed_takes_its_defaults_from_the_method_and_the_user_still_wins():
    cfg = compose_config(TRAIN)
    plan = validate_train(cfg)
    assert plan.drafter._target_.startswith("specbench.drafters.eagle3")  # a drafter with hidden states
    assert cfg.train.reward == "per_token_gate"  # auto: dataset=demo has no metric, so no references needed
    assert cfg.train.max_steps <= 20  # CPU-sized
    chosen = compose_config(
        [*TRAIN, "model/drafter=early-exit", "train.reward=verifier_logp", "train.max_steps=7"]
    )
    validate_train(chosen)
    assert (chosen.model.drafter.kind, chosen.train.reward, chosen.train.max_steps) == (
        "early_exit",
        "verifier_logp",
        7,
    )
    with_metric = compose_config(
        [
            *TRAIN,
            "dataset=jsonl",
            f"dataset.path={ROOT / 'specbench/data/demo_prompts.jsonl'}",
            "dataset.metric=bleu",
        ]
    )
    validate_train(with_metric)
    assert with_metric.train.reward == "task"  # auto: a dataset with a metric trains on it
    preset = compose_config(["task=train", "experiment=cpu-diversed-translation"])
    assert preset.model.drafter.kind == "early_exit"  # an experiment's choice wins over the method's


@pytest.mark.parametrize("method", [*TRAINED_METHODS, "sd", "lossy", "auto"])
def test_every_train_method_runs_or_names_the_missing_choice_in_one_line(method):
    """Validation loads no model: a config error here is what the user sees before anything loads."""
    cfg = compose_config(["task=train", f"method={method}"])
    if method == "diversed":
        assert validate_train(cfg).method == "diversed"
        return
    with pytest.raises(ConfigError) as info:
        validate_train(cfg)
    message = str(info.value)
    assert "\n" not in message
    expected = (
        "train.data=DIR" if method in ("sd2", "distill", "eagle3", "dflash") else "has nothing to train"
    )
    assert expected in message, message


def test_synth_and_eval_of_each_method_compose_on_the_embedded_default():
    from specbench.config.validate import validate_synth

    assert validate_synth(compose_config(["task=synth"])).verifier.kind == "embedded"
    for method in ("sd", "static_ensemble", "diversed", "sd2"):
        assert validate(compose_config([f"method={method}"])).method == method


@pytest.mark.slow
def test_train_diversed_as_typed_then_the_printed_eval_command(tmp_path):
    out = tmp_path / "head"
    sizing = [
        "train.max_steps=2",
        "train.val_every_steps=2",
        "train.checkpoint_every_steps=2",
        "train.batch_size=2",
        "train.rollouts_per_prompt=1",
        "train.val_prompts=1",
        "gen.max_new_tokens=6",
        "runtime.num_threads=1",
    ]
    proc = launch(
        [*TRAIN, *sizing, f"train.output_dir={out}", f"hydra.run.dir={tmp_path / 'h'}"],
        cache_dir=tmp_path / "cache",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "trained.pt").is_file()
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("evaluate it: ")]
    command = shlex.split(line.removeprefix("evaluate it: "))
    assert command[:2] == ["python", "launch.py"]
    assert (
        "method=diversed" in command and f"method.head_checkpoint={(out / 'trained.pt').resolve()}" in command
    )
    assert not any(arg.startswith(("task=", "train.")) for arg in command)
    evaluated = tmp_path / "eval"
    proc = launch(
        [
            *command[2:],
            "gen.max_new_tokens=6",
            "dataset.limit=1",
            "eval.warmup=false",
            "eval.baseline=false",
            "runtime.num_threads=1",
            f"eval.output_dir={evaluated}",
            f"hydra.run.dir={tmp_path / 'h2'}",
        ],
        cache_dir=tmp_path / "cache",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((evaluated / "metrics.json").read_text())
    assert metrics["method"] == "diversed" and metrics["method_checkpoint"].endswith("trained.pt")


# ---- 2. and 4. the sweep, then the MLflow comparison of its runs -----------------------------------------


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("card_sweep")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    sweep_dir = root / "sweep"
    proc = launch(
        [*SWEEP, *TINY, *QUICK, f"hydra.sweep.dir={sweep_dir}"],
        env_extra={"MLFLOW_TRACKING_URI": uri},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": sweep_dir, "uri": uri, "root": root}


def test_the_sweep_runs_every_draft_length_and_weight(sweep):
    jobs = sorted((p for p in sweep["dir"].iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    grid = []
    for job in jobs:
        metrics = json.loads((job / "metrics.json").read_text())
        grid.append((metrics["gamma"], metrics["method_draft_weight"]))
    assert grid == [(g, w) for g in (3, 5, 7) for w in (0.1, 0.3)]


def test_the_report_compares_the_newest_sweeps_runs_from_mlflow(sweep):
    run_dir = sweep["root"] / "report"
    proc = launch([*REPORT, f"hydra.run.dir={run_dir}"], env_extra={"MLFLOW_TRACKING_URI": sweep["uri"]})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(6 runs," in proc.stdout
    table = [line for line in proc.stdout.splitlines() if "static_ensemble" in line]
    assert len(table) == 6 and any("0.1" in line for line in table) and any("0.3" in line for line in table)


def test_a_sweep_over_a_parameter_the_method_does_not_read_starts_no_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    unread = [arg for arg in SWEEP if arg != "method=static_ensemble"]  # the default method, sd
    proc = launch(
        [*unread, *TINY, *QUICK, f"hydra.sweep.dir={sweep_dir}"],
        env_extra={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"},
    )
    assert proc.returncode == 2
    assert "method=sd does not read draft_weight; static_ensemble, sd_static and static_en do" in proc.stderr
    assert "no job was started" in proc.stderr and "Traceback" not in proc.stderr
    assert not sweep_dir.exists() or not any(p.name.isdigit() for p in sweep_dir.iterdir())


def test_a_single_run_with_an_unread_parameter_is_refused_before_models_load():
    with pytest.raises(ConfigError, match="method=lossy does not read draft_weight"):
        validate(compose_config([*TINY, "method=lossy", "method.draft_weight=0.2"]))
    proc = launch([*TINY, "method.alpha=0.5"])
    assert proc.returncode == 2 and "method=sd does not read alpha; cascade and spe_cas do" in proc.stderr


# ---- 3. the SLURM submission: tests/test_slurm.py runs SLURM_SWEEP on a real single-node cluster ----------
