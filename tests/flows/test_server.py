"""The local Prefect server mat manages, and how later commands find it."""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from multiagenttrainer.cli import prefect_server as server
from multiagenttrainer.errors import ServerError


@pytest.fixture
def mat_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "mat-home"
    monkeypatch.setenv("MAT_HOME", str(home))
    return home


class HealthHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[int]:
    """A stand-in API on 127.0.0.1 that only answers /api/health."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HealthHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def record(port: int) -> None:
    """Write server.json for a server on `port` (this process's pid stands in for the server's)."""
    server.mat_home().mkdir(parents=True, exist_ok=True)
    info = server.ServerInfo(
        pid=os.getpid(),
        port=port,
        api_url=server.api_url_for(port),
        ui_url=server.ui_url_for(port),
        started_at=datetime.now(UTC).isoformat(),
    )
    server.write_state(info)


def test_mat_home_defaults_to_dot_mat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAT_HOME")
    assert server.mat_home() == Path.home() / ".mat"


def test_discover_finds_a_recorded_healthy_server(mat_home: Path, health_server: int) -> None:
    assert server.discover_api_url() is None
    record(health_server)
    assert server.discover_api_url() == f"http://127.0.0.1:{health_server}/api"


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_discover_ignores_a_recorded_server_that_does_not_answer(mat_home: Path) -> None:
    record(closed_port())
    assert server.discover_api_url(timeout_s=0.2) is None


def test_configure_points_prefect_at_the_running_server(mat_home: Path, health_server: int) -> None:
    record(health_server)
    env: dict[str, str] = {"PREFECT_LOGGING_EXTRA_LOGGERS": "botocore"}
    assert server.configure_prefect_environment(env) == f"http://127.0.0.1:{health_server}/api"
    assert env["PREFECT_API_URL"] == f"http://127.0.0.1:{health_server}/api"
    assert env["PREFECT_HOME"] == str(mat_home / "prefect")
    assert env["PREFECT_LOGGING_EXTRA_LOGGERS"] == "botocore,multiagenttrainer"
    assert env["DO_NOT_TRACK"] == "1" and env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"


def test_configure_respects_an_explicit_api_url(mat_home: Path, health_server: int) -> None:
    record(health_server)
    env = {"PREFECT_API_URL": "http://prefect.example.com/api", "PREFECT_HOME": "/mine", "DO_NOT_TRACK": "0"}
    assert server.configure_prefect_environment(env) == "http://prefect.example.com/api"
    assert env["PREFECT_HOME"] == "/mine" and env["DO_NOT_TRACK"] == "0"
    assert env["PREFECT_LOGGING_EXTRA_LOGGERS"] == "multiagenttrainer"


def test_configure_without_a_server_keeps_ephemeral_mode_in_mat_home(mat_home: Path) -> None:
    env: dict[str, str] = {}
    assert server.configure_prefect_environment(env) is None
    assert "PREFECT_API_URL" not in env
    assert env["PREFECT_HOME"] == str(mat_home / "prefect")
    assert (mat_home / "prefect").is_dir()  # Prefect's ephemeral server needs it to exist
    assert env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "90"
    server.configure_prefect_environment(env)
    assert env["PREFECT_LOGGING_EXTRA_LOGGERS"] == "multiagenttrainer"  # not added twice


def test_an_explicit_port_in_use_is_refused(mat_home: Path, health_server: int) -> None:
    with pytest.raises(ServerError, match=f"port {health_server} .* in use"):
        server.start_server(port=health_server)
    assert server.server_status() is None


def test_a_server_that_never_gets_healthy_is_stopped_and_reported(mat_home: Path) -> None:
    with pytest.raises(ServerError) as caught:
        server.start_server(timeout_s=0.01)
    assert str(mat_home / "server.log") in str(caught.value)
    assert "Last lines:" in str(caught.value)
    assert server.server_status() is None and not (mat_home / "server.json").exists()


def test_stop_without_a_server_is_a_no_op(mat_home: Path) -> None:
    assert server.stop_server() is False


@pytest.mark.integration
def test_server_lifecycle(mat_home: Path) -> None:
    started = server.start_server(timeout_s=120)
    try:
        assert started.healthy and not started.already_running
        assert (mat_home / "prefect" / "prefect.db").exists()
        again = server.start_server()
        assert again.already_running and again.pid == started.pid and again.port == started.port
        status = server.server_status()
        assert status is not None and status.healthy and status.alive and status.uptime_s >= 0
        assert status.ui_url == f"http://127.0.0.1:{started.port}"
        assert server.discover_api_url() == started.api_url
    finally:
        assert server.stop_server(timeout_s=20) is True
    assert not server.pid_alive(started.pid)
    assert server.server_status() is None
    assert server.discover_api_url() is None
    assert server.stop_server() is False


def test_a_port_is_told_apart_by_the_process_listening_on_it(health_server: int) -> None:
    """Another server answering on the chosen port (another MAT_HOME, another user) is not ours."""
    listener = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None
        port = int(re.search(r"port (\d+)", listener.stdout.readline().decode()).group(1))  # type: ignore[union-attr]
        assert server.listens_on(listener.pid, port)
        assert not server.listens_on(listener.pid, health_server)  # served by this test process
        assert server.listens_on(os.getpid(), health_server)
    finally:
        listener.kill()
        listener.wait(timeout=10)


def test_a_server_whose_port_answers_for_another_is_not_started(mat_home: Path, health_server: int) -> None:
    sleeper = subprocess.Popen(
        ["sleep", "30"], start_new_session=True
    )  # stands in for a server still importing
    try:
        info = server.ServerInfo(sleeper.pid, health_server, server.api_url_for(health_server), "", "")
        assert server.is_healthy(info.api_url)
        assert not server._wait_until_healthy(info, 1.0, sleeper)  # healthy, but not on its own socket
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


def test_a_start_that_lost_its_port_is_tried_on_the_next_free_one(mat_home: Path) -> None:
    tried: list[int] = []

    def start(port: int) -> int:
        tried.append(port)
        if len(tried) < 3:
            raise server.PortTaken(f"port {port} was taken by another server while this one started")
        return port

    assert server._on_a_free_port(start) == tried[-1] and len(tried) == 3
