"""Prompt sets: the bundled demo prompts and generic jsonl files (e.g. Spec-Bench's question.jsonl)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

DATASETS = ("demo", "jsonl")
DEMO_FILE = "demo_prompts.jsonl"
_ID_FIELDS = ("id", "question_id")
_KNOWN_FIELDS = {"prompt", "category", "reference", *_ID_FIELDS}


@dataclass
class Prompt:
    """One prompt; ``meta`` keeps the row's other fields (e.g. all ``turns``)."""

    id: str | int
    text: str
    reference: Any = None
    category: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def demo_path() -> Path:
    """Path of the bundled demo prompt file."""
    return Path(str(resources.files("specbench.data").joinpath(DEMO_FILE)))


def read_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a corrupt line raises ValueError naming file and
    line."""
    rows = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path}:{number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})"
                ) from err
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")  # noqa: TRY004 (a corrupt line)
            rows.append((number, row))
    return rows


_USER_ROLES = ("user", "human")


def _first_user_turn(turns: list[dict[str, Any]], name: str, where: str) -> str:
    """The first user message of a chat: ShareGPT ``{"from": "human", "value"}`` or ``{"role": "user",
    "content"}``."""
    for turn in turns:
        role = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        if role in _USER_ROLES and isinstance(text, str):
            return text
    raise ValueError(f"{where}: field {name!r} has no user turn ({{'from': 'human'}} or {{'role': 'user'}})")


def _prompt_text(row: dict[str, Any], prompt_field: str | None, where: str) -> str:
    if prompt_field is not None:
        fields = [prompt_field]
    else:
        fields = ["prompt", "turns", "conversations", "messages"]
    for name in fields:
        if name not in row:
            continue
        value = row[name]
        if isinstance(value, list) and value and isinstance(value[0], dict):
            return _first_user_turn(value, name, where)
        if isinstance(value, list):
            if not value or not isinstance(value[0], str):
                raise ValueError(f"{where}: field {name!r} must be a non-empty list of strings")
            return value[0]
        if isinstance(value, str):
            return value
        raise ValueError(f"{where}: field {name!r} must be a string or a list of strings")
    raise ValueError(f"{where}: row has none of the prompt fields {fields}; keys are {sorted(row)}")


def _to_prompt(number: int, row: dict[str, Any], prompt_field: str | None, path: Path) -> Prompt:
    where = f"{path}:{number}"
    text = _prompt_text(row, prompt_field, where)
    row_id = next((row[key] for key in _ID_FIELDS if key in row), number)
    skip = _KNOWN_FIELDS | ({prompt_field} if prompt_field else set())
    meta = {key: value for key, value in row.items() if key not in skip}
    return Prompt(row_id, text, row.get("reference"), row.get("category"), meta)


def subset(items: list, limit: int | None = None, seed: int | None = None) -> list:
    """First ``limit`` items, or with ``seed`` a seeded random ``limit`` of them (kept in file order)."""
    if limit is not None and limit < 1:
        raise ValueError(f"dataset.limit must be >= 1 or null, got {limit}")
    if limit is None or limit >= len(items):
        return list(items)
    if seed is None:
        return list(items[:limit])
    chosen = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in chosen]


def load_jsonl(
    path: str | Path, limit: int | None = None, seed: int | None = None, prompt_field: str | None = None
) -> list[Prompt]:
    """Prompts of a jsonl file whose rows have ``prompt``, ``turns`` (first turn), ShareGPT ``conversations``
    or chat ``messages`` (first user turn), or ``prompt_field``.

    ``id`` is the row's ``id`` or ``question_id``, else its line number.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(f"prompt file {str(path)!r} is a directory, not a .jsonl file")
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {str(path)!r} does not exist")
    rows = subset(read_jsonl(path), limit, seed)
    return [_to_prompt(number, row, prompt_field, path) for number, row in rows]


def load_demo(limit: int | None = None, seed: int | None = None) -> list[Prompt]:
    """The bundled demo prompts (8 short instructions of different kinds)."""
    return load_jsonl(demo_path(), limit, seed)


def load_prompts(
    name: str,
    path: str | Path | None = None,
    limit: int | None = None,
    seed: int | None = None,
    prompt_field: str | None = None,
) -> list[Prompt]:
    """Prompts of the bundled demo set or a jsonl file (every ``dataset`` option:
    :func:`specbench.data.datasets.load_dataset_prompts`)."""
    if name == "demo":
        return load_demo(limit, seed)
    if name == "jsonl":
        if path is None:
            raise ValueError("dataset.path is required for dataset=jsonl")
        return load_jsonl(path, limit, seed, prompt_field)
    raise ValueError(f"dataset.name: unknown dataset {name!r}; allowed: {list(DATASETS)}")
