"""EvalTask end to end on the tiny random pair, the evaluation library, and launch.py in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import compose_config, launch
from omegaconf import OmegaConf

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError
from specbench.decoding import DraftSchedule, GenerationSettings, VerificationRule
from specbench.evaluation import build_engines, compare, eos_token_ids, evaluate, pad_token_id
from specbench.models import ModelSpec, load_verifier
from specbench.pairs import load_drafter
from specbench.tasks.eval import EvalTask
from specbench.tasks.eval_files import SampleWriter
from specbench.tasks.results import format_table

TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random", "gen.max_new_tokens=8", "dataset.limit=3"]
REQUIRED_METRICS = {
    "tau",
    "acceptance_rate",
    "tokens_per_s",
    "new_tokens",
    "verifier_forwards",
    "num_samples",
    "method",
    "verifier",
    "drafter",
    "gamma",
    "schedule",
    "prompt_format",
}
SAMPLE_KEYS = {"id", "prompt", "output_ids", "output_text", "rounds", "tokens_per_s"}


def run_task(tmp_path: Path, overrides: list[str]) -> tuple[dict, list[dict], Path]:
    out = tmp_path / "out"
    metrics = EvalTask(compose_config([*TINY, f"eval.output_dir={out}", *overrides])).run()
    written = json.loads((out / "metrics.json").read_text())
    assert written == pytest.approx(metrics)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return written, samples, out


def check_consistent(metrics: dict, samples: list[dict], max_new_tokens: int) -> None:
    assert REQUIRED_METRICS <= metrics.keys()
    assert all(not isinstance(v, (dict, list)) for v in metrics.values()), "metrics.json must be flat"
    assert metrics["num_samples"] == len(samples)
    rounds = [r for s in samples for r in s["rounds"]]
    for sample in samples:
        assert SAMPLE_KEYS <= sample.keys()
        # Every round emits its accepted drafts + 1 token; only the last can be cut by EOS or the limit.
        assert sum(accepted + 1 for _, accepted in sample["rounds"]) - len(sample["output_ids"]) in (0, 1)
        assert 1 <= len(sample["output_ids"]) <= max_new_tokens
        assert all(0 <= accepted <= drafted for drafted, accepted in sample["rounds"])
    assert metrics["new_tokens"] == sum(len(s["output_ids"]) for s in samples)
    assert metrics["verifier_forwards"] == len(rounds)
    assert metrics["tau"] >= 1.0
    assert metrics["tau"] == pytest.approx(metrics["new_tokens"] / metrics["verifier_forwards"])
    drafted = sum(r[0] for r in rounds)
    if drafted:
        assert metrics["acceptance_rate"] == pytest.approx(sum(r[1] for r in rounds) / drafted)
    assert metrics["tokens_per_s"] == pytest.approx(metrics["new_tokens"] / metrics["wall_time_s"])


def test_eval_task_writes_metrics_and_samples(tmp_path, capsys):
    metrics, samples, out = run_task(tmp_path, [])
    check_consistent(metrics, samples, max_new_tokens=8)
    assert (metrics["method"], metrics["schedule"], metrics["gamma"]) == ("sd", "constant", 3)
    assert (metrics["verifier"], metrics["drafter"]) == ("tiny-random-llama", "tiny-random-llama-drafter")
    assert metrics["prompt_format"] == "chat"
    assert metrics["speedup"] == pytest.approx(metrics["tokens_per_s"] / metrics["baseline_tokens_per_s"])
    assert metrics["baseline_match_rate"] == 1.0  # greedy exact SD reproduces the verifier
    assert [s["id"] for s in samples] == ["capital", "haiku", "explain-photosynthesis"]
    assert all(s["matches_baseline"] for s in samples)
    assert OmegaConf.load(out / "config.yaml").model.verifier.kind == "tiny_random"
    printed = capsys.readouterr().out
    assert "autoregressive" in printed and "speedup" in printed and str(out) in printed


def test_eval_task_method_auto_has_speedup_one(tmp_path):
    metrics, samples, _ = run_task(tmp_path, ["method=auto", "model/drafter=none"])
    check_consistent(metrics, samples, max_new_tokens=8)
    assert metrics["speedup"] == 1.0 and metrics["tau"] == 1.0
    assert metrics["drafter"] == "none" and "baseline_new_tokens" not in metrics
    assert all(drafted == 0 for s in samples for drafted, _ in s["rounds"])


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_eval_task_without_baseline_batched_lossy(tmp_path, restore_threads):
    metrics, samples, _ = run_task(
        tmp_path,
        [
            "eval.baseline=false",
            "gen.batch_size=2",
            "method=lossy",
            "schedule=heuristic",
            "eval.warmup=false",
            "runtime.num_threads=1",
        ],
    )
    check_consistent(metrics, samples, max_new_tokens=8)
    assert "speedup" not in metrics and "baseline_tokens_per_s" not in metrics
    assert (metrics["method"], metrics["method_lenience"], metrics["batch_size"]) == ("lossy", 0.5, 2)
    assert metrics["num_threads"] == 1


def test_eval_task_on_a_jsonl_file(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question_id": i, "turns": [f"Question {i}?", "more"]}) + "\n"
            for i in (11, 12, 13, 14)
        )
    )
    metrics, samples, _ = run_task(tmp_path, ["dataset=jsonl", f"dataset.path={path}", "dataset.limit=2"])
    assert [s["id"] for s in samples] == [11, 12]
    assert [s["prompt"] for s in samples] == ["Question 11?", "Question 12?"]
    assert (metrics["dataset"], metrics["dataset_path"]) == ("jsonl", str(path))


def test_bad_config_fails_before_anything_is_loaded_or_written(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="schedule.gamma"):
        EvalTask(compose_config([*TINY, f"eval.output_dir={out}", "schedule.gamma=0"])).run()
    assert not out.exists()


def test_corrupt_dataset_fails_before_models_load(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": \n')
    with pytest.raises(ConfigError, match=r"dataset.path: .*bad.jsonl:2"):
        EvalTask(
            compose_config([*TINY, "dataset=jsonl", f"dataset.path={path}", f"eval.output_dir={tmp_path}"])
        ).run()
    assert not (tmp_path / "samples.jsonl").exists()


def test_output_dir_is_required_outside_hydra():
    with pytest.raises(ConfigError, match="eval.output_dir"):
        EvalTask(compose_config(TINY)).run()


@pytest.fixture(scope="module")
def tiny_pair():
    verifier = load_verifier(ModelSpec(kind="tiny_random", seed=0), "cpu", "float32")
    drafter = load_drafter(ModelSpec(kind="tiny_random", seed=1, num_layers=1), verifier, "cpu", "float32")
    return verifier, drafter


def test_eos_and_pad_ids(tiny_pair):
    verifier, _ = tiny_pair
    verifier.model.generation_config.eos_token_id = [5, 258]
    try:
        assert eos_token_ids(verifier.model, verifier.tokenizer) == [5, 258]
    finally:
        verifier.model.generation_config.eos_token_id = 258
    assert pad_token_id(verifier.tokenizer, [258]) == verifier.tokenizer.pad_token_id == 256


def test_evaluate_and_compare(tiny_pair, tmp_path):
    verifier, drafter = tiny_pair
    settings = GenerationSettings(max_new_tokens=6)
    engine, baseline = build_engines(verifier, drafter, VerificationRule(), DraftSchedule(gamma=2), settings)
    assert baseline is not None and baseline.drafter is None and engine.drafter is not None
    prompts = [verifier.tokenizer(t)["input_ids"] for t in ("abc", "hello there", "xyz")]
    run = evaluate(baseline, prompts, batch_size=2, progress=False)
    assert len(run.results) == 3 and run.wall_time > 0
    assert run.wall_time == pytest.approx(run.results[0].wall_time + run.results[2].wall_time)

    path = tmp_path / "samples.jsonl"
    seen: list[int] = []
    with open(path, "w") as handle:
        writer = SampleWriter(
            handle,
            [type("P", (), {"id": i, "text": "t", "category": None, "reference": None})() for i in range(3)],
            verifier.tokenizer,
        )

        def on_batch(indices, results, reference):
            writer(indices, results, reference)
            seen.extend(indices)
            assert len(path.read_text().splitlines()) == len(seen)  # flushed batch by batch

        comparison = compare(engine, prompts, baseline, batch_size=2, progress=False, on_batch=on_batch)
    assert seen == [0, 1, 2]
    assert [r.output_ids for r in comparison.method.results] == [r.output_ids for r in run.results]
    assert comparison.metrics["baseline_match_rate"] == 1.0
    assert comparison.metrics["speedup"] == pytest.approx(
        comparison.method.tokens_per_s / comparison.baseline.tokens_per_s
    )


def test_format_table_rows():
    metrics = {
        "method": "sd",
        "schedule": "constant",
        "gamma": 3,
        "tau": 2.5,
        "acceptance_rate": 0.5,
        "tokens_per_s": 30.0,
        "speedup": 1.5,
        "baseline_new_tokens": 10,
        "baseline_tokens_per_s": 20.0,
        "baseline_wall_time_s": 0.5,
        "verifier": "v",
        "drafter": "d",
        "num_samples": 2,
        "prompt_format": "chat",
        "new_tokens": 10,
        "wall_time_s": 0.3,
    }
    lines = format_table(metrics).splitlines()
    assert lines[2].split()[-4:] == ["2.50", "0.500", "30.0", "1.50x"]
    assert lines[3].split() == ["autoregressive", "1.00", "-", "20.0", "1.00x"]


@pytest.mark.parametrize(
    "rate, line",
    [
        (1.0, "outputs identical to autoregressive decoding: 100% of prompts"),
        (0.5, "outputs identical to autoregressive decoding: 50% of prompts (a"),
    ],
)
def test_the_table_says_whether_outputs_equal_autoregressive_decoding_and_where_it_ran(rate, line):
    metrics = {"method": "sd", "schedule": "constant", "gamma": 10, "tau": 1.4, "acceptance_rate": 0.3,
               "tokens_per_s": 25.0, "speedup": 1.4, "baseline_new_tokens": 10, "baseline_tokens_per_s": 18.0,
               "baseline_wall_time_s": 0.5, "verifier": "v", "drafter": "d", "num_samples": 2,
               "prompt_format": "chat", "new_tokens": 10, "wall_time_s": 0.3, "device": "cpu",
               "dtype": "bfloat16", "baseline_match_rate": rate}  # fmt: skip
    lines = format_table(metrics).splitlines()
    assert lines[-1].startswith(line)
    assert lines[-2].endswith("(+ baseline 0.50 s)") and " on cpu in bfloat16 " in lines[-2]
    del metrics["baseline_match_rate"]  # sampled: nothing to compare
    assert not format_table(metrics).splitlines()[-1].startswith("outputs identical")


def test_launch_subprocess_runs_the_tiny_pair(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(
        [
            "model/verifier=tiny-random",
            "model/drafter=tiny-random",
            "gen.max_new_tokens=8",
            "dataset.limit=2",
            f"hydra.run.dir={run_dir}",
        ],
        cache_dir=tmp_path / "cache",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "autoregressive" in proc.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert REQUIRED_METRICS <= metrics.keys() and metrics["num_samples"] == 2
    assert len((run_dir / "samples.jsonl").read_text().splitlines()) == 2
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert not (tmp_path / "cache").exists()  # nothing embedded was converted or loaded


def test_launch_subprocess_bad_override(tmp_path):
    proc = launch(
        [
            "model/verifier=tiny-random",
            "model/drafter=tiny-random",
            "schedule.gamma=0",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cache_dir=tmp_path / "cache",
    )
    assert proc.returncode != 0
    assert "schedule.gamma" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
def test_launch_default_embedded_pair(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["gen.max_new_tokens=16", "dataset.limit=2", f"hydra.run.dir={run_dir}"], timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["verifier"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    # the default drafter: the suffix drafter with the committed EAGLE-3 head as fallback, gamma 10
    assert metrics["drafter"] == "suffix-eagle3-smollm2-135m" and metrics["gamma"] == 10
    assert metrics["num_samples"] == 2 and metrics["prompt_format"] == "chat"
    assert metrics["tau"] > 1.0 and metrics["baseline_match_rate"] == 1.0
    from specbench.models.devices import cpu_has_native_bf16

    assert metrics["dtype"] == ("bfloat16" if cpu_has_native_bf16() else "float32")  # runtime.dtype=auto
    assert f"dtype {metrics['dtype']} (runtime.dtype=auto: " in proc.stdout
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert "Paris" in samples[0]["output_text"]


def test_the_table_names_the_method_parameters_and_stays_aligned_for_long_labels():
    from specbench.tasks.results import format_table

    base = {"schedule": "constant", "gamma": 3, "tau": 2.5, "acceptance_rate": 0.5, "tokens_per_s": 30.0,
            "speedup": 1.5, "baseline_new_tokens": 10, "baseline_tokens_per_s": 20.0,
            "baseline_wall_time_s": 0.5, "verifier": "v", "drafter": "d", "num_samples": 2,
            "prompt_format": "chat", "new_tokens": 10, "wall_time_s": 0.3}  # fmt: skip
    ensemble = {
        **base,
        "method": "static_ensemble",
        "method_draft_weight": 0.30000000000000004,
        "method_pool": "linear",
    }
    lossy = {**base, "method": "lossy", "method_lenience": 0.5}
    cascade = {
        **base,
        "method": "cascade",
        "method_deferral": "chow",
        "method_alpha": 0.1,
        "schedule": "dynamic",
    }
    diversed = {
        **base,
        "method": "diversed",
        "method_checkpoint": "none (untrained)",
        "untrained": "x is null",
    }
    labels = {}
    for metrics in (ensemble, lossy, cascade, diversed):
        lines = format_table(metrics).splitlines()
        header, method_row, baseline_row = lines[0], lines[2], lines[3]
        labels[metrics["method"]] = method_row[: header.index("tau") - 3].strip()
        # every row puts its numbers under the header's columns, however long the label
        for row in (method_row, baseline_row):
            assert len(row) == len(header)
            assert row[: header.index(" tau") + 4].rstrip().endswith(("2.50", "1.00"))
    assert labels == {
        "static_ensemble": "static_ensemble w=0.3 (constant, gamma=3)",
        "lossy": "lossy lenience=0.5 (constant, gamma=3)",
        "cascade": "cascade deferral=chow alpha=0.1 (dynamic, gamma=3)",
        "diversed": "diversed untrained (constant, gamma=3)",
    }
    assert format_table(diversed).splitlines()[-1] == "note: x is null"


@pytest.mark.slow
def test_launch_the_lookup_tree_preset_decodes_as_autoregressive_decoding(tmp_path):
    """model/drafter=suffix-pl-eagle3-smollm2 as typed: trees of two lookups' chains, outputs identical."""
    run_dir = tmp_path / "run"
    proc = launch(
        ["model/drafter=suffix-pl-eagle3-smollm2", "dataset=spec_bench", "dataset.limit=2",
         "gen.max_new_tokens=24", f"hydra.run.dir={run_dir}"],
        timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["drafter"] == "suffix-pl-eagle3-smollm2-135m"
    assert metrics["tau"] > 1.0 and metrics["baseline_match_rate"] == 1.0
