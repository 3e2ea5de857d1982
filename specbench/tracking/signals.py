"""SIGTERM and SIGINT end a task cleanly: the MLflow run is closed KILLED with the signal as its reason.

SLURM sends SIGTERM on ``scancel`` and at the time limit (before SIGKILL); Python's default action for it
kills the process with no cleanup, which left runs RUNNING forever. :func:`install` (``launch.py`` calls it
first) makes SIGTERM raise :class:`Terminated` in the main thread, so every ``finally`` and
:func:`specbench.tracking.run.ending` runs; SIGINT raises KeyboardInterrupt as usual. Both are recorded,
so a library that turns the interrupt into another exception (Lightning exits with ``SystemExit(1)``)
still ends the run KILLED. A second SIGTERM during the cleanup is ignored; a second Ctrl-C is not.

Inside :func:`deferred` (every MLflow store call, through ``store.retry``) the first signal is only
recorded, and raised when the block ends: an exception raised in the middle of a SQLAlchemy transaction
left the SQLite store logging a traceback, and could leave a write half done. A store call waits at most
MLflow's busy timeout (20 s), within the 30 s SLURM gives between SIGTERM and SIGKILL.

Under submitit the preemption signal (``$SUBMITIT_PREEMPT_SIGNAL``, default USR2) stays submitit's: it
requeues the job, and the SIGTERM SLURM then sends to stop the old job is left to that requeue (the
requeued job reopens the same MLflow run); the run records why it stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

_received: list[int] = []
_pending: list[int] = []  # a signal that came inside a deferred() block, raised when the block ends
_depth = 0  # deferred() blocks open in the main thread


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the process receives SIGTERM."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        self.signum = signum
        super().__init__(f"received {signal_name(signum)}")


class JobKilled(RuntimeError):
    """A submitit job stopped by a signal: an Exception, so submitit writes the job's result file and the
    submitting process learns the job ended (a KeyboardInterrupt would leave it waiting forever)."""


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def received() -> int | None:
    """The first SIGTERM / SIGINT this process received since :func:`install` (None: none)."""
    return _received[0] if _received else None


def exit_code() -> int:
    """The shell's exit status for a process the received signal stopped (130 SIGINT, 143 SIGTERM)."""
    return 128 + (received() or signal.SIGINT)


def preemption_signal() -> int | None:
    """submitit's preemption signal (it requeues the job on it), or None if the name is unknown."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")
    return getattr(signal, f"SIG{name}", None)


def preempted() -> bool:
    """Whether the first signal received was submitit's preemption signal (the job is being requeued)."""
    return received() is not None and received() == preemption_signal()


def _raise(signum: int) -> None:
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _received:
        return  # already unwinding, or being requeued: let that finish (SLURM's SIGKILL follows if too long)
    _received.append(signum)
    if _depth:
        _pending.append(signum)
        return
    raise Terminated(signum)


def _recording(
    previous: Callable[[int, FrameType | None], object],
) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        if not _received:
            _received.append(signum)
        previous(signum, frame)

    return handler


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if not _received:
        _received.append(signum)
        if _depth:
            _pending.append(signum)
            return
    raise KeyboardInterrupt  # a second Ctrl-C is not deferred


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold back a SIGTERM / SIGINT that arrives inside the block until it ends, then raise it there
    (in place of any exception the block raised: the signal is why the task stops). Outside the main
    thread, where no handler runs, a no-op."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending:
            _raise(_pending.pop())


def install() -> None:
    """Handle SIGTERM and SIGINT as above (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _received.clear()
    _pending.clear()
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigint)
    preempt = preemption_signal()
    previous = signal.getsignal(preempt) if preempt is not None else None
    if callable(previous):  # submitit's requeue handler: keep it, and record that it fired
        signal.signal(preempt, _recording(previous))
