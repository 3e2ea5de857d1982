"""Prompt datasets (the ``dataset`` config group), prompt templates, few-shot exemplars and the format
of synthetic training data (``synth_rows``, ``synth_dataset``); nothing here runs the engine."""

from specbench.data.dataset_config import DatasetSettings, dataset_settings
from specbench.data.dataset_sources import DatasetUnavailableError, check_source
from specbench.data.dataset_specs import DATASET_NAMES, FORMATS, SPECS, DatasetSpec, question_file
from specbench.data.datasets import DatasetPrompt, encode_messages, encode_sample, load_dataset_prompts
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
    "DATASET_NAMES",
    "FORMATS",
    "PROMPT_FORMATS",
    "SPECS",
    "DatasetPrompt",
    "DatasetSettings",
    "DatasetSpec",
    "DatasetUnavailableError",
    "Prompt",
    "check_source",
    "dataset_settings",
    "demo_path",
    "encode_messages",
    "encode_prompt",
    "encode_sample",
    "has_chat_template",
    "load_dataset_prompts",
    "load_demo",
    "load_jsonl",
    "load_prompts",
    "question_file",
    "read_jsonl",
    "subset",
]
