"""Prompt datasets and prompt templates."""

from specbench.data.prompts import (
    DATASETS,
    Prompt,
    demo_path,
    load_demo,
    load_jsonl,
    load_prompts,
    read_jsonl,
    subset,
)
from specbench.data.templates import PROMPT_FORMATS, encode_prompt, has_chat_template

__all__ = [
    "DATASETS",
    "PROMPT_FORMATS",
    "Prompt",
    "demo_path",
    "encode_prompt",
    "has_chat_template",
    "load_demo",
    "load_jsonl",
    "load_prompts",
    "read_jsonl",
    "subset",
]
