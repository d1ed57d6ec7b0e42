"""Fixture repositories, a progress recorder and config writing for the orchestration tests.

The session's Prefect server (`prefect_api`) lives in tests/conftest.py, shared with the CLI tests.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.git_servers import RepoFactory


@pytest.fixture(scope="session")
def flow_repos(tmp_path_factory: pytest.TempPathFactory) -> RepoFactory:
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
