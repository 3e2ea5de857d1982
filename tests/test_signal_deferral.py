"""A SIGTERM / SIGINT that arrives during an MLflow store call is raised when the call ends, not inside it.

Raised inside SQLAlchemy, the signal cut a transaction short (the write was lost) and sometimes made the
SQLite store log a traceback (seen as a flaky ``test_run_closing`` failure); ``store.retry`` now runs each
attempt in ``signals.deferred()``.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from specbench.tracking import signals, store


@pytest.fixture
def handlers():
    """specbench's SIGTERM / SIGINT handlers for one test, the previous ones restored after."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signals.install()
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    signals._received.clear()
    signals._pending.clear()


def kill_self(signum: int = signal.SIGTERM) -> None:
    os.kill(os.getpid(), signum)  # the handler runs at the next bytecode of the main thread


def test_a_signal_outside_a_deferred_block_is_raised_at_once(handlers):
    done = []
    with pytest.raises(signals.Terminated):
        kill_self()
        done.append("after")
    assert done == []


def test_a_signal_inside_is_raised_when_the_outermost_block_ends(handlers):
    done = []
    with pytest.raises(signals.Terminated) as caught:
        with signals.deferred():
            with signals.deferred():
                kill_self()
                done.append("inner")
            done.append("outer")  # the inner block's end does not raise: an outer block is still open
        done.append("after")
    assert done == ["inner", "outer"]
    assert caught.value.signum == signal.SIGTERM
    assert signals.received() == signal.SIGTERM


def test_sigint_inside_is_a_keyboard_interrupt_at_the_end_and_a_second_one_is_not_held(handlers):
    done = []
    with pytest.raises(KeyboardInterrupt) as caught, signals.deferred():
        kill_self(signal.SIGINT)
        done.append("first held")
        kill_self(signal.SIGINT)
        done.append("second held")
    assert done == ["first held"]
    assert not isinstance(caught.value, signals.Terminated)
    assert signals.received() == signal.SIGINT


def test_the_signal_replaces_an_exception_the_block_raised(handlers):
    with pytest.raises(signals.Terminated) as caught, signals.deferred():
        kill_self()
        raise ValueError("the store failed")
    assert isinstance(caught.value.__context__, ValueError)


def test_a_second_sigterm_is_ignored_and_nothing_is_left_pending(handlers):
    with pytest.raises(signals.Terminated), signals.deferred():
        kill_self()
        kill_self()
    with signals.deferred():
        pass  # nothing raised: the one pending signal was raised already


def test_a_lock_error_is_not_retried_once_a_signal_came(handlers, monkeypatch):
    calls = []

    def locked():
        calls.append(1)
        kill_self()
        raise RuntimeError("database is locked")

    monkeypatch.setattr(store, "is_lock_error", lambda err: True)
    with pytest.raises(signals.Terminated):
        store.retry(locked)
    assert calls == [1]


@pytest.fixture
def store_run(tmp_path):
    """(uri, client, run_id) of a fresh SQLite MLflow store with one run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = store.client(uri)
    run_id = store.retry(
        client.create_run, store.get_or_create_experiment(client, "signals", uri)
    ).info.run_id
    return uri, client, run_id


@contextlib.contextmanager
def sigterm_inside_the_next_commit(monkeypatch):
    """The first SQLAlchemy commit in the block receives SIGTERM before it commits; commits are plain
    after."""
    import sqlalchemy.orm

    commit = sqlalchemy.orm.Session.commit

    def commit_hit_by_sigterm(session):
        if signals.received() is None:
            kill_self()  # lands inside SQLAlchemy, before the transaction commits
        return commit(session)

    monkeypatch.setattr(sqlalchemy.orm.Session, "commit", commit_hit_by_sigterm)
    try:
        yield
    finally:
        monkeypatch.setattr(sqlalchemy.orm.Session, "commit", commit)


def test_a_sigterm_during_an_sqlite_commit_lets_the_write_finish_then_stops(handlers, store_run, monkeypatch):
    _, client, run_id = store_run
    with sigterm_inside_the_next_commit(monkeypatch), pytest.raises(signals.Terminated):
        store.retry(client.set_tag, run_id, "written", "yes")
    assert client.get_run(run_id).data.tags.get("written") == "yes"


def test_a_sigterm_during_a_lightning_metric_write_lets_it_finish_then_stops(
    handlers, store_run, monkeypatch
):
    from specbench.training.mlflow_logger import DeferringMLFlowLogger

    uri, client, run_id = store_run
    logger = DeferringMLFlowLogger(tracking_uri=uri, run_id=run_id, log_model=False)
    with sigterm_inside_the_next_commit(monkeypatch), pytest.raises(signals.Terminated):
        logger.log_metrics({"train/loss": 1.5}, step=3)
    assert client.get_run(run_id).data.metrics.get("train/loss") == 1.5


def test_a_sigterm_during_start_run_leaves_no_fluent_run_to_be_ended_finished_at_exit(
    handlers, store_run, monkeypatch
):
    """The SIGTERM held during ``mlflow.start_run`` is raised as it returns; the run it pushed must leave
    MLflow's fluent stack, or MLflow's atexit ``end_run`` overwrote KILLED with FINISHED (seen in CI)."""
    import mlflow

    from specbench.tracking import run as tracking_run

    uri, client, run_id = store_run
    start_run = mlflow.start_run

    def start_run_hit_by_sigterm(*args, **kwargs):
        started = start_run(*args, **kwargs)
        kill_self()
        return started

    monkeypatch.setattr(mlflow, "start_run", start_run_hit_by_sigterm)
    tracker = tracking_run.Tracker(client, uri, client.get_run(run_id).info.experiment_id, run_id)
    body = []
    with pytest.raises(signals.Terminated), tracking_run.ending(tracker), tracking_run._active(uri, run_id):
        body.append("ran")
    assert body == []
    assert mlflow.active_run() is None
    mlflow.end_run()  # what MLflow's atexit hook does: nothing is left for it to end
    assert client.get_run(run_id).info.status == "KILLED"
    assert client.get_run(run_id).data.tags["specbench.error"] == "killed by SIGTERM"
