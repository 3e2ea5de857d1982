"""The ``dataset`` config node as :class:`DatasetSettings` (defined with the specs it reads): the dataset's
defaults filled in, every value checked (a ValueError names the ``dataset.*`` key)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from specbench.data.dataset_specs import (
    FORMATS,
    METRIC_NAMES,
    SPECS,
    SUBSETS,
    DatasetSettings,
    _language_pair,
)

__all__ = ["DatasetSettings", "dataset_settings"]


def dataset_settings(node: Any) -> DatasetSettings:
    """Settings from a ``dataset`` config node (DictConfig or mapping), validated; ValueError names the
    key."""
    values = _as_dict(node)
    name = values.get("name")
    if name not in SPECS:
        raise ValueError(f"dataset.name: unknown dataset {name!r}; allowed: {list(SPECS)}")
    known = {f.name for f in fields(DatasetSettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"dataset: unknown keys {unknown}; allowed: {sorted(known)}")
    spec = SPECS[name]
    settings = DatasetSettings(**{k: v for k, v in values.items() if k in known})
    defaults = {
        "hf_id": spec.hf_id,
        "hf_config": spec.hf_config,
        "split": spec.split,
        "reference_field": spec.reference_field,
        "metric": spec.metric,
        "num_fewshot": spec.num_fewshot,
    }
    settings = replace(settings, **{k: v for k, v in defaults.items() if getattr(settings, k) is None})
    if settings.categories is None and spec.categories is not None and name == "mt_bench":
        settings.categories = list(spec.categories)
    _check_values(settings)
    return settings


def _as_dict(node: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, Mapping) and not isinstance(node, DictConfig):  # a DictConfig's lists stay ListConfig
        return dict(node)

    values = {}
    for key in node:
        values[key] = None if OmegaConf.is_missing(node, key) else node[key]
    return OmegaConf.to_container(OmegaConf.create(values), resolve=True)


def _check_values(s: DatasetSettings) -> None:
    spec = s.spec
    if s.limit is not None and s.limit < 1:
        raise ValueError(f"dataset.limit must be >= 1 or null, got {s.limit}")
    if s.prompt_format not in FORMATS:
        raise ValueError(
            f"dataset.prompt_format: unknown format {s.prompt_format!r}; allowed: {list(FORMATS)}"
        )
    if s.metric not in METRIC_NAMES:
        raise ValueError(f"dataset.metric: unknown metric {s.metric!r}; allowed: {list(METRIC_NAMES)}")
    if s.prompt_format == "fewshot" and not spec.max_fewshot:
        with_fewshot = [n for n, d in SPECS.items() if d.max_fewshot]
        raise ValueError(
            f"dataset.prompt_format=fewshot: dataset {s.name!r} has no few-shot exemplars; "
            f"datasets with them: {with_fewshot}"
        )
    if s.num_fewshot is not None and not 0 <= s.num_fewshot <= spec.max_fewshot:
        raise ValueError(
            f"dataset.num_fewshot must be in [0, {spec.max_fewshot}] for dataset={s.name}, got "
            f"{s.num_fewshot}"
        )
    if s.prompt_format == "fewshot" and not s.num_fewshot:
        raise ValueError("dataset.num_fewshot must be >= 1 with dataset.prompt_format=fewshot")
    if s.categories is not None:
        if spec.categories is None and spec.source != "file":
            raise ValueError(f"dataset.categories: dataset {s.name!r} has no categories")
        allowed = spec.categories or ()
        bad = [c for c in s.categories if allowed and c not in allowed]
        if bad:
            raise ValueError(
                f"dataset.categories: unknown categories {bad} for {s.name}; allowed: {list(allowed)}"
            )
        if not s.categories:
            raise ValueError("dataset.categories must be a non-empty list or null")
    if spec.source == "file" and not s.path:
        suffix = "jsonl" if s.name == "jsonl" else "parquet"
        raise ValueError(f"dataset.path is required for dataset={s.name}: pass dataset.path=FILE.{suffix}")
    if s.name == "wmt" and len(_language_pair(s)) != 2:
        raise ValueError(f"dataset.hf_config: expected a language pair like 'de-en', got {s.hf_config!r}")
    if s.subset not in SUBSETS:
        raise ValueError(f"dataset.subset: unknown subset {s.subset!r}; allowed: {list(SUBSETS)}")
    fraction = s.heldout_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
        raise ValueError(f"dataset.heldout_fraction must be in (0, 1), got {fraction!r}")
