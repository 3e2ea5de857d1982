"""Helpers shared by the test modules: the project root, Hydra composition, and launch.py in a subprocess.

``tests/`` has no ``__init__.py``; pytest's default ``prepend`` import mode puts this directory on
``sys.path``, so test modules import these as ``from helpers import ...``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]


def compose_config(overrides: Iterable[str] = (), **kwargs):
    """``conf/config.yaml`` composed with ``overrides`` (extra keyword arguments go to ``compose``)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), **kwargs)


def launch(
    args: Iterable[str],
    *,
    env_extra: Mapping[str, str] | None = None,
    cache_dir: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """``python launch.py ARGS`` from the project root, offline, without HYDRA_FULL_ERROR.

    ``cache_dir`` becomes ``SPECBENCH_CACHE``; ``env_extra`` is added to the environment last.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if cache_dir is not None:
        env["SPECBENCH_CACHE"] = str(cache_dir)
    env.update(env_extra or {})
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def design_card() -> list[list[str]]:
    """The README's design-card commands ("The commands it is known by"), as arguments after
    ``python launch.py``."""
    import re
    import shlex

    text = (ROOT / "README.md").read_text()
    pattern = r"<!-- design-card:begin -->\n```bash\n(.*?)```\n<!-- design-card:end -->"
    block = re.search(pattern, text, re.DOTALL)
    assert block, "README.md lost its design-card block"
    commands = [shlex.split(line) for line in block.group(1).splitlines() if line.strip()]
    assert all(c[:2] == ["python", "launch.py"] for c in commands), commands
    return [c[2:] for c in commands]
