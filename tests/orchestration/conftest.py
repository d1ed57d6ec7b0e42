"""One real Prefect server for the whole session, plus fixture repositories and a progress recorder.

The server is started with `multiagenttrainer.server.start_server` under the suite's temporary
MAT_HOME (tests/conftest.py), so it exercises the same code as `mat server start`; every test
that runs a flow shares it instead of paying for Prefect's ephemeral mode.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, temporary_settings

from multiagenttrainer import server
from tests.git_sources.servers import RepoFactory

SERVER_START_TIMEOUT_S = 180


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """The API URL of a Prefect server on 127.0.0.1, set for this process and its children."""
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


@pytest.fixture(scope="session")
def repo_factory(tmp_path_factory: pytest.TempPathFactory) -> RepoFactory:
    return RepoFactory(
        tmp_path_factory.mktemp("orchestration-git"), tmp_path_factory.mktemp("orchestration-work")
    )


class RecordingProgress:
    """An IngestProgress that keeps every event (events arrive from several threads)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[Any, ...]]] = []
        self._lock = threading.Lock()

    def _add(self, name: str, *args: Any) -> None:
        with self._lock:
            self.events.append((name, args))

    def source_started(self, source: str) -> None:
        self._add("source_started", source)

    def source_finished(self, source: str, error: str | None, cached: bool) -> None:
        self._add("source_finished", source, error, cached)

    def corpus_started(self, total_files: int | None) -> None:
        self._add("corpus_started", total_files)

    def corpus_advanced(self, files: int, nbytes: int) -> None:
        self._add("corpus_advanced", files, nbytes)

    def corpus_finished(self, reused: bool) -> None:
        self._add("corpus_finished", reused)

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [args for event, args in self.events if event == name]


def write_config(path: Path, sources: list[dict[str, Any]], corpus_dir: Path, staging: Path) -> Path:
    """A config file with `sources` and corpus/staging directories of the test's own."""
    document = {"sources": sources, "corpus": {"dir": str(corpus_dir), "staging_dir": str(staging)}}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path
