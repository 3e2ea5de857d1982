"""SIGTERM and SIGINT end a task cleanly: the MLflow run is closed KILLED with the signal as its reason.

SLURM sends SIGTERM on ``scancel`` and at the time limit (before SIGKILL); Python's default action for it
kills the process with no cleanup, which left runs RUNNING forever. :func:`install` (``launch.py`` calls it
first) makes SIGTERM raise :class:`Terminated` in the main thread, so every ``finally`` and
:func:`specbench.tracking.run.ending` runs; SIGINT raises KeyboardInterrupt as usual. Both are recorded,
so a library that turns the interrupt into another exception (Lightning exits with ``SystemExit(1)``)
still ends the run KILLED. A second SIGTERM during the cleanup is ignored; a second Ctrl-C is not.

Under submitit the preemption signal (``$SUBMITIT_PREEMPT_SIGNAL``, default USR2) stays submitit's: it
requeues the job, and the SIGTERM SLURM then sends to stop the old job is left to that requeue (the
requeued job reopens the same MLflow run); the run records why it stopped.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

_received: list[int] = []


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


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _received:
        return  # already unwinding, or being requeued: let that finish (SLURM's SIGKILL follows if too long)
    _received.append(signum)
    raise Terminated(signum)


def _recording(previous: Callable[[int, FrameType | None], object]) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        if not _received:
            _received.append(signum)
        previous(signum, frame)

    return handler


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if not _received:
        _received.append(signum)
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGTERM and SIGINT as above (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _received.clear()
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigint)
    preempt = preemption_signal()
    previous = signal.getsignal(preempt) if preempt is not None else None
    if callable(previous):  # submitit's requeue handler: keep it, and record that it fired
        signal.signal(preempt, _recording(previous))
