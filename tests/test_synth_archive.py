"""Finished synth shards as committed gzip archives (``synth.compress``): a fresh clone reads them without
the verifier, a rerun samples nothing, a corrupt archive names its file and line while the other shards stay
usable, and a ``launch.py`` synth killed with SIGKILL mid-shard loses and duplicates nothing when rerun."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT
from test_synth_responses import DEMO, prompts, verifier  # noqa: F401  (the tiny verifier and demo prompts)

from specbench.data.synth_archive import archive_metadata_path, archive_path
from specbench.data.synth_dataset import dataset_path, load_synthetic
from specbench.data.synth_rows import SynthDataError, read_rows, rows_path
from specbench.pipelines.synth_plan import SynthSettings
from specbench.pipelines.synthesize import synthesize

SETTINGS = SynthSettings(target_len=88, max_prompt_len=80, batch_size=2, validation_fraction=0.2, seed=3)


def shard(settings: SynthSettings, shard_id: int) -> SynthSettings:
    from dataclasses import replace

    return replace(settings, num_shards=2, shard_id=shard_id)


def sorted_rows(data) -> list[dict]:
    rows = [dict(r) for split in ("train", "validation") for r in data[split]]
    return sorted(rows, key=lambda r: (r["source_index"], r["response_index"]))


def test_a_finished_shard_is_archived_and_read_back_without_its_dataset(verifier, prompts, tmp_path):  # noqa: F811
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    for shard_id in (0, 1):
        synthesize(verifier, prompts, shard(SETTINGS, shard_id), plain, dataset=DEMO, progress=False)
        synthesize(
            verifier, prompts, shard(SETTINGS, shard_id), packed, dataset=DEMO, progress=False, compress=True
        )
    archive = archive_path(packed, 0, 2)
    assert archive.exists() and archive_metadata_path(archive).exists()
    assert not rows_path(packed, 0, 2).exists()  # the plain rows file is replaced by its archive
    with gzip.open(archive, "rb") as handle:
        assert handle.read() == rows_path(plain, 0, 2).read_bytes()  # the same lines, byte for byte
    expected = sorted_rows(load_synthetic(plain)[0])
    assert sorted_rows(load_synthetic(packed)[0]) == expected
    # a fresh clone has the archives and their metadata, not the Arrow dirs
    for shard_id in (0, 1):
        shutil.rmtree(dataset_path(packed, shard_id, 2))
    data, meta = load_synthetic(packed)
    assert sorted_rows(data) == expected and meta["rows"] == len(expected)
    assert meta["parts"][0]["rebuilt_from"] == archive.name
    # a rerun of an archived shard samples nothing and leaves no plain rows file behind
    again = synthesize(
        verifier, prompts, shard(SETTINGS, 0), packed, dataset=DEMO, progress=False, compress=True
    )
    assert again.new_rows == 0 and not rows_path(packed, 0, 2).exists()
    assert again.metadata["throughput"]["new_generated_tokens"] == 0


def test_a_corrupt_archive_names_file_and_line_and_the_other_shard_stays_usable(verifier, prompts, tmp_path):  # noqa: F811
    for shard_id in (0, 1):
        synthesize(
            verifier,
            prompts,
            shard(SETTINGS, shard_id),
            tmp_path,
            dataset=DEMO,
            progress=False,
            compress=True,
        )
        shutil.rmtree(dataset_path(tmp_path, shard_id, 2))
    broken = archive_path(tmp_path, 1, 2)
    good = tmp_path / "good"
    good.mkdir()
    for name in (archive_path(tmp_path, 0, 2), archive_metadata_path(archive_path(tmp_path, 0, 2))):
        shutil.copy(name, good / name.name)
    content = broken.read_bytes()
    broken.write_bytes(content[: len(content) // 2])  # a truncated download or copy
    with pytest.raises(SynthDataError, match=rf"{broken}:\d+: the compressed shard is truncated or corrupt"):
        load_synthetic(tmp_path)
    data, meta = load_synthetic(good)  # shard 0 alone still loads
    assert meta["rows"] == len(data["train"]) + len(data["validation"]) > 0
    # a line that decompresses but is not a row names its line too
    lines = gzip.decompress(content).splitlines(keepends=True)
    lines[1] = b'{"input_ids": [1]}\n'
    broken.write_bytes(gzip.compress(b"".join(lines)))
    with pytest.raises(SynthDataError, match=rf"{broken}:2: corrupt synthetic row"):
        load_synthetic(tmp_path)


def synth_command(out: Path) -> list[str]:
    return [
        sys.executable, str(ROOT / "launch.py"), "task=synth", "model/verifier=tiny-random", "tracking=none",
        f"synth.output_dir={out}", "synth.batch_size=1", "synth.target_len=88", "synth.max_prompt_len=80",
        "synth.seed=5", "synth.compress=true", f"hydra.run.dir={out}/hydra",
    ]  # fmt: skip


def test_a_synth_killed_mid_shard_loses_and_duplicates_nothing(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    subprocess.run(synth_command(whole), cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    expected = read_rows(archive_path(whole))
    proc = subprocess.Popen(synth_command(killed), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    rows_file = rows_path(killed)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if rows_file.exists() and rows_file.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed mid-shard"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    written = read_rows(rows_file)
    assert 2 <= len(written) < len(expected)
    done = subprocess.run(
        synth_command(killed), check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{len(written)} rows done" in done.stdout
    resumed = read_rows(archive_path(killed))
    keys = [(r["source_index"], r["response_index"]) for r in resumed]
    assert len(keys) == len(set(keys))  # nothing twice
    assert sorted(resumed, key=lambda r: r["source_index"]) == sorted(
        expected, key=lambda r: r["source_index"]
    )
    assert json.loads((dataset_path(killed) / "specbench_synth.json").read_text())["rows"] == len(expected)
