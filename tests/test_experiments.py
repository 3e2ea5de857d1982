"""Experiment presets (conf/experiment/): each composes with one override and validates; the CPU ones run."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import ROOT, compose_config, launch
from omegaconf import OmegaConf

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError, validate

CONF = ROOT / "conf"
LLAMA_8B, LLAMA_1B = "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"
SD2 = {"method": "sd2", "steering": "sd2", "gamma": 8, "temperature": 1.0}
DIVERSED = {"verifier": LLAMA_8B, "drafter": LLAMA_1B, "method": "diversed", "steering": "none",
            "temperature": 1.0}  # fmt: skip
# What each preset must set (the rest are the defaults).
PRESETS = {
    "sd2-llama3": {**SD2, "verifier": LLAMA_8B, "drafter": LLAMA_1B, "v_layers": [3, 16, 29]},
    "sd2-qwen3": {**SD2, "verifier": "Qwen/Qwen3-8B", "drafter": "Qwen/Qwen3-0.6B", "v_layers": [3, 18, 33]},
    "sd2-vicuna": {
        **SD2,
        "verifier": "lmsys/vicuna-13b-v1.3",
        "drafter": "JackFram/llama-160m",
        "v_layers": [3, 20, 37],
    },
    "diversed-cnndm-llama3": {**DIVERSED, "dataset": "cnndm"},
    "diversed-gsm8k-llama3": {**DIVERSED, "dataset": "gsm8k"},
    "diversed-xsum-llama3": {**DIVERSED, "dataset": "xsum"},
    "diversed-mbpp-llama3": {**DIVERSED, "dataset": "mbpp"},
    **{
        f"diversed-{data}-qwen3": {
            **DIVERSED,
            "verifier": "Qwen/Qwen3-8B",
            "drafter": "Qwen/Qwen3-0.6B",
            "dataset": data,
        }
        for data in ("cnndm", "gsm8k", "xsum", "mbpp")
    },
    "cpu-diversed-translation": {
        "verifier_kind": "embedded",
        "drafter_kind": "early_exit",
        "num_layers": 4,
        "method": "diversed",
        "gamma": 3,
        "dataset": "spec_bench",
        "temperature": 1.0,
        "device": "cpu",
    },
    "cpu-diversed-eagle": {
        "verifier_kind": "embedded",
        "drafter_kind": "drafter",
        "method": "diversed",
        "gamma": 3,
        "dataset": "spec_bench",
        "temperature": 1.0,
        "device": "cpu",
    },
    "cpu-sd-demo": {
        "verifier_kind": "embedded",
        "drafter_kind": "early_exit",
        "num_layers": 4,
        "method": "sd",
        "gamma": 3,
        "dataset": "demo",
        "temperature": 0.0,
        "device": "cpu",
    },
    "cpu-sd2": {
        "verifier_kind": "embedded",
        "drafter_kind": "early_exit",
        "num_layers": 4,
        "method": "sd2",
        "steering": "sd2",
        "v_layers": [2, 15, 27],
        "dataset": "spec_bench",
        "device": "cpu",
    },
    "llama3-70b-sd": {
        "verifier": "meta-llama/Llama-3.3-70B-Instruct",
        "drafter": LLAMA_1B,
        "method": "sd",
        "gamma": 5,
        "temperature": 0.0,
    },
    "llama3-70b-eagle3": {
        "verifier": "meta-llama/Llama-3.3-70B-Instruct",
        "drafter_kind": "drafter",
        "method": "sd",
        "gamma": 6,
    },
    **{
        f"eagle3-{family}": {
            "verifier": verifier,
            "drafter_kind": "drafter",
            "method": "eagle3",
            "gamma": 6,
            "temperature": 0.0,
            "dataset": "ultrachat",
        }
        for family, verifier in (("llama3", LLAMA_8B), ("qwen3", "Qwen/Qwen3-8B"))
    },
    "dflash-qwen3-8b": {
        "verifier": "Qwen/Qwen3-8B",
        "drafter_kind": "drafter",
        "method": "dflash",
        "gamma": 15,
        "temperature": 0.0,
        "dataset": "ultrachat",
    },
    "cpu-ensemble-sweep": {
        "verifier_kind": "embedded",
        "drafter_kind": "early_exit",
        "num_layers": 8,
        "method": "static_ensemble",
        "dataset": "demo",
        "device": "cpu",
    },
}


def presets() -> list[str]:
    return sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def test_expected_presets_exist():
    assert presets() == sorted(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_is_a_global_delta(name):
    text = (CONF / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    body = yaml.safe_load(text)
    assert all(
        entry.startswith(("override /", "/recipe/"))
        for entry in (body.get("defaults") or [])
        if isinstance(entry, str)
    )
    entries = [next(iter(e)) for e in body.get("defaults") or [] if isinstance(e, dict)]
    assert all(key.startswith("override /") for key in entries)
    assert "python launch.py" in text and f"experiment={name}" in text  # says how to run it


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_composes_with_one_override_and_validates(name, tmp_path):
    expected = PRESETS[name]
    cfg = compose_config([f"experiment={name}"])
    if expected.get("dataset") not in (None, "demo"):
        # Hub datasets are not reachable here: validate the preset against a local copy (dataset.path).
        local = tmp_path / f"{expected['dataset']}.jsonl"
        local.write_text("{}\n")
        cfg = compose_config([f"experiment={name}", f"dataset.path={local}"])
    checks = {
        "verifier": cfg.model.verifier.path,
        "drafter": cfg.model.drafter.path,
        "verifier_kind": cfg.model.verifier.kind,
        "drafter_kind": cfg.model.drafter.kind,
        "num_layers": cfg.model.drafter.num_layers,
        "method": cfg.method.name,
        "steering": cfg.steering.name,
        "v_layers": OmegaConf.to_container(cfg.steering)["v_layers"],
        "gamma": cfg.schedule.gamma,
        "temperature": cfg.gen.temperature,
        "dataset": cfg.dataset.name,
        "device": cfg.runtime.device,
    }
    for key, value in expected.items():
        assert checks[key] == value, key
    if cfg.model.verifier.kind == "hub":  # offline here: the hub model is not in the local cache
        with pytest.raises(ConfigError, match="not in the local Hugging Face cache"):
            validate(cfg)
        local = ["model/verifier=tiny-random", "model/drafter=tiny-random", "dataset=demo"]
        if expected["method"] in (
            "eagle3",
            "dflash",
        ):  # a training recipe: validate it as task=train, tiny verifier
            from specbench.config.train_checks import validate_train

            (tmp_path / "synth").mkdir()
            train = ["model/verifier=tiny-random", "task=train", f"train.data={tmp_path / 'synth'}"]
            plan = validate_train(compose_config([f"experiment={name}", *train]))
            assert plan.method == expected["method"] and plan.drafter._target_.endswith(
                f"{plan.method}_drafter"
            )
            return
        cfg = compose_config([f"experiment={name}", *local])
    plan = validate(cfg)
    assert plan.method == expected["method"] and str(plan.device) == "cpu"


@pytest.mark.parametrize("name", ["sd2-llama3", "sd2-qwen3", "sd2-vicuna"])
def test_sd2_presets_carry_the_paper_recipe(name):
    cfg = compose_config([f"experiment={name}"])
    train = cfg.train
    assert (train.batch_size, train.lr_start, train.lr_end, train.warmup_steps, train.grad_clip) == (
        24, 1e-5, 1e-6, 1000, 0.5
    )
    assert (train.loss, train.max_offset, cfg.synth.target_len, cfg.synth.temperature) == ("kl", 8, 256, 1.0)
    assert (cfg.dataset.name, cfg.steering.finetune_drafter) == ("ultrachat", "full")


def test_dflash_preset_carries_the_zlab_qwen3_8b_recipe():
    train = compose_config(["experiment=dflash-qwen3-8b"]).train
    assert (train.dflash_layers, list(train.dflash_taps), train.dflash_block_size) == (
        5,
        [1, 9, 17, 25, 33],
        16,
    )
    assert (train.dflash_mask_token_id, train.dflash_anchors, train.dflash_loss_gamma) == (151669, 512, 7.0)
    assert (train.lr_start, train.grad_clip, train.warmup_steps / train.max_steps) == (6e-4, 1.0, 0.04)


def test_command_line_overrides_win_over_a_preset():
    cfg = compose_config(["experiment=sd2-llama3", "schedule.gamma=5", "steering.v_layers=[2,10,20]"])
    assert cfg.schedule.gamma == 5 and list(cfg.steering.v_layers) == [2, 10, 20]
    cfg = compose_config(
        ["experiment=cpu-sd-demo", "model/drafter=tiny-random", "model/verifier=tiny-random"]
    )
    assert cfg.model.drafter.kind == cfg.model.verifier.kind == "tiny_random"


def test_ensemble_preset_defines_its_sweep_grid():
    cfg = compose_config(["experiment=cpu-ensemble-sweep"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params == {"method.draft_weight": "0.0,0.25,0.5,0.75,1.0"}
    assert cfg.method.draft_weight == 0.3  # one run without -m
    assert (cfg.dataset.limit, cfg.gen.max_new_tokens) == (4, 32)


@pytest.mark.slow
def test_cpu_sd_demo_runs_end_to_end(tmp_path):
    from specbench.tasks.eval import EvalTask

    out = tmp_path / "out"
    metrics = EvalTask(
        compose_config(
            ["experiment=cpu-sd-demo", "gen.max_new_tokens=4", "dataset.limit=2", f"eval.output_dir={out}"]
        )
    ).run()
    assert (metrics["method"], metrics["gamma"], metrics["num_samples"]) == ("sd", 3, 2)
    assert metrics["drafter"].endswith("(early exit)") and metrics["baseline_match_rate"] == 1.0
    assert (out / "samples.jsonl").is_file()


@pytest.mark.slow
def test_cpu_ensemble_sweep_runs_its_grid_and_reports(tmp_path):
    """The documented flow: `-m experiment=cpu-ensemble-sweep`, then task=report on the sweep dir."""
    mlflow_env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    sweep_dir, report_dir = tmp_path / "sweep", tmp_path / "report"
    for args in (
        ["-m", "experiment=cpu-ensemble-sweep", "gen.max_new_tokens=3", "dataset.limit=1",
         "eval.warmup=false", f"hydra.sweep.dir={sweep_dir}"],
        ["task=report", f"task.sweep_dir={sweep_dir}", f"hydra.run.dir={report_dir}"],
    ):  # fmt: skip
        proc = launch(args, env_extra=mlflow_env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    weights = sorted(
        json.loads(p.read_text())["method_draft_weight"] for p in sweep_dir.glob("*/metrics.json")
    )
    assert weights == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert len((report_dir / "report.csv").read_text().splitlines()) == 1 + 5


def test_gpu_preset_from_the_command_line_stops_with_one_line(tmp_path):
    proc = launch(
        ["experiment=sd2-llama3", f"hydra.run.dir={tmp_path / 'run'}"],
        env_extra={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "Config error: model.verifier.path: 'meta-llama/Llama-3.1-8B-Instruct' is not in the local"
    )
    assert "huggingface-cli download" in last and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()
