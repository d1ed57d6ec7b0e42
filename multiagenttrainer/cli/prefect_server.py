"""The local Prefect server behind `mat server start|stop|status`, and how mat commands find it.

This is orchestration, not domain code, so it lives beside the CLI and the library never imports it.

Prefect's ephemeral mode starts a throw-away API server inside every command (about 15 s here). A
long-lived server on 127.0.0.1 avoids that: it keeps its SQLite database in ``$MAT_HOME/prefect``,
logs to ``$MAT_HOME/server.log`` and records itself in ``$MAT_HOME/server.json`` ({pid, port, api_url,
ui_url, started_at}), which later commands read through `configure_prefect_environment` before they
import prefect.

It runs Prefect's own `prefect server start`, but not with `--background`: that mode leaves the server
in the caller's process group (a Ctrl-C in the terminal that started it would kill it later) and pipes
its output to a pipe nobody reads. mat starts it in a session of its own with its output in a log file,
picks a free port, and waits until it answers. It also writes Prefect's own pid file
(``$PREFECT_HOME/server.pid``), so `prefect server stop` stops mat's server as well.

Which server a flow-running command uses (`ensure_prefect_server`):
- PREFECT_API_URL set (the user's own or a remote server): that one;
- otherwise, with MAT_PREFECT_SERVER unset or `local`: mat's local server, started on first use and kept
  running for later commands (the command says so when it starts it; `mat server stop` ends it);
- MAT_PREFECT_SERVER=ephemeral: a server for this command only, stopped when the command ends, and
  by the kernel when mat itself is killed (PR_SET_PDEATHSIG), so nothing is left behind.
Starting either kind holds a lock on ``$MAT_HOME/server.lock`` until the server answers, so two first
commands at once never race on the database's migrations. Commands with different MAT_HOMEs (several
users, or test sessions, on one machine) can still pick the same free port at once: a server counts as
started only when the listening socket on its port belongs to it, and one that lost the port to
another is started again on the next free port.

Every process mat points at a server shares one result storage, ``$MAT_HOME/prefect/storage``
(PREFECT_RESULTS_LOCAL_STORAGE_PATH), so cache entries written by `mat ingest` serve a worker's flow run
and the other way round. `mat server start` also writes the Prefect profile `mat` (prefect_profile.py)
so that the plain `prefect` command finds this server.

This module never imports prefect: it runs ``python -m prefect server start`` as a child process
and talks to it over plain HTTP.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.errors import ServerError
from multiagenttrainer.processes import die_with_parent_hook, pid_alive, start_in_session

log = logging.getLogger(__name__)
T = TypeVar("T")

HOST = "127.0.0.1"
DEFAULT_PORT = 4200
PORT_SEARCH_SPAN = 100  # ports tried after DEFAULT_PORT when it is taken
LOG_TAIL_LINES = 20
EXTRA_LOGGER = "multiagenttrainer"
MODE_VARIABLE = "MAT_PREFECT_SERVER"
MODES = ("local", "ephemeral")
START_TIMEOUT_S = 180.0  # a fresh database is migrated first: 15-30 s here, more under load
PORT_ATTEMPTS = 5  # ports tried when another server takes the chosen one first


@dataclass(frozen=True)
class ServerInfo:
    """A mat-managed Prefect server as recorded in server.json, plus what was observed now."""

    pid: int
    port: int
    api_url: str
    ui_url: str
    started_at: str  # ISO 8601, UTC
    log_file: str = ""
    healthy: bool = False
    alive: bool = False
    already_running: bool = False

    @property
    def uptime_s(self) -> float:
        """Seconds since the server was started."""
        started = datetime.fromisoformat(self.started_at)
        return max(0.0, (datetime.now(UTC) - started).total_seconds())

    def to_dict(self) -> dict[str, Any]:
        """Everything known about the server, uptime included (for `mat server status --json`)."""
        return {**asdict(self), "uptime_s": round(self.uptime_s, 1)}


# --------------------------------------------------------------------------- paths


def mat_home() -> Path:
    """mat's own state directory: $MAT_HOME, or ~/.mat."""
    return Path(os.environ.get("MAT_HOME") or Path.home() / ".mat").expanduser()


def prefect_home() -> Path:
    """The PREFECT_HOME mat uses: the local server's database, results and cache records."""
    return mat_home() / "prefect"


def results_storage_path() -> Path:
    """Where every process mat starts (and the `mat` profile's workers) keep results and cache records."""
    return prefect_home() / "storage"


def state_file() -> Path:
    """Where the running server is recorded."""
    return mat_home() / "server.json"


def log_file() -> Path:
    """Where the server's output goes."""
    return mat_home() / "server.log"


def lock_file() -> Path:
    """Held while a server starts, so concurrent commands start one server, one migration at a time."""
    return mat_home() / "server.lock"


def prefect_pid_file() -> Path:
    """Prefect's own record of a background server, read by `prefect server stop`."""
    return prefect_home() / "server.pid"


# --------------------------------------------------------------------------- probes


def api_url_for(port: int) -> str:
    return f"http://{HOST}:{port}/api"


def ui_url_for(port: int) -> str:
    return f"http://{HOST}:{port}"


def is_healthy(api_url: str, timeout_s: float = 0.5) -> bool:
    """Whether GET <api_url>/health answers 200 within `timeout_s`."""
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def port_is_free(port: int) -> bool:
    """Whether 127.0.0.1:`port` can be bound (the same test `prefect server start` makes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def choose_port(port: int | None) -> int:
    """`port` if given and free; otherwise DEFAULT_PORT or the next free port after it."""
    if port is not None:
        if not port_is_free(port):
            raise ServerError(f"port {port} on {HOST} is in use; pick another with --port or omit it")
        return port
    for candidate in range(DEFAULT_PORT, DEFAULT_PORT + PORT_SEARCH_SPAN):
        if port_is_free(candidate):
            return candidate
    raise ServerError(
        f"no free port between {DEFAULT_PORT} and {DEFAULT_PORT + PORT_SEARCH_SPAN - 1} on {HOST}; "
        "free one or pass --port"
    )


class PortTaken(ServerError):
    """Another server took the chosen port before the one being started could listen on it."""


def is_prefect_server_process(pid: int) -> bool:
    """Whether `pid` looks like a `prefect server start` (guards against a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc (macOS): trust the state file
    return b"prefect" in cmdline and b"server" in cmdline


# --------------------------------------------------------------------------- state file


def read_state() -> ServerInfo | None:
    """The server recorded in server.json, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads(state_file().read_text(encoding="utf-8"))
        return ServerInfo(
            pid=int(data["pid"]),
            port=int(data["port"]),
            api_url=str(data["api_url"]),
            ui_url=str(data["ui_url"]),
            started_at=str(data["started_at"]),
            log_file=str(data.get("log_file", log_file())),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_state(info: ServerInfo) -> None:
    """Record a server in server.json (atomically, so readers never see half a file)."""
    fields = ("pid", "port", "api_url", "ui_url", "started_at", "log_file")
    write_json_atomically(state_file(), {key: getattr(info, key) for key in fields})
    prefect_pid_file().parent.mkdir(parents=True, exist_ok=True)
    prefect_pid_file().write_text(str(info.pid), encoding="utf-8")


def clear_state() -> None:
    state_file().unlink(missing_ok=True)
    prefect_pid_file().unlink(missing_ok=True)


# --------------------------------------------------------------------------- public API


def server_status(timeout_s: float = 0.5) -> ServerInfo | None:
    """The recorded server with `alive` and `healthy` filled in, or None when none is recorded."""
    info = read_state()
    if info is None:
        return None
    alive = pid_alive(info.pid) and is_prefect_server_process(info.pid)
    healthy = alive and is_healthy(info.api_url, timeout_s)
    return replace(info, alive=alive, healthy=healthy)


def discover_api_url(timeout_s: float = 0.5) -> str | None:
    """The API URL of the running mat server, if it is recorded and answers within `timeout_s`."""
    info = read_state()
    if info is None or not is_healthy(info.api_url, timeout_s):
        return None
    return info.api_url


@contextlib.contextmanager
def starting_lock() -> Iterator[None]:
    """Hold ``$MAT_HOME/server.lock`` (waits while another command starts a server)."""
    mat_home().mkdir(parents=True, exist_ok=True)
    with lock_file().open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def start_server(port: int | None = None, timeout_s: float = START_TIMEOUT_S) -> ServerInfo:
    """Start the local Prefect server in the background (or return the one already running)."""
    with starting_lock():
        running = _adopt_running_server(timeout_s)
        if running is not None:
            return running
        if port is not None:
            return _start_recorded_server(choose_port(port), timeout_s)
        return _on_a_free_port(lambda chosen: _start_recorded_server(chosen, timeout_s))


def _on_a_free_port(start: Callable[[int], T]) -> T:
    """`start(port)` on a free port, again on the next one while other servers take them first."""
    for _ in range(PORT_ATTEMPTS - 1):
        with contextlib.suppress(PortTaken):
            return start(choose_port(None))
    return start(choose_port(None))


def _start_recorded_server(chosen: int, timeout_s: float) -> ServerInfo:
    process = _spawn_server(chosen)
    info = ServerInfo(
        pid=process.pid,
        port=chosen,
        api_url=api_url_for(chosen),
        ui_url=ui_url_for(chosen),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        log_file=str(log_file()),
        alive=True,
    )
    write_state(info)  # early, so a concurrent `mat server status` sees it starting
    if not _wait_until_healthy(info, timeout_s, process):
        _terminate_group(info.pid, timeout_s=10.0)
        clear_state()
        _raise_start_failure(info, timeout_s)
    log.info("Prefect server started at %s (pid %d)", info.ui_url, info.pid)
    return replace(info, healthy=True)


def stop_server(timeout_s: float = 15.0) -> bool:
    """Stop the recorded server (SIGTERM, then SIGKILL after `timeout_s`); False when none ran."""
    info = read_state()
    if info is None:
        return False
    stopped = False
    if pid_alive(info.pid) and is_prefect_server_process(info.pid):
        _terminate_group(info.pid, timeout_s)
        stopped = True
    clear_state()
    return stopped


def configure_prefect_environment(
    env: MutableMapping[str, str] | None = None, *, discover: bool = True
) -> str | None:
    """Point Prefect at mat's server, or at mat's home in ephemeral mode; call before importing prefect.

    Returns the API URL in use, or None for ephemeral mode. An explicit PREFECT_API_URL wins; with
    `discover`, a running mat server is used.
    """
    env = os.environ if env is None else env
    env.setdefault("DO_NOT_TRACK", "1")
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT_LOGGING_EXTRA_LOGGERS"] = _with_extra_logger(env.get("PREFECT_LOGGING_EXTRA_LOGGERS", ""))
    # one result storage for mat, its workers and their flow runs, whichever PREFECT_HOME each has
    env.setdefault("PREFECT_RESULTS_LOCAL_STORAGE_PATH", str(results_storage_path()))
    if "prefect" in sys.modules:
        log.warning("prefect was imported before configure_prefect_environment(); settings may be ignored")
    if env.get("PREFECT_API_URL"):
        return env["PREFECT_API_URL"]
    env["PREFECT_HOME"] = str(prefect_home())
    # The ephemeral server cannot create its SQLite file in a missing directory, and then
    # only reports a start-up timeout; create it up front.
    prefect_home().mkdir(parents=True, exist_ok=True)
    url = discover_api_url() if discover else None
    if url is not None:
        env["PREFECT_API_URL"] = url
        return url
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    return None


def server_mode(env: MutableMapping[str, str]) -> str:
    """`local` (default) or `ephemeral`, from MAT_PREFECT_SERVER."""
    mode = (env.get(MODE_VARIABLE) or "local").strip().lower()
    if mode not in MODES:
        raise ServerError(f"{MODE_VARIABLE}={mode!r} is not a server mode; use one of: {', '.join(MODES)}")
    return mode


def ensure_prefect_server(
    announce: Callable[[str], None], env: MutableMapping[str, str] | None = None
) -> str:
    """The API URL a flow-running command uses, starting a server when there is none (module docstring).

    `announce` is told when a server is started for the user, and how to stop it.
    """
    env = os.environ if env is None else env
    ephemeral = server_mode(env) == "ephemeral"
    url = configure_prefect_environment(env, discover=not ephemeral)
    if url is None:
        url = start_ephemeral_server(env) if ephemeral else start_local_server_on_first_use(announce)
        env["PREFECT_API_URL"] = url
    return url


def start_local_server_on_first_use(announce: Callable[[str], None]) -> str:
    """mat's local server: the running one, or one started now (and announced) for later commands too."""
    with starting_lock():
        url = discover_api_url()
        if url is not None:
            return url  # another command started it while this one waited for the lock
        info = _on_a_free_port(lambda chosen: _start_recorded_server(chosen, START_TIMEOUT_S))
    announce(
        f"Started a local Prefect server for this and later mat commands: UI {info.ui_url}, "
        f"log {info.log_file}. Stop it with `mat server stop`."
    )
    return info.api_url


def start_ephemeral_server(env: MutableMapping[str, str]) -> str:
    """A server for this command only; it ends with the command, even when mat is killed."""
    with starting_lock():
        return _on_a_free_port(lambda port: _start_ephemeral_on(port, env))


def _start_ephemeral_on(port: int, env: MutableMapping[str, str]) -> str:
    mat_home().mkdir(parents=True, exist_ok=True)
    with log_file().open("ab") as log_handle:
        process = subprocess.Popen(
            server_command(port), cwd=mat_home(), env=server_environment(port, env),
            stdin=subprocess.DEVNULL, stdout=log_handle, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent_hook(signal.SIGTERM),
        )  # fmt: skip
    atexit.register(_terminate_group_quietly, process.pid)
    info = ServerInfo(process.pid, port, api_url_for(port), ui_url_for(port), "", str(log_file()))
    if not _wait_until_healthy(info, START_TIMEOUT_S, process):
        _terminate_group_quietly(process.pid)
        _raise_start_failure(info, START_TIMEOUT_S)
    return info.api_url


def server_environment(port: int, base: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The environment the server process runs with: mat's PREFECT_HOME, telemetry off, UI on."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "PREFECT_HOME": str(prefect_home()),
            "PREFECT_API_URL": api_url_for(port),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "true",
            "DO_NOT_TRACK": "1",
        }
    )
    return env


# --------------------------------------------------------------------------- helpers


def _with_extra_logger(current: str) -> str:
    names = [name.strip() for name in current.split(",") if name.strip()]
    return ",".join(names if EXTRA_LOGGER in names else [*names, EXTRA_LOGGER])


def _adopt_running_server(timeout_s: float) -> ServerInfo | None:
    """The recorded server if it is (or becomes) healthy; a stale record is removed."""
    info = server_status()
    if info is None:
        return None
    if info.healthy:
        return replace(info, already_running=True)
    if info.alive and _wait_until_healthy(info, timeout_s, process=None):
        return replace(info, healthy=True, already_running=True)  # it was still starting
    if info.alive:
        raise ServerError(
            f"a Prefect server (pid {info.pid}) is running but {info.api_url} does not answer; "
            f"see {info.log_file}, then run `mat server stop` and start it again"
        )
    clear_state()
    return None


def server_command(port: int) -> list[str]:
    """`prefect server start` on 127.0.0.1:`port`, telemetry off."""
    return [
        sys.executable, "-m", "prefect", "server", "start",
        "--host", HOST, "--port", str(port), "--analytics-off",
    ]  # fmt: skip


def _spawn_server(port: int) -> subprocess.Popen[bytes]:
    command = server_command(port)
    prefect_home().mkdir(parents=True, exist_ok=True)
    with log_file().open("ab") as log_handle:
        log_handle.write(f"\n--- mat: starting {' '.join(command[1:])} at {datetime.now(UTC)}\n".encode())
        log_handle.flush()
        # its own session and process group: it survives the CLI and stops as a group
        return start_in_session(command, mat_home(), log_handle, server_environment(port), contained=False)


def _wait_until_healthy(info: ServerInfo, timeout_s: float, process: subprocess.Popen[bytes] | None) -> bool:
    """Whether the server `info` names answers before `timeout_s`: its own process, alive, listening on its
    port (another server that took the port between choose_port and the start does not count)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exited = process.poll() is not None if process is not None else not pid_alive(info.pid)
        if exited:
            return False
        if is_healthy(info.api_url, timeout_s=1.0) and listens_on(info.pid, info.port):
            return True
        time.sleep(0.25)
    return False


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on 127.0.0.1:`port` (from /proc/net/tcp); empty without /proc."""
    wanted = f"0100007F:{port:04X}"
    inodes: set[str] = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return inodes
    for line in lines:
        fields = line.split()
        if len(fields) > 9 and fields[1] == wanted and fields[3] == "0A":  # 0A: LISTEN
            inodes.add(fields[9])
    return inodes


def listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on 127.0.0.1:`port` (True where /proc cannot say)."""
    inodes = listening_inodes(port)
    if not Path("/proc/net/tcp").exists():
        return True
    try:
        links = [os.readlink(entry.path) for entry in os.scandir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return any(link == f"socket:[{inode}]" for inode in inodes for link in links)


def _terminate_group_quietly(pid: int) -> None:
    with contextlib.suppress(ServerError):
        _terminate_group(pid, timeout_s=10.0)


def _terminate_group(pid: int, timeout_s: float) -> None:
    """SIGTERM the process group led by `pid`; SIGKILL it if it is still alive after `timeout_s`."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.1)
    raise ServerError(f"the Prefect server (pid {pid}) did not stop after SIGKILL; check `ps -p {pid}`")


def _raise_start_failure(info: ServerInfo, timeout_s: float) -> NoReturn:
    """PortTaken when another server now listens on the port, else ServerError with the log's tail."""
    if not port_is_free(info.port):
        raise PortTaken(f"port {info.port} was taken by another server while this one started")
    raise ServerError(_startup_failure_message(info, timeout_s))


def _startup_failure_message(info: ServerInfo, timeout_s: float) -> str:
    tail = _log_tail(Path(info.log_file), LOG_TAIL_LINES)
    return (
        f"the Prefect server did not become healthy at {info.api_url} within {timeout_s:.0f} s; "
        f"see {info.log_file}. Last lines:\n{tail}"
    )


def _log_tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"
