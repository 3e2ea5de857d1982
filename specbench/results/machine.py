"""What a record says about where and from which code it ran: the machine and the git commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what the platform says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def describe_machine(
    device: str = "cpu", dtype: str = "float32", threads: int | None = None
) -> dict[str, Any]:
    """The machine fields of a record; ``device`` / ``dtype`` as the benchmark ran them."""
    import torch

    described: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 0,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "torch": torch.__version__,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "python": platform.python_version(),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        described["gpu"] = torch.cuda.get_device_name(torch.device(str(device)))
    return described


def git_commit(root: Path = ROOT) -> str:
    """HEAD's hash, with ``-dirty`` when tracked files differ from it (the figures then come from code that
    no commit holds); ``unknown`` outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def this_command() -> str:
    """The command line that runs now, as a user would type it from the project root."""
    argv = list(sys.argv)
    script = Path(argv[0])
    if script.is_absolute():
        try:
            argv[0] = str(script.relative_to(ROOT))
        except ValueError:
            pass
    quoted = [
        arg if arg and all(c.isalnum() or c in "/._-=,:+@" for c in arg) else repr(arg) for arg in argv[1:]
    ]
    return " ".join(["python", argv[0], *quoted])
