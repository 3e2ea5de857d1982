"""A drafter added from outside the package (one module + one yaml) runs through launch.py, losslessly.

The module and the yaml live in a temporary directory: the yaml is found through ``hydra.searchpath`` and the
module through ``PYTHONPATH``, exactly as a user would add a drafter without touching specbench.
"""

from __future__ import annotations

import json
import os
import textwrap

from helpers import launch

DRAFTER_MODULE = '''
import torch

from specbench.drafters.base import Drafter, Proposal


class RepeatLastDrafter(Drafter):
    """Proposes the row's newest token again, ``repeats`` times (no model, no q)."""

    deterministic = True

    def __init__(self, repeats: int = 2):
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.repeats = repeats

    def propose(self, state, caps, sampler, want_hidden=False):
        lengths = torch.clamp(caps, max=self.repeats)
        width = int(lengths.max()) if lengths.numel() else 0
        tokens = state.tokens[:, -1:].expand(-1, width).clone()
        return Proposal(tokens=tokens, lengths=lengths, q=None, forwards=0)
'''

DRAFTER_YAML = """
kind: drafter
name: repeat-last
target: toy_drafters.RepeatLastDrafter
params:
  repeats: 3
"""


def write_plugin(tmp_path):
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "toy_drafters.py").write_text(textwrap.dedent(DRAFTER_MODULE))
    conf = tmp_path / "plugin_conf" / "model" / "drafter"
    conf.mkdir(parents=True)
    (conf / "repeat-last.yaml").write_text(DRAFTER_YAML)
    pythonpath = os.pathsep.join(p for p in (str(tmp_path / "plugin"), os.environ.get("PYTHONPATH")) if p)
    return [f"hydra.searchpath=[file://{tmp_path / 'plugin_conf'}]"], {"PYTHONPATH": pythonpath}


def test_a_drafter_from_one_module_and_one_yaml_runs_losslessly(tmp_path):
    args, env = write_plugin(tmp_path)
    run_dir = tmp_path / "run"
    proc = launch(
        [
            *args,
            "model/verifier=tiny-random",
            "model/drafter=repeat-last",
            "method=sd",
            "gen.temperature=0",
            "gen.max_new_tokens=24",
            "dataset.limit=3",
            "tracking=none",
            f"hydra.run.dir={run_dir}",
        ],
        env_extra=env,
        cache_dir=tmp_path / "cache",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    assert all(row["matches_baseline"] for row in rows)  # greedy sd with any drafter = autoregressive
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["drafter"] == "repeat-last"
    assert metrics["mean_drafted_per_round"] > 0  # the drafter's proposals were verified


def test_a_bad_parameter_of_the_new_drafter_is_a_config_error(tmp_path):
    args, env = write_plugin(tmp_path)
    proc = launch(
        [*args, "model/verifier=tiny-random", "model/drafter=repeat-last", "model.drafter.params.repeats=0",
         "tracking=none", f"hydra.run.dir={tmp_path / 'run'}"],
        env_extra=env,
        cache_dir=tmp_path / "cache",
    )
    assert proc.returncode != 0
    assert "Config error" in proc.stderr and "repeats must be >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr
