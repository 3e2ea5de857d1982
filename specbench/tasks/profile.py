"""``task=profile``: measure the cost model of speculative decoding on this machine (specbench.decoding.cost).

v(n) — the verifier's time for a forward over n = 1..max_n new tokens, relative to one — and the drafter's
time per drafted token, for the configured verifier, drafter (with its reduced draft vocabulary, if set:
recorded as ``meta.draft_vocab_size``), device, dtype and thread count. Writes
``profile.json`` (what ``schedule=cost_aware schedule.profile=...`` reads), prints it and logs it to MLflow.
"""

from __future__ import annotations

from pathlib import Path

from specbench.config.plans import RunPlan
from specbench.config.validate import validate
from specbench.tasks.base import Task, check_writable, configured_dir, output_dir, verifier_placement

PROFILE_FILE = "profile.json"


class ProfileTask(Task):
    plan: RunPlan | None = None
    config_groups = ("task", "model", "method", "schedule", "profile", "runtime", "tracking")

    def check(self) -> None:
        self.plan = validate(self.cfg)
        node = self.cfg.profile
        if node.max_n is not None and node.max_n < 1:
            from specbench.errors import ConfigError

            raise ConfigError(f"profile.max_n must be >= 1 or null, got {node.max_n}")
        for key in ("context_len", "repeats"):
            if node[key] < 1:
                from specbench.errors import ConfigError

                raise ConfigError(f"profile.{key} must be >= 1, got {node[key]}")
        output = node.output
        check_writable(Path(output).expanduser().parent if output else configured_dir(None), "profile.output")
        self.plan.resolve()

    def run_name(self) -> str:
        return f"profile {self.cfg.model.drafter.get('name') or self.cfg.model.drafter.kind}"

    def run(self) -> dict:
        import torch

        from specbench.evaluation import measure_profile
        from specbench.models.loading import load_verifier
        from specbench.pairs import load_drafter

        if self.plan is None:
            self.check()
        cfg, plan = self.cfg, self.plan
        if cfg.runtime.num_threads is not None:
            torch.set_num_threads(cfg.runtime.num_threads)
        verifier = load_verifier(
            plan.verifier, plan.device, plan.dtype, placement=verifier_placement(cfg, plan)
        )
        drafter = load_drafter(plan.drafter, verifier, plan.device, plan.dtype) if plan.drafter else None
        from specbench.decoding.schedules import DraftSchedule
        from specbench.evaluation import build_engines

        # The engine's own drafter object (model drafters wrapped, vocabulary shared) is what gets timed.
        engine, _ = build_engines(
            verifier, drafter, plan.rule, DraftSchedule(), plan.settings, baseline=False
        )
        max_n = cfg.profile.max_n or plan.schedule.max_gamma + 1
        profile = measure_profile(
            verifier, engine.drafter, engine.verifier.vocab_size, max_n, cfg.profile.context_len,
            cfg.profile.repeats,
        )  # fmt: skip
        out = (
            Path(cfg.profile.output).expanduser()
            if cfg.profile.output
            else output_dir(None, "profile.output")
        )
        path = profile.save(out if out.suffix == ".json" else out / PROFILE_FILE)
        print(profile.table())
        print(f"profile: {path}  (use it with schedule=cost_aware schedule.profile={path})")
        draft_vocab = profile.meta.get("draft_vocab_size")
        self.tracker.set_tags({
            "specbench.verifier": verifier.name, "specbench.drafter": profile.drafter,
            "specbench.draft_vocab_size": str(draft_vocab or "full"),
        })  # fmt: skip
        self.tracker.log_artifact(path)
        metrics = {f"verify_ms_n{n}": ms for n, ms in enumerate(profile.verify_ms, start=1)}
        metrics.update(draft_ms=profile.draft_ms, cost_ratio=profile.c, v_max=profile.v(profile.max_n))
        return metrics
