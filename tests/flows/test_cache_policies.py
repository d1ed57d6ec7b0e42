"""Cache keys of the ingest tasks: equal for equal inputs, different otherwise, absent when files are gone."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prefect.filesystems import LocalFileSystem
from prefect.results import ResultStore
from prefect.serializers import JSONSerializer
from prefect.states import Completed, Failed

from multiagenttrainer.errors import SourceError, TransientSourceError
from multiagenttrainer.sources import Snapshot, Tree
from tasks.ingest import (
    CorpusCachePolicy,
    FetchCachePolicy,
    corpus_cache_key,
    fetch_cache_key,
    retry_if_transient,
)

CFG = {"type": "remote_repo", "url": "https://git.example.com/a/b.git", "branch": "main"}
GITHUB = {"web_url": "https://github.com", "api_url": "https://api.github.com"}


def fetch_inputs(**overrides: Any) -> dict[str, Any]:
    inputs = {"source_cfg": CFG, "name": "a/b", "github": GITHUB, "staging": "/stage", "version": "abc123"}
    return {**inputs, **overrides}


def test_fetch_key_is_stable_for_equal_inputs() -> None:
    first = fetch_cache_key(**{k: v for k, v in fetch_inputs().items()})
    second = fetch_cache_key(**fetch_inputs(source_cfg=dict(reversed(list(CFG.items())))))
    assert first is not None and first == second


@pytest.mark.parametrize(
    "change",
    [
        {"version": "def456"},
        {"name": "other"},
        {"staging": "/elsewhere"},
        {"source_cfg": {**CFG, "branch": "dev"}},
        {"github": {**GITHUB, "web_url": "https://ghe.example.com"}},
    ],
)
def test_fetch_key_changes_with_any_input(change: dict[str, Any]) -> None:
    assert fetch_cache_key(**fetch_inputs(**change)) != fetch_cache_key(**fetch_inputs())


def test_fetch_key_does_not_depend_on_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment's flow run works in a fresh clone of the project: it must find `mat ingest`'s fetch."""
    here = fetch_cache_key(**fetch_inputs())
    monkeypatch.chdir(tmp_path)
    assert fetch_cache_key(**fetch_inputs()) == here


def test_fetch_without_a_version_is_never_cached() -> None:
    assert fetch_cache_key(**fetch_inputs(version=None)) is None


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    return ResultStore(
        result_storage=LocalFileSystem(basepath=str(tmp_path / "results")), serializer=JSONSerializer()
    )


def snapshot_with_tree(path: Path) -> dict[str, Any]:
    return Snapshot(
        source="a/b", type="remote_repo", version="abc123", trees=[Tree("a/b", "git", str(path))]
    ).to_dict()


def test_fetch_policy_uses_a_cached_snapshot_only_while_its_trees_exist(
    store: ResultStore, tmp_path: Path
) -> None:
    policy, ctx = FetchCachePolicy(), SimpleNamespace(result_store=store)
    key = policy.compute_key(ctx, fetch_inputs(), {})  # type: ignore[arg-type]
    assert key is not None  # nothing cached yet: a key, so the fetch's result gets stored
    tree = tmp_path / "clone.git"
    tree.mkdir()
    store.write(snapshot_with_tree(tree), key=key)
    assert policy.compute_key(ctx, fetch_inputs(), {}) == key  # type: ignore[arg-type]
    tree.rmdir()
    assert policy.compute_key(ctx, fetch_inputs(), {}) is None  # type: ignore[arg-type]


def test_fetch_policy_never_reuses_an_incomplete_snapshot(store: ResultStore, tmp_path: Path) -> None:
    """A snapshot that names failed repositories is fetched again next time, so they get another try."""
    policy, ctx = FetchCachePolicy(), SimpleNamespace(result_store=store)
    key = policy.compute_key(ctx, fetch_inputs(), {})  # type: ignore[arg-type]
    tree = tmp_path / "clone.git"
    tree.mkdir()
    incomplete = {**snapshot_with_tree(tree), "failures": ["acme/ghost: cannot reach the host"]}
    store.write(incomplete, key=key)
    assert policy.compute_key(ctx, fetch_inputs(), {}) is None  # type: ignore[arg-type]


def write_corpus(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("corpus.txt", "corpus.jsonl", "stats.json"):
        (directory / name).write_text(name)
    return directory / "corpus.txt"


SNAPSHOTS = [
    {"source": "b", "type": "local_repo", "version": "2", "trees": []},
    {"source": "a", "type": "remote_repo", "version": "1", "trees": []},
]
OPTIONS = {"max_file_bytes": 1024, "dedupe": True}


def test_corpus_key_needs_every_output_file(tmp_path: Path) -> None:
    corpus_txt = write_corpus(tmp_path / "out")
    assert corpus_cache_key(SNAPSHOTS, OPTIONS, str(corpus_txt)) is not None
    (tmp_path / "out" / "stats.json").unlink()
    assert corpus_cache_key(SNAPSHOTS, OPTIONS, str(corpus_txt)) is None


def test_corpus_key_ignores_snapshot_order_but_not_content(tmp_path: Path) -> None:
    corpus_txt = str(write_corpus(tmp_path / "out"))
    key = corpus_cache_key(SNAPSHOTS, OPTIONS, corpus_txt)
    assert corpus_cache_key(list(reversed(SNAPSHOTS)), OPTIONS, corpus_txt) == key
    changed = [{**SNAPSHOTS[0], "version": "3"}, SNAPSHOTS[1]]
    assert corpus_cache_key(changed, OPTIONS, corpus_txt) != key
    assert corpus_cache_key(SNAPSHOTS, {**OPTIONS, "dedupe": False}, corpus_txt) != key


def test_corpus_key_changes_when_the_output_files_change(tmp_path: Path) -> None:
    corpus_txt = write_corpus(tmp_path / "out")
    key = corpus_cache_key(SNAPSHOTS, OPTIONS, str(corpus_txt))
    stat = corpus_txt.stat()
    os.utime(corpus_txt, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert corpus_cache_key(SNAPSHOTS, OPTIONS, str(corpus_txt)) != key


def test_corpus_policy_reads_only_its_own_inputs(tmp_path: Path) -> None:
    corpus_txt = str(write_corpus(tmp_path / "out"))
    inputs = {"snapshots": SNAPSHOTS, "options": OPTIONS, "corpus_txt": corpus_txt}
    key = CorpusCachePolicy().compute_key(None, inputs, {})  # type: ignore[arg-type]
    assert key == corpus_cache_key(SNAPSHOTS, OPTIONS, corpus_txt)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (Failed(data=TransientSourceError("a", "connection reset")), True),
        (Failed(data=SourceError("a", "repository not found")), False),
        (Failed(data=ValueError("bug")), False),
        (Completed(data="sha"), False),
    ],
)
def test_only_transient_failures_are_retried(state: Any, expected: bool) -> None:
    assert retry_if_transient(None, None, state) is expected
