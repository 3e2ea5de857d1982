"""Functional correctness of generated code (HumanEval, MBPP): build the test program, run it sandboxed."""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from specbench.scoring.sandbox import ExecutionResult, Sandbox

# Codex paper (Chen et al. 2021): a completion of the function body ends at the next top-level statement.
HUMANEVAL_STOPS = ("\nclass ", "\ndef ", "\n#", "\nif __name__", "\nprint(", "\nassert ")
# Austin et al. 2021 prompt format: the code sits between [BEGIN] and [DONE].
MBPP_STOPS = ("[DONE]",)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _cut_raw(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the first stop, keeping leading indentation (it is part of a function body)."""
    end = len(text)
    for stop in stops:
        found = text.find(stop)
        if found != -1:
            end = min(end, found)
    return text[:end].rstrip()


def fenced_code(text: str) -> str | None:
    """The first fenced code block (```python ... ```), preferring a python-tagged one; None if none."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return None
    for language, body in blocks:
        if language.lower() in ("python", "py", "python3"):
            return body
    return blocks[0][1]


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^\s*(async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def humaneval_program(prompt: str, output: str, test: str, entry_point: str) -> str:
    """The check program of a HumanEval sample: prompt + completion (or a whole function) + test + check().

    A fenced block or an answer that defines ``entry_point`` itself (chat models) is appended after the
    prompt, so the prompt's imports stay; otherwise the output continues the prompt's function body and
    is cut at the Codex stop sequences.
    """
    code = fenced_code(output)
    if code is None:
        code = output.replace("[DONE]", "")
        if not _defines(code, entry_point):
            code = _cut_raw(code, HUMANEVAL_STOPS)
    if _defines(code, entry_point):
        body = prompt + "\n    pass\n\n" + code
    else:
        body = prompt + code
    return f"{body}\n\n{test}\n\ncheck({entry_point})\n"


def mbpp_program(
    output: str, test_list: Sequence[str], test_imports: Sequence[str] = (), test_setup_code: str = ""
) -> str:
    """The check program of an MBPP sample: imports + setup + the generated code + the asserts."""
    code = fenced_code(output)
    if code is None:
        code = _cut_raw(output, MBPP_STOPS).replace("[BEGIN]", "")
    parts = [*test_imports, test_setup_code or "", code, *test_list]
    return "\n".join(part for part in parts if part) + "\n"


def check_program(meta: dict[str, Any], output: str) -> str:
    """The program for a code sample; ``meta`` holds HumanEval (code_prompt, test, entry_point) or MBPP
    (test_list, test_imports, test_setup_code) fields."""
    if "entry_point" in meta:
        return humaneval_program(meta["code_prompt"], output, meta["test"], meta["entry_point"])
    if "test_list" in meta:
        return mbpp_program(
            output, meta["test_list"], meta.get("test_imports") or (), meta.get("test_setup_code") or ""
        )
    raise ValueError("a code sample needs HumanEval fields (entry_point, test) or MBPP fields (test_list)")


def run_programs(programs: Sequence[str], sandbox: Sandbox, workers: int = 1) -> list[ExecutionResult]:
    """Each program in its own sandboxed process, ``workers`` at a time, results in order."""
    if workers <= 1 or len(programs) <= 1:
        return [sandbox.run(program) for program in programs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(sandbox.run, programs))
