"""The Prefect workers behind `mat worker start|stop|status`: one `prefect worker start --pool P` process
per work pool mat uses (`mat-local`, and `mat-<machine>` per configured machine).

Each worker runs in a session of its own (a Ctrl-C in the terminal that started it does not reach it),
logs to ``$MAT_HOME/workers/<pool>.log``, and is recorded in ``$MAT_HOME/workers.json`` ({pool: {pid,
log_file, started_at, api_url}}). A worker gets mat's environment: the server's PREFECT_API_URL, mat's
result storage and PREFECT_LOGGING_EXTRA_LOGGERS, so its flow runs share mat's cache and carry mat's
progress lines.

`prefect worker start` stops on SIGTERM by sending itself SIGINT. A process started from a
non-interactive shell (`mat worker start &`, nohup, cron) inherits SIGINT as ignored, and such a worker
would never stop; mat therefore starts workers with SIGINT set back to its default. `stop_workers` sends
SIGTERM, waits, and kills the worker's process group only if it is still there.

Like prefect_server.py, this module never imports prefect.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.cli.prefect_server import mat_home
from multiagenttrainer.errors import ServerError
from multiagenttrainer.processes import pid_alive

WORKERS_FILE = "workers.json"
READY_TIMEOUT_S = 120.0  # a worker imports Prefect and contacts the server before it polls
STOP_TIMEOUT_S = 20.0  # SIGTERM grace before the worker's process group is killed
KILL_TIMEOUT_S = 5.0
POLL_S = 0.2
QUERY_SECONDS = "2"  # how often a worker asks for scheduled runs (Prefect's default, 10 s, feels stuck)
READY_MARKER = "started!"  # Prefect logs "Worker 'ProcessWorker ...' started!" once it polls
LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class WorkerInfo:
    """One worker as recorded in workers.json; `alive` is observed, not recorded."""

    pool: str
    pid: int
    log_file: str
    started_at: str
    api_url: str
    alive: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- record


def workers_file() -> Path:
    return mat_home() / WORKERS_FILE


def worker_log(pool: str) -> Path:
    return mat_home() / "workers" / f"{pool}.log"


def is_worker_process(pid: int, pool: str) -> bool:
    """Whether `pid` is a live `prefect worker start --pool <pool>` (guards against a recycled pid)."""
    if not pid_alive(pid):
        return False
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc (macOS): trust the record
    return b"worker" in arguments and pool.encode() in arguments


def read_workers() -> dict[str, WorkerInfo]:
    """The recorded workers by pool, `alive` filled in; an unreadable record counts as none."""
    try:
        data = json.loads(workers_file().read_text(encoding="utf-8"))
        workers = {pool: WorkerInfo(**{**entry, "pool": pool}) for pool, entry in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
    return {pool: _observed(info) for pool, info in workers.items()}


def _observed(info: WorkerInfo) -> WorkerInfo:
    return WorkerInfo(**{**info.to_dict(), "alive": is_worker_process(info.pid, info.pool)})


def write_workers(workers: Mapping[str, WorkerInfo]) -> None:
    fields = ("pid", "log_file", "started_at", "api_url")
    write_json_atomically(workers_file(), {p: {f: getattr(w, f) for f in fields} for p, w in workers.items()})


# --------------------------------------------------------------------------- start


def worker_command(pool: str) -> list[str]:
    """`prefect worker start` for a process pool, named after the pool and this host."""
    return [
        sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process",
        "--name", f"{pool}@{socket.gethostname()}",
    ]  # fmt: skip


def restore_sigint() -> None:
    """In the worker before exec: SIGINT back to its default, so SIGTERM (which the worker turns into
    SIGINT to itself) stops it even when mat was started with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def worker_environment(api_url: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """mat's environment (server, result storage, extra loggers) plus a quicker poll for new runs."""
    env = dict(os.environ if base is None else base)
    env["PREFECT_API_URL"] = api_url
    env.setdefault("PREFECT_WORKER_QUERY_SECONDS", QUERY_SECONDS)
    return env


def spawn_worker(pool: str, api_url: str) -> WorkerInfo:
    """Start the worker for `pool` in a session of its own, output to its log file."""
    log_path = worker_log(pool)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n--- mat: starting the worker for {pool} at {datetime.now(UTC)}\n".encode())
        log.flush()
        process = subprocess.Popen(
            worker_command(pool), cwd=mat_home(), env=worker_environment(api_url),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=restore_sigint,
        )  # fmt: skip
    started = datetime.now(UTC).isoformat(timespec="seconds")
    return WorkerInfo(pool, process.pid, str(log_path), started, api_url, alive=True)


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def wait_until_ready(info: WorkerInfo, log_offset: int, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until the worker says it polls its pool; ServerError (with its log's tail) if it exits first."""
    deadline = time.monotonic() + timeout_s
    path = Path(info.log_file)
    while time.monotonic() < deadline:
        if READY_MARKER in read_from(path, log_offset):
            return
        if not pid_alive(info.pid):
            raise ServerError(f"the worker for {info.pool} exited at start; see {path}:\n{log_tail(path)}")
        time.sleep(POLL_S)
    raise ServerError(
        f"the worker for {info.pool} (pid {info.pid}) did not start polling within {timeout_s:.0f} s; "
        f"see {path}, and stop it with `mat worker stop`"
    )


def read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(read_from(path, 0).splitlines()[-lines:]) or "(log is empty)"


def start_workers(pools: Sequence[str], api_url: str) -> list[tuple[WorkerInfo, bool]]:
    """Start a worker for every pool that has none running; (worker, started now) per pool.

    Waits until each new worker polls its pool, so a run submitted right after is picked up.
    """
    workers = {pool: info for pool, info in read_workers().items() if info.alive}
    outcome: list[tuple[WorkerInfo, bool]] = []
    pending: list[tuple[WorkerInfo, int]] = []
    for pool in pools:
        if pool in workers:
            outcome.append((workers[pool], False))
            continue
        offset = log_size(worker_log(pool))
        info = spawn_worker(pool, api_url)
        workers[pool] = info
        pending.append((info, offset))
        outcome.append((info, True))
    write_workers(workers)  # recorded before waiting: `mat worker stop` can end a worker that hangs
    for info, offset in pending:
        wait_until_ready(info, offset)
    return outcome


# --------------------------------------------------------------------------- stop


def stop_worker(info: WorkerInfo, timeout_s: float = STOP_TIMEOUT_S) -> str:
    """SIGTERM the worker, and kill its process group if it outlives `timeout_s`: stopped, killed or gone."""
    if not info.alive:
        return "gone"
    with contextlib.suppress(ProcessLookupError):
        os.kill(info.pid, signal.SIGTERM)
    if _wait_gone(info.pid, timeout_s):
        return "stopped"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(info.pid, signal.SIGKILL)
    if _wait_gone(info.pid, KILL_TIMEOUT_S):
        return "killed"
    raise ServerError(f"the worker for {info.pool} (pid {info.pid}) survived SIGKILL; see `ps -p {info.pid}`")


def stop_workers(timeout_s: float = STOP_TIMEOUT_S) -> list[tuple[WorkerInfo, str]]:
    """Stop every recorded worker and clear the record; (worker, how it ended) per worker."""
    workers = read_workers()
    outcome = [(info, stop_worker(info, timeout_s)) for info in workers.values()]
    workers_file().unlink(missing_ok=True)
    return outcome


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(POLL_S)
    return False


def _reap(pid: int) -> None:
    """Collect the worker's exit status when this process started it (tests do), so it is not a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
