"""Look at a sweep in the MLflow UI as a user does: ``mlflow ui`` on loopback, pages rendered by headless
Chromium (the Debian package ``chromium``; nothing is downloaded), read back as text or saved as a PNG.

tests/test_mlflow_ui.py asserts on the rendered pages; the screenshot in docs/tracking.md comes from
``python -m specbench.tracking.ui_browser SWEEP_DIR --screenshot docs/img/mlflow-sweep.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from specbench.tracking import ui_view
from specbench.tracking.naming import PARENT_FILE, read_run_file

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
WINDOW = (1500, 1100)


def find_chromium() -> str | None:
    """The path of an installed Chromium, or None."""
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_ui(tracking_uri: str, timeout_s: float = 120.0) -> Iterator[str]:
    """``mlflow ui`` on a free loopback port over ``tracking_uri``; yields its base URL, stops it after."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri]
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=log,
            start_new_session=True,
        )  # fmt: skip
        try:
            _wait_for(base, server, log, timeout_s)
            yield base
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)  # the group this call started: the UI and its workers
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=15)


def _wait_for(base: str, server: subprocess.Popen, log: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(base + "/health", timeout=2):
            return
        if server.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"mlflow ui did not answer at {base}: {tail}")
        time.sleep(0.5)


def _chromium(args: list[str], chromium: str | None, budget_ms: int) -> subprocess.CompletedProcess:
    binary = chromium or find_chromium()
    if binary is None:
        raise RuntimeError("no Chromium found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
             f"--virtual-time-budget={budget_ms}", "--hide-scrollbars", *args],
            capture_output=True, text=True, timeout=budget_ms / 1000 + 90, check=False,
        )  # fmt: skip


def visible_text(dom: str) -> str:
    """The text of a rendered page: scripts and styles dropped, tags to spaces, whitespace collapsed."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.DOTALL | re.IGNORECASE)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def render_text(url: str, expect: Iterable[str] = (), chromium: str | None = None, attempts: int = 3) -> str:
    """The visible text of ``url`` once the UI has rendered it; retried with more time until every string
    of ``expect`` appears (the UI fetches runs after the page loads), else the last text."""
    wanted = list(expect)
    text = ""
    for attempt in range(attempts):
        text = visible_text(_chromium(["--dump-dom", url], chromium, 15000 * (attempt + 1)).stdout)
        if all(w in text for w in wanted):
            break
    return text


def screenshot(url: str, path: str | Path, chromium: str | None = None) -> Path:
    """A PNG of ``url`` as rendered, quantized to a small palette (a committed docs image stays small)."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    _chromium([f"--screenshot={path}", url], chromium, 30000)
    if not path.is_file():
        raise RuntimeError(f"Chromium wrote no screenshot of {url}")
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the MLflow UI over a sweep; render its parent run.")
    parser.add_argument("sweep_dir", type=Path, help="a multirun dir holding mlflow_parent.json")
    parser.add_argument("--screenshot", type=Path, help="write a PNG of the page here")
    parser.add_argument("--runs-table", action="store_true", help="the runs table, not the parent's page")
    args = parser.parse_args(argv)
    parent = read_run_file(args.sweep_dir / PARENT_FILE)
    if parent is None:
        parser.error(f"{args.sweep_dir / PARENT_FILE}: no sweep parent run recorded (tracking off?)")
    with serve_ui(parent["tracking_uri"]) as base:
        url = base + ui_view.run_page_path(parent["experiment_id"], parent["run_id"])
        if args.runs_table:
            url = base + ui_view.runs_table_path(parent["experiment_id"], ui_view.share_key(parent["run_id"]))
        print(render_text(url, expect=["Child runs" if not args.runs_table else "matching runs"]))
        if args.screenshot:
            print(f"screenshot: {screenshot(url, args.screenshot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
