"""A drafter, a verification rule or a draft schedule added from outside the package (one module + one yaml,
or ``schedule._target_``) runs through launch.py; the old ``target:`` spelling is refused with the new one
named.

The module and the yaml live in a temporary directory: the yaml is found through ``hydra.searchpath`` and the
module through ``PYTHONPATH``, exactly as a user would add a drafter or a rule without touching specbench.
"""

from __future__ import annotations

import json
import os
import textwrap

from helpers import launch

DRAFTER_MODULE = '''
from dataclasses import dataclass

import torch

from specbench.decoding.rules import VerificationRule
from specbench.decoding.schedules import DraftSchedule
from specbench.drafters.base import Drafter, Proposal


@dataclass(frozen=True)
class FirstRoundShort(DraftSchedule):
    """One draft in a row's first round, ``later`` in every round after it."""

    name: str = "first-round-short"
    later: int = 4

    def __post_init__(self):
        if self.later < 1:
            raise ValueError(f"later must be >= 1, got {self.later}")

    def initial_gamma(self):
        return 1

    def next_gamma(self, current, drafted, accepted):
        return self.later


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
_target_: toy_drafters.RepeatLastDrafter
params:
  repeats: 3
"""


RULE_YAML = """
name: trust-drafter
_target_: toy_drafters.TrustTheDrafterRule
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


def test_a_schedule_from_outside_is_built_from_its_target_and_runs(tmp_path):
    args, env = write_plugin(tmp_path)
    run_dir = tmp_path / "run"
    schedule = "schedule._target_=toy_drafters.FirstRoundShort"
    common = [*args, "model/verifier=tiny-random", "model/drafter=tiny-random", "method=sd",
              "gen.temperature=0", "tracking=none", schedule]  # fmt: skip
    proc = launch(
        [*common, "+schedule.params.later=3", "gen.max_new_tokens=24", "dataset.limit=2",
         f"hydra.run.dir={run_dir}"],
        env_extra=env,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["schedule"] == "first-round-short" and metrics["gamma"] == 1
    assert 1 < metrics["mean_drafted_per_round"] <= 3  # 1 in the first round, 3 (or the budget's rest) after
    assert "name: first-round-short" in (run_dir / "config.yaml").read_text()  # recorded: what ran
    bad = launch(
        [*common, "+schedule.params.later=0", f"hydra.run.dir={tmp_path / 'bad'}"],
        env_extra=env,
        cache_dir=tmp_path / "cache",
    )
    assert bad.returncode == 2 and "later must be >= 1" in bad.stderr and "Traceback" not in bad.stderr


def test_the_old_target_spelling_is_refused_with_the_new_one_named(tmp_path):
    args, env = write_plugin(tmp_path)
    for override in ("model.drafter.target=toy_drafters.RepeatLastDrafter", "method.target=toy_drafters.X"):
        proc = launch(
            [*args, "model/verifier=tiny-random", "model/drafter=repeat-last", "method=sd", override,
             "tracking=none", f"hydra.run.dir={tmp_path / 'run'}"],
            env_extra=env,
            cache_dir=tmp_path / "cache",
        )  # fmt: skip
        key = override.split("=")[0]
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"{key} is spelled {key.replace('.target', '._target_')} now" in proc.stderr
        assert "Traceback" not in proc.stderr
