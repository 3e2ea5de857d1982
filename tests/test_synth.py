"""``task=synth`` (methods.md §6): rows and masks, validation split, shards and merging, crash-safe resume,
mismatch errors, config checks, and launch.py end to end with MLflow, on the tiny random verifier."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from helpers import compose_config, launch

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError
from specbench.config.validate import validate_synth
from specbench.data.dataset_config import dataset_settings
from specbench.data.datasets import encode_sample, load_dataset_prompts
from specbench.data.synth_dataset import METADATA_FILE, dataset_path, load_synthetic, save_dataset
from specbench.data.synth_rows import SynthDataError, make_row, read_rows, rows_path, split_rows
from specbench.models import ModelSpec, load_verifier
from specbench.pipelines.synth_plan import SynthSettings, batch_seed, plan_batches
from specbench.pipelines.synthesize import synthesize
from specbench.tasks.synth import SynthTask

# Demo prompts encode to 48..67 tokens with the byte tokenizer; "summarize" (184) is skipped.
SETTINGS = SynthSettings(target_len=88, max_prompt_len=80, batch_size=3, validation_fraction=0.2, seed=7)
TINY_SPEC = ModelSpec(
    kind="tiny_random", name="tiny-random-llama", num_layers=2
)  # as model/verifier=tiny-random
DEMO = dataset_settings({"name": "demo"})


class Crash(RuntimeError):
    pass


@pytest.fixture(scope="module")
def verifier():
    return load_verifier(TINY_SPEC, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def prompts():
    return load_dataset_prompts(DEMO)


@pytest.fixture(scope="module")
def baseline(verifier, prompts, tmp_path_factory):
    """One uninterrupted run of SETTINGS over the demo prompts."""
    out = tmp_path_factory.mktemp("baseline")
    result = synthesize(verifier, prompts, SETTINGS, out, dataset=DEMO, progress=False)
    return out, result


def run(verifier, prompts, out: Path, settings: SynthSettings = SETTINGS, **kwargs):
    return synthesize(verifier, prompts, settings, out, dataset=DEMO, progress=False, **kwargs)


def all_rows(data) -> list[dict]:
    rows = [dict(r) for split in ("train", "validation") for r in data[split]]
    return sorted(rows, key=lambda r: r["source_index"])


def test_rows_masks_and_metadata(verifier, prompts, baseline):
    out, result = baseline
    data, meta = load_synthetic(out)
    rows = all_rows(data)
    assert [r["source_index"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]  # 7 ("summarize") is too long
    assert meta["skipped_prompts"] == 1 and result.metadata["skipped_source_indices"] == [7]
    for row in rows:
        prompt_ids, _ = encode_sample(verifier.tokenizer, prompts[row["source_index"]], "auto")
        assert row["input_ids"][: row["prompt_len"]] == prompt_ids
        assert row["prompt_len"] == len(prompt_ids)
        assert len(row["input_ids"]) == len(row["loss_mask"]) <= SETTINGS.target_len
        assert row["loss_mask"] == [0] * row["prompt_len"] + [1] * (len(row["input_ids"]) - row["prompt_len"])
        assert sum(row["loss_mask"]) >= 1
        assert row["source_id"] == str(prompts[row["source_index"]].id)
        if not row["finished_by_eos"]:
            assert len(row["input_ids"]) == SETTINGS.target_len  # no EOS: the row fills target_len
    assert meta["rows"] == 7 and meta["tokens"] == sum(len(r["input_ids"]) for r in rows)
    assert meta["generated_tokens"] == sum(sum(r["loss_mask"]) for r in rows)
    part = meta["parts"][0]
    assert part["verifier"] == "tiny-random-llama" and part["tokenizer_hash"] == meta["tokenizer_hash"]
    assert part["sampling"] == {"temperature": 1.0, "top_k": 0, "top_p": 1.0} and part["seed"] == 7
    assert part["dataset"]["dataset_source"] == "bundled" and part["prompt_format"] == "chat"
    assert (part["shard_id"], part["num_shards"], part["target_len"]) == (0, 1, 88)
    # validation: non-empty, disjoint from train, decided by source id
    train_ids = {r["source_id"] for r in data["train"]}
    validation_ids = {r["source_id"] for r in data["validation"]}
    assert validation_ids and train_ids and not train_ids & validation_ids
    summary = result.summary()
    assert summary["rows"] == 7 and summary["skipped"] == 1 and summary["tokens_per_s"] > 0


def test_rows_ending_with_eos(prompts, tmp_path):
    verifier = load_verifier(TINY_SPEC, device="cpu", dtype="float32")
    eos = sorted(set(range(0, 256, 5)) | {258})  # about one token in five ends a row
    verifier.model.generation_config.eos_token_id = eos
    result = run(verifier, prompts, tmp_path)
    rows = read_rows(rows_path(tmp_path))
    ended = [r for r in rows if r["finished_by_eos"]]
    assert ended and result.metadata["finished_by_eos"] == len(ended)
    for row in rows:
        generated = row["input_ids"][row["prompt_len"] :]
        assert not any(t in eos for t in generated[:-1])  # nothing after an EOS
        assert row["finished_by_eos"] == (generated[-1] in eos)
        assert sum(row["loss_mask"]) == len(generated)  # the EOS token is in the loss


def test_split_batches_and_row_helpers():
    rows = [{"source_id": str(i), "source_index": i} for i in range(40)]
    train, validation = split_rows(rows, 0.25)
    assert validation and train and len(train) + len(validation) == 40
    assert split_rows(rows, 0.25) == (train, validation)  # stable
    two = rows[:2]
    assert [len(part) for part in split_rows(two, 0.01)] == [1, 1]  # >= 1 validation row
    assert [len(part) for part in split_rows(two, 0.99)] == [1, 1]  # and >= 1 train row
    assert split_rows(rows, 0.0) == (rows, [])
    assert plan_batches({5: 10, 1: 30, 2: 10, 9: 20}, 2) == [[2, 5], [9, 1]]
    assert batch_seed(0, 3) == batch_seed(0, 3) != batch_seed(0, 4) != batch_seed(1, 3)
    row = make_row([1, 2], [5, 6, 7, 8], target_len=4, eos_token_ids=[8], source_index=3, source_id=11)
    assert row["input_ids"] == [1, 2, 5, 6] and row["loss_mask"] == [0, 0, 1, 1]
    assert row["finished_by_eos"] is False and row["source_id"] == "11"  # the EOS was cut off
    assert make_row([1], [5, 8], 4, [8], 0, "a")["finished_by_eos"] is True


def test_shards_partition_and_merge(verifier, prompts, baseline, tmp_path):
    out = tmp_path / "shared"  # both jobs of the array write into one dir
    for shard in (0, 1):
        settings = SynthSettings(**{**SETTINGS.__dict__, "num_shards": 2, "shard_id": shard})
        result = run(verifier, prompts, out, settings)
        assert result.dataset_dir == dataset_path(out, shard, 2)
        indices = [r["source_index"] for r in read_rows(rows_path(out, shard, 2))]
        assert all(i % 2 == shard for i in indices)
    merged, meta = load_synthetic(out)
    unsharded, _ = load_synthetic(baseline[0])
    assert sorted(r["source_index"] for r in all_rows(merged)) == [
        r["source_index"] for r in all_rows(unsharded)
    ]
    assert meta["rows"] == 7 and meta["skipped_prompts"] == 1 and len(meta["parts"]) == 2
    # the same parts named one by one, comma separated
    shards = ",".join(str(dataset_path(out, s, 2)) for s in (0, 1))
    assert len(load_synthetic(shards)[0]["train"]) == len(merged["train"])
    with pytest.raises(SynthDataError, match="named twice"):
        load_synthetic([out, dataset_path(out, 0, 2)])
    copy = tmp_path / "copy" / "dataset"
    shutil.copytree(dataset_path(out, 0, 2), copy)
    with pytest.raises(SynthDataError, match="source_index .* given twice"):
        load_synthetic([str(out), str(copy.parent)])


def test_resume_after_a_crash_gives_the_uninterrupted_rows(verifier, prompts, baseline, tmp_path):
    expected = read_rows(rows_path(baseline[0]))

    def crash(indices, rows):
        raise Crash

    with pytest.raises(Crash):
        run(verifier, prompts, tmp_path, on_batch=crash)
    path = rows_path(tmp_path)
    first = read_rows(path)
    assert len(first) == SETTINGS.batch_size and not dataset_path(tmp_path).exists()
    # a job killed in the middle of the next batch: one more complete row and a torn line
    second_batch = plan_batches({r["source_index"]: r["prompt_len"] for r in expected}, 3)[1]
    extra = next(r for r in expected if r["source_index"] == second_batch[0])
    with open(path, "a") as handle:
        handle.write(json.dumps(extra) + "\n" + json.dumps(extra)[:40])
    with pytest.raises(SynthDataError, match="stopped early"):
        load_synthetic(tmp_path)
    result = run(verifier, prompts, tmp_path)
    assert result.new_rows == len(expected) - len(first) - 1
    resumed = read_rows(path)
    assert sorted(resumed, key=lambda r: r["source_index"]) == sorted(
        expected, key=lambda r: r["source_index"]
    )
    assert all_rows(load_synthetic(tmp_path)[0]) == all_rows(load_synthetic(baseline[0])[0])
    # a rerun of a finished dir samples nothing and rebuilds the same dataset
    again = run(verifier, prompts, tmp_path)
    assert again.new_rows == 0 and again.metadata["rows"] == len(expected)


def cfg_overrides(out: Path) -> list[str]:
    """task=synth overrides with SETTINGS' values but target_len / max_prompt_len (see DEMO, TINY_SPEC)."""
    return ["task=synth", "model/verifier=tiny-random", f"synth.output_dir={out}", "synth.batch_size=3"] + [
        "synth.validation_fraction=0.2",
        "synth.seed=7",
    ]


def test_other_settings_in_the_same_dir_are_refused(verifier, prompts, baseline, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(baseline[0], out)
    before = rows_path(out).read_bytes()
    hotter = SynthSettings(**{**SETTINGS.__dict__, "temperature": 0.5})
    with pytest.raises(SynthDataError, match=r"synth\.temperature: 1\.0 -> 0\.5.*synth\.resume=false"):
        run(verifier, prompts, out, hotter)
    other = load_verifier(dataclasses.replace(TINY_SPEC, seed=1), "cpu", "float32")
    with pytest.raises(SynthDataError, match=r"model\.verifier\.seed: 0 -> 1"):
        run(verifier=other, prompts=prompts, out=out)
    assert rows_path(out).read_bytes() == before  # nothing was touched
    # the task says the same before any model loads, as a config error
    cfg = compose_config([*cfg_overrides(out), "synth.target_len=64", "synth.max_prompt_len=60"])
    with pytest.raises(ConfigError, match=r"synth\.target_len: 88 -> 64"):
        SynthTask(cfg).check()
    same = ["synth.target_len=88", "synth.max_prompt_len=80", "dataset.limit=5"]
    with pytest.raises(ConfigError, match=r"dataset\.limit: None -> 5"):  # another prompt set
        SynthTask(compose_config([*cfg_overrides(out), *same])).check()
    SynthTask(compose_config([*cfg_overrides(out), *same[:2]])).check()  # the same settings resume
    # resume=false starts over and keeps the old rows aside
    result = run(verifier, prompts, out, hotter, resume=False)
    assert result.metadata["rows"] == 7 and result.metadata["sampling"]["temperature"] == 0.5
    (kept,) = out.glob("rows-shard0-of-1.jsonl.replaced-*")
    assert kept.read_bytes() == before
    # outputs of other sampling settings merge (a corpus tops up greedy answers with sampled ones); the
    # summary names both settings
    merged, summary = load_synthetic([baseline[0], out])
    assert len(merged["train"]) + len(merged["validation"]) == summary["rows"] == 2 * result.metadata["rows"]
    assert [s["temperature"] for s in summary["sampling"]] == [1.0, 0.5]


def test_corrupt_datasets_name_the_file(baseline, tmp_path):
    import datasets

    meta = json.loads((dataset_path(baseline[0]) / METADATA_FILE).read_text())
    good = {"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "prompt_len": 1, "source_index": 0}
    good.update(source_id="a", finished_by_eos=False)
    for name, bad in {
        "lengths": {**good, "loss_mask": [0, 1]},
        "mask": {**good, "loss_mask": [0, 2, 1]},
        "order": {**good, "loss_mask": [1, 0, 1]},
        "nothing-generated": {**good, "prompt_len": 3, "loss_mask": [0, 0, 0]},
    }.items():
        directory = tmp_path / name
        rows = [{**good, "source_index": 1, "source_id": "b"}, bad]
        split = datasets.Dataset.from_list(rows)
        parts = datasets.DatasetDict({"train": split, "validation": split.select([])})
        parts.save_to_disk(str(directory), num_shards={"train": 1, "validation": 1})
        (directory / METADATA_FILE).write_text(json.dumps(meta))
        with pytest.raises(SynthDataError, match=f"{directory}/train: corrupt.*row 1"):
            load_synthetic(directory)
    for rows in ([good, {**good, "source_index": 1, "source_id": "b"}], [good], []):
        directory = save_dataset(rows, meta, tmp_path / "good")  # an empty split saves and loads
        data, _ = load_synthetic(directory)
        assert len(data["train"]) + len(data["validation"]) == len(rows)
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_text(json.dumps({**good, "loss_mask": [0, 1]}) + "\n")
    with pytest.raises(SynthDataError, match=f"{rows_file}:1: corrupt"):
        read_rows(rows_file)
    with pytest.raises(SynthDataError, match="not a task=synth output"):
        load_synthetic(tmp_path / "good" / "train")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("synth.target_len=1", "synth.target_len"),
        ("synth.max_prompt_len=256", "synth.max_prompt_len"),
        ("synth.temperature=-1", "synth.temperature"),
        ("synth.top_p=0", "synth.top_p"),
        ("synth.batch_size=0", "synth.batch_size"),
        ("synth.validation_fraction=1.0", "synth.validation_fraction"),
        ("synth.num_shards=0", "synth.num_shards"),
        ("synth.shard_id=2", "synth.shard_id"),
        ("runtime.num_threads=0", "runtime.num_threads"),
        ("dataset.limit=0", "dataset.limit"),
        ("model.verifier.kind=early_exit", "model.verifier.kind"),
    ],
)
def test_bad_synth_values_name_the_key(override, key):
    cfg = compose_config(["task=synth", "model/verifier=tiny-random", "synth.num_shards=2", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_synth(cfg)


def test_synth_task_runs_without_launch(tmp_path, capsys):
    cfg = compose_config(["task=synth", "model/verifier=tiny-random"])
    assert cfg.task._target_ == "specbench.tasks.synth.SynthTask"
    plan = validate_synth(cfg)
    assert plan.method == "auto" and plan.drafter is None and plan.settings.temperature == 1.0
    out = tmp_path / "out"
    cfg = compose_config(
        ["task=synth", "model/verifier=tiny-random", "dataset.limit=2", f"synth.output_dir={out}"]
        + ["synth.target_len=60", "synth.max_prompt_len=55", "synth.temperature=0"]
    )
    summary = SynthTask(cfg).run()
    assert summary["rows"] == 2 and summary["new_rows"] == 2 and summary["skipped"] == 0
    assert "synth: 2 rows" in capsys.readouterr().out
    greedy, meta = load_synthetic(out)
    assert len(greedy["train"]) + len(greedy["validation"]) == 2 and meta["sampling"]["temperature"] == 0
    assert SynthTask(cfg).run()["resumed_rows"] == 2  # a rerun samples nothing
    with pytest.raises(ConfigError, match="synth.output_dir must be set"):
        SynthTask(compose_config(["task=synth", "model/verifier=tiny-random"])).run()


def test_launch_synth_end_to_end_with_mlflow(mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    proc = launch(
        [
            "task=synth",
            "model/verifier=tiny-random",
            "dataset.limit=4",
            "synth.target_len=76",
            "synth.max_prompt_len=66",
            "synth.batch_size=2",
            "runtime.num_threads=1",
            f"tracking.uri={mlflow_uri}",
            f"hydra.run.dir={run_dir}",
        ],
        cache_dir=tmp_path / "cache",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "synth: 4 rows" in proc.stdout and str(run_dir / "dataset") in proc.stdout
    data, meta = load_synthetic(run_dir)
    assert len(data["train"]) + len(data["validation"]) == 4 and meta["target_len"] == 76
    assert meta["parts"][0]["config"]["synth"]["target_len"] == 76
    client = MlflowClient(tracking_uri=mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("specbench-synth").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["rows"] == 4 and run.data.metrics["tokens_per_s"] > 0
    assert "skipped" in run.data.metrics and "tokens" in run.data.metrics
    assert run.data.tags["specbench.synth.dataset"] == str((run_dir / "dataset").resolve())
    assert run.data.tags["specbench.task"] == "synth"
    assert METADATA_FILE in {a.path for a in client.list_artifacts(run.info.run_id)}
