"""Where the frozen training-prompt manifest (``dataset=corpus``) lies, and the check that it is there; the
manifest is built by :mod:`specbench.data.prompt_corpus`."""

from __future__ import annotations

from pathlib import Path

MANIFEST = Path(__file__).resolve().parents[2] / "data" / "prompts" / "corpus-v1.jsonl.gz"


def check_manifest(path: Path | None = None) -> Path:
    """The manifest's path; FileNotFoundError naming the command that rebuilds it when it is missing."""
    path = path or MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"dataset=corpus: the prompt manifest {path} is missing; rebuild it with "
            "python -m specbench.data.prompt_corpus (needs every package in conf/dataset/corpus.yaml)"
        )
    return path
