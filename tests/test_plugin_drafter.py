"""A drafter or a verification rule added from outside the package (one module + one yaml) runs through
launch.py.

The module and the yaml live in a temporary directory: the yaml is found through ``hydra.searchpath`` and the
module through ``PYTHONPATH``, exactly as a user would add a drafter or a rule without touching specbench.
"""

from __future__ import annotations

import json
import os
import textwrap

from helpers import launch

DRAFTER_MODULE = '''
import torch

from specbench.decoding.rules import VerificationRule
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


class TrustTheDrafterRule(VerificationRule):
    """Lossy toy rule: the target is the drafter's own distribution, so every draft is accepted."""

    name = "trust-drafter"

    def __init__(self, note: str = ""):
        self.note = note

    @property
    def lossless(self):
        return False

    def target(self, p, q, weights=None):
        return q
'''

DRAFTER_YAML = """
kind: drafter
name: repeat-last
target: toy_drafters.RepeatLastDrafter
params:
  repeats: 3
"""


RULE_YAML = """
name: trust-drafter
target: toy_drafters.TrustTheDrafterRule
params:
  note: a toy
"""


def write_plugin(tmp_path):
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "toy_drafters.py").write_text(textwrap.dedent(DRAFTER_MODULE))
    conf = tmp_path / "plugin_conf" / "model" / "drafter"
    conf.mkdir(parents=True)
    (conf / "repeat-last.yaml").write_text(DRAFTER_YAML)
    (tmp_path / "plugin_conf" / "method").mkdir()
    (tmp_path / "plugin_conf" / "method" / "trust-drafter.yaml").write_text(RULE_YAML)
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


def test_a_rule_from_one_module_and_one_yaml_is_the_one_that_runs(tmp_path):
    args, env = write_plugin(tmp_path)
    run_dir = tmp_path / "run"
    proc = launch(
        [*args, "model/verifier=tiny-random", "model/drafter=tiny-random", "method=trust-drafter",
         "gen.temperature=0", "gen.max_new_tokens=16", "dataset.limit=2", "tracking=none",
         f"hydra.run.dir={run_dir}"],
        env_extra=env,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["acceptance_rate"] == 1.0  # the toy's target is q: sd would accept almost nothing here
    bad = launch(
        [*args, "model/verifier=tiny-random", "model/drafter=tiny-random", "method=trust-drafter",
         "+method.params.colour=red", "tracking=none", f"hydra.run.dir={tmp_path / 'bad'}"],
        env_extra=env,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert bad.returncode == 2 and "method.params" in bad.stderr and "colour" in bad.stderr
    assert "Traceback" not in bad.stderr
