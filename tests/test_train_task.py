"""task=train through launch.py: synth → train (sd2, distill, ddp) → eval, tracked in MLflow; bad input."""

from __future__ import annotations

import json

import pytest
from helpers import compose_config, launch

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError
from specbench.config.validate import validate_train

TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random", "runtime.num_threads=1"]
SD2 = ["method=sd2", "steering=sd2", "steering.v_layers=[0,1,2]"]
SHORT = [
    "train.max_steps=4",
    "train.batch_size=2",
    "train.val_every_steps=2",
    "train.checkpoint_every_steps=2",
]


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    proc = launch(
        ["task=synth", *TINY, "dataset=demo", "synth.target_len=120", "synth.max_prompt_len=100",
         f"synth.output_dir={out}", f"hydra.run.dir={out / 'hydra'}"],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def runs(uri, experiment):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    return client, client.search_runs([found.experiment_id]) if found else []


def test_sd2_and_distill_train_then_evaluate(synth_dir, tmp_path, mlflow_uri):
    sd2_dir, distill_dir = tmp_path / "sd2", tmp_path / "distill"
    for method, out in ((SD2, sd2_dir), (["method=distill", "steering=none"], distill_dir)):
        proc = launch(
            ["task=train", *TINY, *method, *SHORT, f"train.data={synth_dir}", f"train.output_dir={out}",
             f"hydra.run.dir={out / 'hydra'}"],
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (out / "trained.pt").is_file() and (out / "checkpoints" / "last.ckpt").is_file()
        summary = json.loads((out / "train_metrics.json").read_text())
        assert summary["global_step"] == 4 and summary["final_val_tau"] >= 1.0
    client, train_runs = runs(mlflow_uri, "specbench-train")
    assert len(train_runs) == 2 and {r.info.status for r in train_runs} == {"FINISHED"}
    for run in train_runs:  # Lightning's logger wrote into the task's own run, step by step
        history = client.get_metric_history(run.info.run_id, "train/loss")
        assert sorted(m.step for m in history) == [0, 1, 2, 3]  # every step of the 4
        assert "val/tau" in run.data.metrics and run.data.params["train.max_steps"] == "4"
    for number, extra in enumerate((
        [*SD2, f"steering.checkpoint={sd2_dir / 'trained.pt'}"],
        ["method=distill", f"method.drafter_checkpoint={distill_dir / 'trained.pt'}"],
    )):
        eval_dir = tmp_path / f"eval-{number}"
        proc = launch(
            [*TINY, *extra, "gen.max_new_tokens=8", "dataset.limit=2", f"eval.output_dir={eval_dir}"],
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics = json.loads((eval_dir / "metrics.json").read_text())
        assert metrics["baseline_match_rate"] == 1.0  # lossless with a trained drafter / steering
        assert metrics["method_checkpoint"].endswith("trained.pt")
    # The sd2 checkpoint under method=distill: one line naming the problem.
    proc = launch([*TINY, "method=distill", f"method.drafter_checkpoint={sd2_dir / 'trained.pt'}",
                   f"eval.output_dir={tmp_path / 'wrong'}"])
    assert proc.returncode == 2 and "is a method='sd2' checkpoint, not method='distill'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dflash_trains_then_decodes_losslessly_through_launch(synth_dir, tmp_path):
    out = tmp_path / "dflash"
    dflash = ["method=dflash", "model/drafter=dflash", "steering=none"]
    proc = launch(
        ["task=train", *TINY, *dflash, *SHORT, "train.dflash_taps=[0]", "train.dflash_block_size=4",
         "train.dflash_anchors=4", f"train.data={synth_dir}", f"train.output_dir={out}",
         f"hydra.run.dir={out / 'hydra'}"],
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "train_metrics.json").read_text())
    assert summary["global_step"] == 4 and summary["final_val_tau"] >= 1.0 and "final_val_acc_pos3" in summary
    eval_dir = tmp_path / "eval"
    proc = launch(
        [*TINY, *dflash, f"model.drafter.params.path={out / 'trained.pt'}", "gen.max_new_tokens=8",
         "dataset.limit=2", f"eval.output_dir={eval_dir}"],
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((eval_dir / "metrics.json").read_text())
    assert metrics["baseline_match_rate"] == 1.0
    proc = launch([*TINY, *dflash, f"eval.output_dir={tmp_path / 'none'}"])
    assert proc.returncode == 2 and "model.drafter.params.path is null" in proc.stderr
    proc = launch([*TINY, "method=dflash", f"eval.output_dir={tmp_path / 'wrong'}"])
    assert proc.returncode == 2 and "method=dflash decodes with a DFlash drafter" in proc.stderr


def test_a_killed_training_job_rerun_resumes_from_last_ckpt(synth_dir, tmp_path, mlflow_uri):
    """What a SLURM requeue does: the same command again, into the same output dir, after a kill."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers import ROOT

    out = tmp_path / "run"
    args = ["task=train", *TINY, *SD2, "train.max_steps=40", "train.batch_size=2", "train.val_every_steps=50",
            "train.checkpoint_every_steps=2", f"train.data={synth_dir}", f"train.output_dir={out}",
            f"hydra.run.dir={out / 'hydra'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), *args], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = out / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + 240
        while not last.exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    import torch

    step_at_kill = torch.load(last, weights_only=True)["global_step"]
    assert 2 <= step_at_kill < 40
    proc = launch(args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {last}" in proc.stdout
    assert json.loads((out / "train_metrics.json").read_text())["global_step"] == 40
    _, train_runs = runs(mlflow_uri, "specbench-train")
    assert len(train_runs) == 1 and train_runs[0].info.status == "FINISHED"
    assert train_runs[0].data.tags["specbench.reopened"] == "true"
    assert train_runs[0].data.tags["specbench.resumed_from"] == str(last)


def test_select_by_ships_the_best_validation_step_and_keeps_it_across_a_resume(synth_dir, tmp_path,
                                                                               mlflow_uri):  # fmt: skip
    import torch

    out = tmp_path / "run"
    args = ["task=train", *TINY, "method=distill", "steering=none", "train.batch_size=2",
            "train.lr_start=3e-3", "train.warmup_steps=1", "train.val_every_steps=1",
            "train.checkpoint_every_steps=1", "train.val_prompts=0", "train.select_by=val/loss",
            "train.select_mode=max", f"train.data={synth_dir}", f"train.output_dir={out}",
            f"hydra.run.dir={out / 'hydra'}"]  # fmt: skip
    # max of a falling loss: the best step is an early one, so the resumed run must remember it
    for steps in (4, 7):  # the second run resumes the first's last.ckpt
        proc = launch([*args, f"train.max_steps={steps}"], timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    client, train_runs = runs(mlflow_uri, "specbench-train")
    history = {m.step: m.value for run in train_runs
               for m in client.get_metric_history(run.info.run_id, "val/loss")}  # fmt: skip
    assert len(history) == 7  # one validation per step, both runs
    trained = torch.load(out / "trained.pt", weights_only=True)
    chosen = trained["specbench"]["selected_by"]
    assert chosen["metric"] == "val/loss" and chosen["value"] == pytest.approx(max(history.values()))
    best_step = trained["specbench"]["global_step"]
    assert history[best_step - 1] == pytest.approx(chosen["value"])  # Lightning logs step k's val at k - 1
    summary = json.loads((out / "train_metrics.json").read_text())
    assert summary["selected_step"] == best_step and summary["global_step"] == 7
    final = torch.load(out / "final.pt", weights_only=True)
    assert final["specbench"]["global_step"] == 7 and "selected_by" not in final["specbench"]
    assert best_step <= 4 and max(history, key=history.get) < 4  # chosen in the first run, kept by the second
    assert any(not torch.equal(final["state_dict"][k], v) for k, v in trained["state_dict"].items())
    proc = launch([*args, "train.max_steps=8", "train.select_by=val/nope"], timeout=300)
    assert proc.returncode != 0 and "train.select_by=val/nope: validation did not log it" in proc.stderr
    assert "val/loss" in proc.stderr and (out / "checkpoints" / "last.ckpt").is_file()


def test_ddp_on_two_cpu_processes(synth_dir, tmp_path):
    out = tmp_path / "ddp"
    proc = launch(
        [
            "task=train",
            *TINY,
            *SD2,
            *SHORT,
            "train.devices=2",
            "train.strategy=ddp",
            f"train.data={synth_dir}",
            f"train.output_dir={out}",
            f"hydra.run.dir={out / 'hydra'}",
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Starting with 2 processes" in proc.stdout + proc.stderr
    assert json.loads((out / "train_metrics.json").read_text())["global_step"] == 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["method=sd"], "task=train trains method=sd2, distill, diversed, eagle3 or dflash"),
        (
            ["method=dflash", "train.data=."],
            "task=train method=dflash trains a DFlash drafter: add model/drafter=dflash",
        ),
        (
            ["method=dflash", "model/drafter=dflash", "train.data=.", "train.dflash_block_size=1"],
            "train.dflash_block_size must be >= 2",
        ),
        (
            ["method=dflash", "model/drafter=dflash", "train.data=.", "train.dflash_loss_gamma=0"],
            "train.dflash_loss_gamma must be > 0 or null",
        ),
        (
            ["method=dflash", "model/drafter=dflash", "train.data=.", "model.drafter.params.path=x.pt"],
            "task=train method=dflash trains a new drafter; model.drafter.params.path must be null",
        ),
        (
            ["method=sd2", "steering=none"],
            "task=train method=sd2 trains an SD² steering head: add steering=sd2",
        ),
        ([*SD2], "task=train method=sd2 needs train.data=DIR"),
        ([*SD2, "train.data=/no/such/dir"], "train.data: '/no/such/dir' does not exist"),
        (["method=distill", "steering.finetune_drafter=none", "train.data=."], "would train nothing"),
        ([*SD2, "train.data=.", "train.loss=mse"], "train.loss: unknown 'mse'"),
        ([*SD2, "train.data=.", "train.lr_end=1"], "train.lr_end (1.0) must be <= train.lr_start"),
        ([*SD2, "train.data=.", "train.max_offset=0"], "train.max_offset must be >= 1"),
        ([*SD2, "train.data=.", "train.baseline_ema=1"], "train.baseline_ema must be in [0, 1)"),
        ([*SD2, "train.data=.", "model/drafter=none"], "model.drafter.kind is 'none'"),
        (
            ["method=eagle3", "train.data=."],
            "task=train method=eagle3 trains an EAGLE-3 head: add model/drafter=eagle3",
        ),
        (
            ["method=eagle3", "model/drafter=eagle3", "train.data=.", "train.init_layer=copy"],
            "train.init_layer must be one of ['random', 'verifier_last']",
        ),
        (
            ["method=eagle3", "model/drafter=eagle3", "train.data=.", "train.ttt_chain_fraction=0"],
            "train.ttt_chain_fraction must be in (0, 1]",
        ),
        (
            ["method=eagle3", "model/drafter=eagle3", "train.data=.", "train.init_head=/no/head.pt"],
            "train.init_head: '/no/head.pt' is not a file; pass the trained.pt or last.ckpt",
        ),
        (
            [
                "method=eagle3",
                "model/drafter=eagle3",
                "train.data=.",
                "train.init_head=launch.py",
                "train.init_layer=verifier_last",
            ],
            "train.init_head and train.init_layer both set",
        ),
        (
            ["method=distill", "steering=none", "train.data=.", "train.select_by=loss"],
            "train.select_by must name a validation metric (val/..., e.g. val/tau_estimate), got 'loss'",
        ),
        (
            ["method=distill", "steering=none", "train.data=.", "train.select_by=val/tau",
             "train.select_mode=up"],
            "train.select_mode must be max or min, got 'up'",
        ),
    ],
)
def test_bad_training_config_names_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        validate_train(compose_config(["task=train", *TINY, *overrides]))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_data_from_another_verifier_is_refused(synth_dir, tmp_path):
    proc = launch(
        ["task=train", *TINY, *SD2, *SHORT, "model.verifier.seed=3", "model.verifier.name=other-verifier",
         f"train.data={synth_dir}", f"train.output_dir={tmp_path / 'x'}", f"hydra.run.dir={tmp_path / 'h'}"],
        timeout=300,
    )
    assert (
        proc.returncode == 2 and "was sampled from verifier" in proc.stderr and "Traceback" not in proc.stderr
    )


def test_the_training_console_is_progress_and_results(tmp_path, mlflow_uri):
    """DIVERSED training on the console: step lines, validation lines, the result; no duplicated INFO lines,
    no Lightning tips or accelerator lines, no ``Epoch 1/-2`` bar, no 12-line checkpoint warning."""
    data = tmp_path / "say.jsonl"
    words = ["hello", "cat", "dog", "the sun", "blue sky", "red", "one two", "green tea"]
    data.write_text("".join(json.dumps({"id": i, "prompt": f"Say {w}", "reference": w}) + "\n"
                            for i, w in enumerate(words)))  # fmt: skip
    out = tmp_path / "out"
    proc = launch(
        ["task=train", *TINY, "method=diversed", "dataset=jsonl", f"dataset.path={data}",
         "dataset.metric=bleu", "gen.max_new_tokens=6", "train.val_prompts=2", *SHORT,
         f"train.output_dir={out}", f"hydra.run.dir={out / 'hydra'}"],
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert [line.split()[0] for line in console] == [
        "step", "step", "validation", "step", "step", "validation", "trained", "evaluate"
    ], console  # fmt: skip
    assert console[3].startswith("step 3/4  ") and "mean_draft_weight 0.5" in console[3]
    assert console[-2] == f"trained diversed: step 4, checkpoint {out / 'trained.pt'}"
    assert console[-1].startswith(
        "evaluate it: python launch.py model/verifier=tiny-random model/drafter=tiny-random"
    )
    assert console[-1].endswith(
        f"dataset.metric=bleu gen.max_new_tokens=6 method.head_checkpoint={out / 'trained.pt'}"
    )


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_trains_float32_weights_on_a_cpu_even_with_native_bf16(monkeypatch, tmp_path, native):
    import torch

    from specbench.models import devices

    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: native)
    overrides = ["task=train", *TINY, *SD2, "runtime.device=cpu", f"train.data={tmp_path}"]
    assert validate_train(compose_config([*overrides, "runtime.dtype=auto"])).dtype is torch.float32
    assert validate_train(compose_config([*overrides, "runtime.dtype=bfloat16"])).dtype is torch.bfloat16
