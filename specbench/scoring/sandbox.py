"""Run untrusted (model-generated) Python in a separate, limited process; never in this one.

Each run gets a fresh temp dir as its working directory and a new session (process group). The
program runs under ``python -I`` started by a small bootstrap (``_sandbox_boot.py``) with:

- wall-clock timeout: on overrun the whole process group is SIGKILLed (and, see below, every process of
  the run's uid and the PID namespace with it);
- RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, no core dumps;
- a minimal environment (no tokens, no proxies, HOME = the work dir), stdin from /dev/null, output
  captured to size-limited files of which only the tail is kept.

Isolation modes (``isolation=``):

``namespaces`` (default when running as root with CAP_SYS_ADMIN, e.g. this project's machines)
    The kernel enforces everything: a fresh unprivileged uid/gid per run (no groups) — so RLIMIT_NPROC
    counts only this run's processes and they can signal nothing else; new network namespace (only a
    loopback device that is down: every connect, also to 127.0.0.1, fails); new mount namespace where
    every mount is read-only except the work dir (so /tmp and /dev/shm are not writable either) and
    directories the uid cannot traverse (e.g. /root) show only the interpreter; new PID namespace
    whose init is the program, so the kernel kills every process left when it exits or is killed.
``preamble`` (fallback: not root, or namespaces unavailable)
    Resource limits and the timeout/kill as above, plus an audit-hook guard (PEP 578) installed in the
    program's interpreter before its code runs: it refuses sockets, fork/exec/subprocess, signals,
    ctypes and file writes outside the work dir. This is a guard inside the interpreter, not a kernel
    boundary: native code could bypass it, and without root RLIMIT_NPROC counts all of the user's
    processes. Run code evaluation as root in a disposable container/VM for the full isolation.

``auto`` picks ``namespaces`` when a probe run succeeds, else ``preamble`` (with a warning).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

ISOLATIONS = ("auto", "namespaces", "preamble")
BOOTSTRAP = Path(__file__).with_name("_sandbox_boot.py")
SETUP_FAILED = 125
_UID_RANGE = (1_500_000_000, 1_900_000_000)  # fresh uids per run, far from any real account
_TAIL = 4000


class SandboxUnavailableError(RuntimeError):
    """The requested isolation cannot be set up on this machine."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock
    memory_mb: int = 1024  # RLIMIT_AS
    cpu_s: int | None = None  # RLIMIT_CPU; None: ceil(timeout_s) + 1
    processes: int = 16  # RLIMIT_NPROC (binding for the fresh uid of a root run)
    file_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write (stdout/stderr included)
    open_files: int = 64  # RLIMIT_NOFILE

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_mb < 64 or self.processes < 1:
            raise ValueError(f"bad sandbox limits: {self}")


@dataclass(frozen=True)
class ExecutionResult:
    status: str  # passed | failed | timeout | error (the sandbox itself could not run the program)
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    isolation: str
    uid: int | None  # the run's uid when it ran under a fresh one

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def message(self) -> str:
        """Short reason: the last line of stderr, or the status."""
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        if self.status == "timeout":
            return "timed out"
        return lines[-1][:300] if lines else self.status


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _traversable_by_others(path: str) -> bool:
    current = Path("/")
    for part in Path(path).resolve().parts[1:]:
        if not current.stat().st_mode & 0o001:
            return False
        current = current / part
    return True


def _interpreter_dirs(python: str) -> list[str]:
    """Directories an interpreter needs: its real binary's prefix and, for a venv, the venv itself."""
    dirs = {os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        dirs |= {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    venv = Path(os.path.abspath(python)).parent.parent
    if (venv / "pyvenv.cfg").is_file():
        dirs.add(str(venv.resolve()))
    return sorted(dirs)


class Sandbox:
    """Runs Python programs in isolated child processes; thread-safe (each run has its own dir and uid)."""

    _probe_lock = threading.Lock()
    _namespaces_ok: bool | None = None

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        isolation: str = "auto",
        python: str | None = None,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"sandbox isolation must be one of {list(ISOLATIONS)}, got {isolation!r}")
        if not sys.platform.startswith("linux"):
            raise SandboxUnavailableError("the code sandbox needs Linux (rlimits, namespaces)")
        self.limits = limits or SandboxLimits()
        self.python = python or sys.executable
        self.isolation = self._resolve(isolation)

    # -- isolation -------------------------------------------------------------------------------

    def _resolve(self, isolation: str) -> str:
        if isolation == "preamble":
            return "preamble"
        available = self._namespaces_available()
        if isolation == "namespaces" and not available:
            raise SandboxUnavailableError(
                "sandbox isolation 'namespaces' needs root with CAP_SYS_ADMIN (mount/network/PID "
                "namespaces); use isolation='preamble' (weaker, see specbench/scoring/sandbox.py)"
            )
        if not available:
            warnings.warn(
                "code sandbox: namespaces unavailable (not root?); falling back to the 'preamble' guard "
                "(resource limits + an in-interpreter audit hook; not a kernel boundary)",
                RuntimeWarning,
                stacklevel=3,
            )
            return "preamble"
        return "namespaces"

    def _namespaces_available(self) -> bool:
        if not _is_root():
            return False
        with Sandbox._probe_lock:
            if Sandbox._namespaces_ok is None:
                probe = self._run("print('ok')", "namespaces", SandboxLimits(timeout_s=30.0))
                Sandbox._namespaces_ok = probe.status == "passed" and probe.stdout.strip() == "ok"
                if not Sandbox._namespaces_ok:
                    warnings.warn(
                        f"code sandbox: namespace probe failed: {probe.stderr[-500:]}", stacklevel=2
                    )
            return Sandbox._namespaces_ok

    # -- running ---------------------------------------------------------------------------------

    def run(self, source: str) -> ExecutionResult:
        """Run ``source`` as ``__main__`` of a fresh interpreter; ``passed`` iff it exits with status 0."""
        return self._run(source, self.isolation, self.limits)

    def _run(self, source: str, isolation: str, limits: SandboxLimits) -> ExecutionResult:
        base = tempfile.gettempdir() if _traversable_by_others(tempfile.gettempdir()) else "/tmp"
        run_dir = Path(tempfile.mkdtemp(prefix="specbench-sandbox-", dir=base))
        uid = self._uid(isolation)
        try:
            run_dir.chmod(0o711)  # the run's uid may pass through to its work dir, not list or write here
            workdir = run_dir / "work"
            workdir.mkdir(mode=0o700)
            (run_dir / "stage").mkdir(mode=0o700)
            program = workdir / "program.py"
            program.write_text(source, encoding="utf-8")
            if uid is not None:
                os.chown(workdir, uid, uid)
                os.chown(program, uid, uid)
            spec = self._spec(workdir, program, run_dir / "stage", isolation, limits, uid)
            spec_path = run_dir / "spec.json"
            spec_path.write_text(json.dumps(spec))
            with open(run_dir / "stdout", "wb") as out, open(run_dir / "stderr", "wb") as err:
                started = time.perf_counter()
                returncode, timed_out = self._execute(spec_path, run_dir, out, err, limits.timeout_s)
                duration = time.perf_counter() - started
            if uid is not None:
                _kill_uid(uid)
            stdout, stderr = _tail(run_dir / "stdout"), _tail(run_dir / "stderr")
        finally:
            if uid is not None:
                _kill_uid(uid)
            shutil.rmtree(run_dir, ignore_errors=True)
        if timed_out:
            status = "timeout"
        elif returncode == SETUP_FAILED and "sandbox setup failed" in stderr:
            status = "error"
        else:
            status = "passed" if returncode == 0 else "failed"
        return ExecutionResult(status, returncode, stdout, stderr, duration, isolation, uid)

    def _uid(self, isolation: str) -> int | None:
        if not _is_root():
            return None
        if isolation == "preamble" and not _traversable_by_others(self.python):
            return None  # without a mount namespace a fresh uid could not even start the interpreter
        return _UID_RANGE[0] + secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0])

    def _spec(
        self, workdir: Path, program: Path, staging: Path, isolation: str, limits: SandboxLimits, uid
    ) -> dict:
        cpu = limits.cpu_s if limits.cpu_s is not None else int(limits.timeout_s) + 2
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        return {
            "isolation": isolation,
            "workdir": str(workdir),
            "program": str(program),
            "staging": str(staging),
            "python": self.python,
            "expose": _interpreter_dirs(self.python),
            "uid": uid,
            "env": env,
            "limits": {
                "memory_bytes": limits.memory_mb * 1024 * 1024,
                "cpu_seconds": cpu,
                "processes": limits.processes,
                "file_bytes": limits.file_mb * 1024 * 1024,
                "open_files": limits.open_files,
            },
        }

    @staticmethod
    def _execute(spec_path: Path, run_dir: Path, out, err, timeout: float) -> tuple[int | None, bool]:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(BOOTSTRAP), str(spec_path)],
            cwd=run_dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            proc.wait()
            return proc.returncode, True
        finally:
            _killpg(proc.pid)  # children left behind by a program that exited


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int, attempts: int = 50) -> None:
    """SIGKILL every process owned by ``uid`` (a run's fresh uid), until none is left."""
    for _ in range(attempts):
        pids = _pids_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _pids_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is ``uid``."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)] and not fields.get("State", "").strip().startswith(
            "Z"
        ):
            pids.append(int(entry.name))
    return pids


def processes_of(uid: int) -> list[int]:
    """Live processes owned by ``uid`` (tests use it to check that a run left nothing behind)."""
    return _pids_of(uid)


def _tail(path: Path) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - _TAIL))
        return handle.read().decode("utf-8", errors="replace")


def run_python(source: str, limits: SandboxLimits | None = None, isolation: str = "auto") -> ExecutionResult:
    """One sandboxed run of ``source`` (see :class:`Sandbox`)."""
    return Sandbox(limits, isolation).run(source)
