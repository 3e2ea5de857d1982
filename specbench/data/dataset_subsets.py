"""The train / heldout parts of a prompt set (``dataset.subset``): a fixed split by a hash of the prompt
id, decided before ``limit`` / ``seed``."""

from __future__ import annotations

import hashlib
from typing import Any

from specbench.data.dataset_specs import _ROW_ID_FIELDS, SUBSETS, DatasetSettings


def heldout_score(dataset_name: str, prompt_id: Any) -> float:
    """A stable number in [0, 1) from sha256 of ``"<dataset name>:<prompt id>"`` (the same on every
    machine and run, whatever the order, limit or seed of the prompt set)."""
    digest = hashlib.sha256(f"{dataset_name}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def in_subset(dataset_name: str, prompt_id: Any, subset_name: str, heldout_fraction: float) -> bool:
    """Whether the prompt ``prompt_id`` belongs to ``subset_name`` (all | train | heldout).

    A prompt is heldout iff :func:`heldout_score` < ``heldout_fraction``; train is the rest.
    """
    if subset_name == "all":
        return True
    heldout = heldout_score(dataset_name, prompt_id) < heldout_fraction
    if subset_name == "heldout":
        return heldout
    if subset_name == "train":
        return not heldout
    raise ValueError(f"dataset.subset: unknown subset {subset_name!r}; allowed: {list(SUBSETS)}")


def _id_fields(s: DatasetSettings) -> tuple[str, ...]:
    own = (_ROW_ID_FIELDS[s.name],) if s.name in _ROW_ID_FIELDS else ()
    return tuple(dict.fromkeys((*own, "id", "question_id")))


def _row_id(number: int, row: dict[str, Any], s: DatasetSettings) -> Any:
    """The id :func:`specbench.data.datasets._to_prompt` gives this row (without building its prompt):
    the first of the dataset's own id field, ``id`` and ``question_id`` that is set, else the row number."""
    return next((row[name] for name in _id_fields(s) if row.get(name) is not None), number)


def _keep_subset(
    rows: list[tuple[int, dict[str, Any]]], s: DatasetSettings
) -> list[tuple[int, dict[str, Any]]]:
    if s.subset == "all":
        return rows
    return [(n, r) for n, r in rows if in_subset(s.name, _row_id(n, r, s), s.subset, s.heldout_fraction)]
