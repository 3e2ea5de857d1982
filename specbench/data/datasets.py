"""The prompts of a ``dataset`` config, and how a prompt becomes verifier input ids.

:func:`load_dataset_prompts` reads a dataset's rows (:mod:`specbench.data.dataset_sources`), keeps its
categories and its train / heldout part (:mod:`specbench.data.dataset_subsets`) and builds each row's
prompt with the dataset's builder (:mod:`specbench.data.dataset_specs`); :func:`encode_sample` and
:func:`encode_messages` encode prompts for the verifier.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.data.dataset_config import DatasetSettings, dataset_settings
from specbench.data.dataset_sources import _source_rows, check_source
from specbench.data.dataset_specs import _BUILDERS, FORMATS, _field
from specbench.data.dataset_subsets import _keep_subset, in_subset
from specbench.data.prompts import Prompt, load_demo, load_jsonl, subset
from specbench.data.templates import encode_prompt, has_chat_template


@dataclass
class DatasetPrompt(Prompt):
    """A prompt with its plain-completion form for base models (``completion``: None means ``text``)."""

    completion: str | None = None
    completion_format: str = "plain"  # plain | fewshot


_SKIPPED_META = {"prompt", "category", "reference", "id", "question_id"}


def _to_prompt(number: int, row: dict[str, Any], where: str, s: DatasetSettings) -> DatasetPrompt:
    completion_format = s.completion_format()
    k = s.num_fewshot if completion_format == "fewshot" else 0
    built = _BUILDERS[s.name](row, where, s, k)
    reference = built.get("reference")
    if reference is None and s.reference_field:
        if s.spec.source == "hub" or s.spec.source == "package":
            reference = _field(row, s.reference_field, where, s)
        else:
            reference = row.get(s.reference_field)
    if isinstance(reference, list) and len(reference) == 1 and s.spec.source in ("questions", "file"):
        reference = reference[0]  # Spec-Bench stores one reference in a list
    meta = built.get("meta")
    if meta is None:
        skip = _SKIPPED_META | {s.prompt_field, s.reference_field}
        meta = {key: value for key, value in row.items() if key not in skip}
    row_id = next(
        (v for v in (built.get("id"), row.get("id"), row.get("question_id")) if v is not None), None
    )
    return DatasetPrompt(
        id=row_id if row_id is not None else number,
        text=built["text"],
        reference=reference,
        category=row.get("category"),
        meta=meta,
        completion=built.get("completion"),
        completion_format=completion_format if built.get("completion") is not None else "plain",
    )


def load_dataset_prompts(settings: DatasetSettings | Any) -> list[Prompt]:
    """The prompts of a ``dataset`` config (node, mapping or settings): source → categories → train /
    heldout part (``dataset.subset``, by a hash of the prompt id) → ``limit`` / ``seed``.

    Raises DatasetUnavailableError (a FileNotFoundError) when the data is not here, ValueError naming
    file and row for a row that does not fit the dataset's schema.
    """
    s = settings if isinstance(settings, DatasetSettings) else dataset_settings(settings)
    plain_jsonl = s.name == "jsonl" and s.reference_field == "reference" and not s.categories
    if s.name == "demo" or (plain_jsonl and not Path(s.path).expanduser().is_dir()):
        if s.name == "jsonl":
            check_source(s)
        if s.subset == "all":
            if s.name == "demo":
                return load_demo(s.limit, s.seed)
            return load_jsonl(s.path, s.limit, s.seed, s.prompt_field)
        prompts = load_demo() if s.name == "demo" else load_jsonl(s.path, prompt_field=s.prompt_field)
        prompts = [p for p in prompts if in_subset(s.name, p.id, s.subset, s.heldout_fraction)]
        return subset(prompts, s.limit, s.seed)
    rows, origin = _source_rows(s)
    if s.categories:
        rows = [(n, r) for n, r in rows if r.get("category") in s.categories]
    if not (s.spec.source == "hub" and not s.path):  # hub rows were split and subset before conversion
        rows = subset(_keep_subset(rows, s), s.limit, s.seed)
    return [_to_prompt(number, row, f"{origin}:{number}", s) for number, row in rows]


def encode_sample(tokenizer: Any, prompt: Prompt, prompt_format: str = "auto") -> tuple[list[int], str]:
    """Verifier input ids of ``prompt`` and the format used: ``chat`` | ``plain`` | ``fewshot``.

    ``auto``: the chat template when the tokenizer has one, else the dataset's completion prompt (few-shot
    for gsm8k and mbpp). ``chat`` renders ``prompt.text`` as one user turn; the completion formats encode
    ``prompt.completion`` (or ``prompt.text``) as plain text with the tokenizer's special tokens.
    """
    if prompt_format not in FORMATS:
        raise ValueError(f"dataset.prompt_format: unknown format {prompt_format!r}; allowed: {list(FORMATS)}")
    if prompt_format == "chat" or (prompt_format == "auto" and has_chat_template(tokenizer)):
        return encode_prompt(tokenizer, prompt.text, "chat")[0], "chat"
    completion = getattr(prompt, "completion", None)
    if completion is None:
        return encode_prompt(tokenizer, prompt.text, "plain")[0], "plain"
    return encode_prompt(tokenizer, completion, "plain")[0], getattr(prompt, "completion_format", "plain")


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], str]:
    """Input ids of a conversation (``[{"role": "user"|"assistant", "content": ...}, ...]``) ending with a
    user turn, plus the generation prompt; ``plain`` (turns joined by blank lines) without a chat template."""
    if has_chat_template(tokenizer):
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"]), "chat"
    return list(tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"]), "plain"
