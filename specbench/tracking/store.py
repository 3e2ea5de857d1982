"""Where MLflow runs go: the tracking URI, the experiment, and SQLite-safe client calls.

mlflow is imported inside functions only, so importing this module is cheap and touches no database.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from specbench.errors import ConfigError
from specbench.tracking import signals

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

T = TypeVar("T")

ENV_URI = "MLFLOW_TRACKING_URI"
DB_SUBPATH = Path("mlruns") / "mlflow.db"
ARTIFACTS_DIRNAME = "artifacts"
EXPERIMENT_PREFIX = "specbench-"
LOCK_RETRY_S = 120.0  # give up on "database is locked" after this long
PROBE_TIMEOUT_S = 5.0  # an MLflow server that does not answer within this is unreachable
SQLITE_HEADER = b"SQLite format 3\x00"
SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "file")
SCHEME_HINT = (
    "use sqlite:///PATH.db (a local file), http(s)://HOST:PORT (an MLflow server), a database URL "
    "(postgresql://, mysql://, mssql://), or tracking=none"
)


def project_root() -> Path:
    """The checkout that holds ``launch.py`` (editable install), else the current directory."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "launch.py").is_file() else Path.cwd()


def default_tracking_uri() -> str:
    """``sqlite:///<project root>/mlruns/mlflow.db`` (absolute, so SLURM jobs and ``mlflow ui`` agree)."""
    return "sqlite:///" + str(project_root() / DB_SUBPATH)


def resolve_tracking_uri(configured: str | None = None, cwd: str | Path | None = None) -> str:
    """``configured`` (``tracking.uri``), else ``$MLFLOW_TRACKING_URI``, else :func:`default_tracking_uri`.

    A relative SQLite path (``sqlite:///x.db``) or a bare file path is made absolute against ``cwd``
    (default: the current directory), so every process of a sweep writes to the same file.
    """
    uri = configured or os.environ.get(ENV_URI) or default_tracking_uri()
    base = Path(cwd) if cwd is not None else Path.cwd()
    if uri.startswith("sqlite:///"):
        path = uri.removeprefix("sqlite:///")
        if path and path != ":memory:" and not path.startswith("/"):
            return "sqlite:///" + str((base / path).resolve())
        return uri
    if "://" not in uri and not uri.startswith("sqlite:"):
        return "sqlite:///" + str((base / Path(uri).expanduser()).resolve())
    return uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    if uri.startswith("sqlite:///"):
        path = uri.removeprefix("sqlite:///")
        if path and path != ":memory:":
            return Path(path)
    return None


def uri_source(configured: str | None) -> str:
    """The name of the setting a tracking URI came from, for error messages."""
    if configured:
        return "tracking.uri"
    if os.environ.get(ENV_URI):
        return f"tracking.uri (null, so ${ENV_URI})"
    return "tracking.uri (null: the default store)"


def check_uri(uri: str, key: str = "tracking.uri", timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Cheap checks that MLflow can use ``uri``, before a run opens; raises ConfigError naming ``key``.

    An unsupported scheme, a path that is not an SQLite database (or cannot be created), and an MLflow
    server that does not answer within ``timeout_s`` (MLflow itself retries for minutes) fail at once.
    """
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    if scheme not in SCHEMES:
        raise ConfigError(f"{key}: unsupported tracking URI {uri!r} (scheme {scheme!r}); {SCHEME_HINT}")
    allowed = os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("1", "true", "yes")
    if scheme == "file" and not allowed:
        raise ConfigError(
            f"{key}: {uri!r} is MLflow's retired file store (MLflow refuses it unless "
            "MLFLOW_ALLOW_FILE_STORE=true); use sqlite:///PATH.db"
        )
    path = sqlite_path(uri)
    if path is not None:
        _check_sqlite_file(path, key)
    elif scheme in ("http", "https"):
        _probe_server(uri, key, timeout_s)


def _check_sqlite_file(path: Path, key: str) -> None:
    if path.is_dir():
        raise ConfigError(
            f"{key}: {str(path)!r} is a directory, not an SQLite database file; pass sqlite:///DIR/mlflow.db"
        )
    if path.is_file() and path.stat().st_size > 0:
        with open(path, "rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
        if header != SQLITE_HEADER:
            raise ConfigError(
                f"{key}: {str(path)!r} is not an SQLite database (MLflow's store); pass a .db file MLflow "
                "created, or a path to a new one"
            )
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"{key}: cannot create the directory of the SQLite store {str(path)!r}: {err.strerror or err}"
        ) from err


def _probe_server(uri: str, key: str, timeout_s: float) -> None:
    """Any HTTP answer means the server is there; no answer within ``timeout_s`` is a ConfigError."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        return  # it answered (an older server without /health, or a proxy asking for credentials)
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise ConfigError(
            f"{key}: cannot reach the MLflow server at {uri} within {timeout_s:g} s ({reason}); start it "
            "(mlflow server ...), or pass tracking.uri=sqlite:///PATH.db or tracking=none"
        ) from err


def artifact_location(uri: str, experiment: str) -> str | None:
    """For a SQLite store, ``<db dir>/artifacts/<experiment>`` (not MLflow's ``./mlruns`` in the cwd)."""
    path = sqlite_path(uri)
    if path is None:
        return None  # a tracking server chooses its own artifact root
    return (path.parent / ARTIFACTS_DIRNAME / experiment).resolve().as_uri()


def is_lock_error(err: BaseException) -> bool:
    """SQLite's "database is locked" (possibly wrapped by MLflow as TEMPORARILY_UNAVAILABLE)."""
    text = str(err).lower()
    if "database is locked" in text or "database table is locked" in text:
        return True
    return getattr(err, "error_code", None) == "TEMPORARILY_UNAVAILABLE"


def retry(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, retried with jittered backoff while SQLite reports a lock.

    Concurrent jobs on one node share one SQLite file; MLflow already waits 20 s per statement
    (busy_timeout), this covers longer bursts. Several nodes should use a tracking server instead.
    A SIGTERM / SIGINT during an attempt is raised when the attempt ends (:func:`signals.deferred`), never
    inside MLflow's database code; the sleeps between attempts are not deferred.
    """
    deadline = time.monotonic() + LOCK_RETRY_S
    delay = 0.2
    while True:
        try:
            with signals.deferred():
                return call(*args, **kwargs)
        except Exception as err:
            if not is_lock_error(err) or time.monotonic() > deadline:
                raise
            time.sleep(delay * (1.0 + random.random()))
            delay = min(delay * 2, 5.0)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def client(uri: str, key: str = "tracking.uri") -> MlflowClient:
    """An MlflowClient on ``uri`` whose store is created (and the SQLite schema migrated) under a file lock.

    The lock keeps concurrent first uses of a fresh SQLite file from racing through the migrations. A
    store MLflow refuses (e.g. the retired ``file:`` store) is a one-line ConfigError naming ``key``.
    """
    from mlflow.tracking import MlflowClient

    path = sqlite_path(uri)
    try:
        made = MlflowClient(tracking_uri=uri)
        lock = _file_lock(path.with_name(path.name + ".lock")) if path else contextlib.nullcontext()
        with lock:
            retry(made.search_experiments, max_results=1)
    except ConfigError:
        raise
    except Exception as err:
        message = " ".join(str(err).split())[:300]
        reason = f"{type(err).__name__}: {message}"
        if is_lock_error(err):
            reason += (
                f" (still locked after {LOCK_RETRY_S:g} s of retries: another process holds the SQLite file; "
                "wait for it, or run an MLflow server for concurrent jobs)"
            )
        raise ConfigError(f"{key}: MLflow cannot use the store {uri!r}: {reason}") from err
    return made


def get_or_create_experiment(mlflow_client: MlflowClient, name: str, uri: str) -> str:
    """The id of experiment ``name``, created (artifacts next to a SQLite file) if missing."""
    from mlflow.exceptions import MlflowException

    found = retry(mlflow_client.get_experiment_by_name, name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            retry(mlflow_client.restore_experiment, found.experiment_id)
        return found.experiment_id
    try:
        return retry(mlflow_client.create_experiment, name, artifact_location=artifact_location(uri, name))
    except MlflowException:  # another job created it at the same moment
        found = retry(mlflow_client.get_experiment_by_name, name)
        if found is None:
            raise
        return found.experiment_id


def experiment_name(configured: str | None, kind: str) -> str:
    """``tracking.experiment`` if set, else ``specbench-<task kind>`` (one experiment per task kind)."""
    return configured or f"{EXPERIMENT_PREFIX}{kind}"
