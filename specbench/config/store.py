"""Registration of the structured configs in Hydra's ConfigStore, and of specbench's config resolvers."""

from __future__ import annotations

import secrets

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from specbench.config.schema import Config, ReportTaskConfig, TaskConfig

SCHEMA_NAME = "specbench_schema"
UNIQUE_RESOLVER = "specbench.unique"


def unique_suffix() -> str:
    """6 random hex digits: two launches in the same second get different run dirs (``conf/config.yaml``).

    Registered with ``use_cache=True``: one value per config, which Hydra copies into each sweep job's
    config (also into submitit jobs), so every process resolves the same dir.
    """
    return secrets.token_hex(3)


def register_configs() -> None:
    """Store the top-level schema (first entry of ``conf/config.yaml``'s defaults) and the task schemas.

    Idempotent: storing the same name twice replaces the entry.
    """
    if not OmegaConf.has_resolver(UNIQUE_RESOLVER):
        OmegaConf.register_new_resolver(UNIQUE_RESOLVER, unique_suffix, use_cache=True)
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=Config)
    store.store(group="schema/task", name="eval", node=TaskConfig)
    store.store(group="schema/task", name="report", node=ReportTaskConfig)
    store.store(group="schema/task", name="synth", node=TaskConfig)
    store.store(group="schema/task", name="train", node=TaskConfig)
    store.store(group="schema/task", name="profile", node=TaskConfig)
