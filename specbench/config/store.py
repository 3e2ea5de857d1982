"""Registration of the structured configs in Hydra's ConfigStore."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from specbench.config.schema import Config, ReportTaskConfig, TaskConfig

SCHEMA_NAME = "specbench_schema"


def register_configs() -> None:
    """Store the top-level schema (first entry of ``conf/config.yaml``'s defaults) and the task schemas.

    Idempotent: storing the same name twice replaces the entry.
    """
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=Config)
    store.store(group="schema/task", name="eval", node=TaskConfig)
    store.store(group="schema/task", name="report", node=ReportTaskConfig)
    store.store(group="schema/task", name="synth", node=TaskConfig)
    store.store(group="schema/task", name="train", node=TaskConfig)
