"""Suite-wide isolation: Prefect, mat's own state and torch threads never touch the developer's setup."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

# Set before anything imports prefect: its settings are read once, at import.
_HOME = tempfile.mkdtemp(prefix="mat-test-home-")
os.environ["PREFECT_HOME"] = os.path.join(_HOME, "prefect")
os.environ["MAT_HOME"] = os.path.join(_HOME, "mat")
os.environ.pop("PREFECT_API_URL", None)
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
for _name in [n for n in os.environ if n.startswith("MAT_") and n != "MAT_HOME"]:
    del os.environ[_name]  # a developer's overrides must not leak into tests


SERVER_START_TIMEOUT_S = 180


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """The API URL of one Prefect server on 127.0.0.1 for the whole session (what `mat server start` runs).

    Set in this process and inherited by children, so `mat` subprocesses and workers use it too.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from multiagenttrainer.cli import prefect_server as server

    info = server.start_server(timeout_s=SERVER_START_TIMEOUT_S)
    os.environ["PREFECT_API_URL"] = info.api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: info.api_url}):
            yield info.api_url
    finally:
        # Deliver buffered run logs and events while the server is still there to take them.
        APILogWorker.drain_all(timeout=30)
        EventsWorker.drain_all(timeout=30)
        os.environ.pop("PREFECT_API_URL", None)
        server.stop_server()


@pytest.fixture(scope="session", autouse=True)
def no_prefect_server_left_behind() -> Iterator[None]:
    """`mat` commands run by tests start mat's local Prefect server on first use; it ends with the session."""
    yield
    from multiagenttrainer.cli import prefect_server

    prefect_server.stop_server()


# Fixture modules shared by several feature directories (servers and fakes of tests/support).
pytest_plugins = ["tests.support.git_fixtures", "tests.support.api_fixtures"]
