"""docs/tutorial.md runs as written: its files are written from the page, its command is run (on the tiny
random verifier, which the lookback drafter fits as any other), and its table is read."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

from helpers import ROOT

PAGE = ROOT / "docs" / "tutorial.md"


def page_files() -> dict[str, str]:
    blocks = re.findall(r"```(?:python|yaml)\n# file: (\S+)\n(.*?)```", PAGE.read_text(), re.DOTALL)
    return dict(blocks)


def page_command() -> list[str]:
    block = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.DOTALL)[0]
    (line,) = [line for line in block.splitlines() if line]
    return shlex.split(line)


def run_page(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    for path, text in page_files().items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    words = page_command()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}
    while "=" in words[0] and not words[0].startswith("python"):  # leading VAR=value assignments
        key, value = words.pop(0).split("=", 1)
        env[key] = str(tmp_path / value)
    assert words[:2] == ["python", "launch.py"], words
    args = [a.replace("file://my_lab", f"file://{tmp_path / 'my_lab'}") for a in words[2:]]
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args, *extra], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_the_page_has_its_three_files_and_one_command():
    assert set(page_files()) == {
        "my_lab/lookback.py", "my_lab/conf/model/drafter/lookback.yaml", "my_lab/conf/method/sharpened.yaml"
    }  # fmt: skip
    assert "model/drafter=lookback" in page_command() and "method=sharpened" in page_command()


def test_the_tutorial_runs_and_its_table_reads_as_the_page_says(tmp_path):
    out = tmp_path / "run"
    tiny = ["model/verifier=tiny-random", "runtime.num_threads=1", f"eval.output_dir={out}"]
    proc = run_page(tmp_path, *tiny)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout.splitlines()
    assert any(line.startswith("sharpened (constant, gamma=4)") for line in table), proc.stdout
    assert any(line.startswith("autoregressive") and "1.00x" in line for line in table)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["method"] == "sharpened" and metrics["tau"] >= 1.0


def test_power_one_is_exact_so_every_greedy_output_equals_autoregressive(tmp_path):
    out = tmp_path / "run"
    proc = run_page(tmp_path, "model/verifier=tiny-random", "runtime.num_threads=1", f"eval.output_dir={out}",
                    "method.params.power=1.0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["baseline_match_rate"] == 1.0


def test_a_bad_parameter_stops_before_any_model_loads(tmp_path):
    proc = run_page(tmp_path, "model/verifier=tiny-random", "model.drafter.params.span=0")
    assert proc.returncode == 2
    assert "model.drafter.params: span must be >= 1, got 0" in proc.stderr
