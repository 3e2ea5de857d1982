"""The trained parts a method decodes with: a distilled drafter, SD² steering, or the DIVERSED head."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from specbench.config.plans import RunPlan
from specbench.decoding.rules import VerificationRule
from specbench.drafters.steering import SteeredDrafter, resolve_spec
from specbench.drafters.trained import CheckpointMismatchError, load_trained_drafter
from specbench.errors import ConfigError
from specbench.models.loading import LoadedModel


@dataclass
class MethodParts:
    drafter: LoadedModel | None
    rule: VerificationRule | None
    steering: SteeredDrafter | None = None


def _untrained(what: str, key: str) -> None:
    print(f"warning: {key} is null, so {what} is untrained (its initial state)", file=sys.stderr)


def load_method_parts(plan: RunPlan, verifier: LoadedModel, drafter: LoadedModel | None) -> MethodParts:
    """Load ``plan.checkpoint`` into the drafter / steering / head the method needs (others: as given).

    A checkpoint made for another model pair or method fails with a ConfigError naming both.
    """
    try:
        if plan.method == "distill":
            trained = load_trained_drafter(
                plan.checkpoint, verifier, drafter, "distill", "method.drafter_checkpoint"
            )
            return MethodParts(trained.drafter, plan.rule)
        if plan.steering is not None:
            if plan.checkpoint:
                trained = load_trained_drafter(
                    plan.checkpoint, verifier, drafter, "sd2", "steering.checkpoint"
                )
                return MethodParts(trained.drafter, plan.rule, trained.steering)
            _untrained("the SD² steering (W_s = 0: the pretrained drafter)", "steering.checkpoint")
            s = plan.steering
            d_layers = s["d_layers"] if s["d_layers"] == "all" else list(s["d_layers"])
            try:
                spec = resolve_spec(
                    verifier.model, drafter.model, s["v_layers"], s["guide_method"], d_layers, s["rank"]
                )
            except ValueError as err:
                raise ConfigError(str(err)) from err
            return MethodParts(drafter, plan.rule, SteeredDrafter(drafter.model, spec).eval())
        if plan.method == "diversed":
            from specbench.decoding.diversed import fresh_diversed_rule, load_diversed_rule

            if plan.checkpoint:
                return MethodParts(drafter, load_diversed_rule(plan.checkpoint, verifier, drafter, plan.pool))
            _untrained("the DIVERSED head (draft weight 0.5 everywhere)", "method.head_checkpoint")
            return MethodParts(drafter, fresh_diversed_rule(verifier, drafter, plan.pool))
    except (CheckpointMismatchError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from err
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return MethodParts(drafter, plan.rule)
