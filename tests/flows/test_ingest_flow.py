"""The ingest flow in this process against a real Prefect server: caching, failures, progress."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from flows.ingest import run_ingest
from multiagenttrainer.errors import ConfigError, IngestIncomplete
from multiagenttrainer.ingest import LOCK_FILE
from tests.flows.conftest import RecordingProgress, write_config
from tests.support.git_servers import FixtureRepo, RepoFactory


def remote(repo: FixtureRepo, name: str) -> dict[str, str]:
    return {"type": "remote_repo", "url": repo.bare.as_uri(), "name": name}


@pytest.mark.integration
def test_a_second_ingest_of_unchanged_sources_fetches_nothing(
    prefect_api: str, flow_repos: RepoFactory, tmp_path: Path
) -> None:
    first_repo, second_repo = flow_repos.create(), flow_repos.create()
    config = write_config(
        tmp_path / "mat.yaml",
        [remote(first_repo, "first"), remote(second_repo, "second")],
        tmp_path / "corpus",
        tmp_path / "staging",
    )
    first = run_ingest(config, progress=RecordingProgress())
    assert {s["name"]: s["status"] for s in first["sources"]} == {"first": "fetched", "second": "fetched"}
    assert first["failures"] == []

    progress = RecordingProgress()
    second = run_ingest(config, progress=progress)
    assert {s["name"]: s["status"] for s in second["sources"]} == {"first": "cached", "second": "cached"}
    assert sorted(progress.named("source_finished")) == [("first", None, True), ("second", None, True)]
    assert sorted(progress.named("source_started")) == [("first",), ("second",)]
    assert progress.named("corpus_finished") == [(True,)]
    assert first["corpus_status"] == "built" and second["corpus_status"] == "reused"
    assert second["stats"]["reused"] is True and second["stats"]["files"] == first["stats"]["files"]
    assert json.loads((tmp_path / "corpus" / "stats.json").read_text())["files"] == first["stats"]["files"]

    third = run_ingest(config)  # the corpus files now match a cached build: the builder is skipped
    assert third["corpus_status"] == "cached" and third["stats"]["files"] == first["stats"]["files"]


@pytest.mark.integration
def test_cached_results_are_not_used_once_their_files_are_gone(
    prefect_api: str, flow_repos: RepoFactory, tmp_path: Path
) -> None:
    repo = flow_repos.create()
    corpus, staging = tmp_path / "corpus", tmp_path / "staging"
    config = write_config(tmp_path / "mat.yaml", [remote(repo, "widgets")], corpus, staging)
    for _ in range(3):
        run_ingest(config)  # fetch, then corpus: both cached by the third run
    shutil.rmtree(staging)
    shutil.rmtree(corpus)
    again = run_ingest(config)
    assert again["sources"][0]["status"] == "fetched" and again["corpus_status"] == "built"
    assert any(staging.iterdir())
    assert "def spin(n: int)" in (corpus / "corpus.txt").read_text()


@pytest.mark.integration
def test_a_new_commit_is_fetched_again(prefect_api: str, flow_repos: RepoFactory, tmp_path: Path) -> None:
    repo = flow_repos.create()
    config = write_config(
        tmp_path / "mat.yaml", [remote(repo, "widgets")], tmp_path / "corpus", tmp_path / "staging"
    )
    run_ingest(config)
    new_sha = repo.commit({"src/widgets/new_module.py": b"NEW_MODULE_MARKER = 1\n"})
    summary = run_ingest(config)
    assert summary["sources"] == [
        {"name": "widgets", "type": "remote_repo", "status": "fetched", "version": new_sha}
    ]
    assert "NEW_MODULE_MARKER" in (tmp_path / "corpus" / "corpus.txt").read_text()


@pytest.mark.integration
def test_a_failing_source_is_reported_and_the_others_land_in_the_corpus(
    prefect_api: str, flow_repos: RepoFactory, tmp_path: Path
) -> None:
    good = flow_repos.create()
    missing = {"type": "remote_repo", "url": (tmp_path / "no-such-repo.git").as_uri(), "name": "ghost"}
    config = write_config(
        tmp_path / "mat.yaml", [remote(good, "good"), missing], tmp_path / "corpus", tmp_path / "staging"
    )
    progress = RecordingProgress()
    with pytest.raises(IngestIncomplete) as caught:
        run_ingest(config, progress=progress)
    summary = caught.value.summary
    assert [f["source"] for f in summary["failures"]] == ["ghost"]
    assert "no-such-repo" in summary["failures"][0]["error"]
    assert {s["name"]: s["status"] for s in summary["sources"]} == {"good": "fetched", "ghost": "failed"}
    assert "ghost" in str(caught.value) and "1 of 2 sources failed" in str(caught.value)
    corpus = (tmp_path / "corpus" / "corpus.txt").read_text()
    assert "def spin(n: int)" in corpus  # the good repository's src/widgets/core.py
    assert ("ghost", summary["failures"][0]["error"], False) in progress.named("source_finished")


@pytest.mark.integration
def test_repo_arguments_are_ingested_without_a_sources_section(
    prefect_api: str, flow_repos: RepoFactory, tmp_path: Path
) -> None:
    repo = flow_repos.create()
    config = write_config(tmp_path / "mat.yaml", [], tmp_path / "unused", tmp_path / "staging")
    summary = run_ingest(config, repos=[repo.bare.as_uri()], corpus_dir=tmp_path / "chosen")
    assert [s["type"] for s in summary["sources"]] == ["remote_repo"]
    assert summary["corpus_dir"] == str(tmp_path / "chosen")
    assert (tmp_path / "chosen" / "corpus.jsonl").is_file()
    assert not (tmp_path / "unused").exists()


@pytest.mark.integration
def test_nothing_to_ingest_tells_the_user_what_to_add(prefect_api: str, tmp_path: Path) -> None:
    config = write_config(tmp_path / "mat.yaml", [], tmp_path / "corpus", tmp_path / "staging")
    with pytest.raises(ConfigError, match=r"add a `sources:` section .* or pass --repo"):
        run_ingest(config)


@pytest.mark.integration
def test_when_every_source_fails_no_corpus_is_written(prefect_api: str, tmp_path: Path) -> None:
    sources = [{"type": "local_repo", "path": str(tmp_path / "gone"), "name": "gone"}]
    config = write_config(tmp_path / "mat.yaml", sources, tmp_path / "corpus", tmp_path / "staging")
    with pytest.raises(IngestIncomplete, match="No corpus was written") as caught:
        run_ingest(config)
    assert caught.value.summary["corpus_status"] == "not built" and caught.value.summary["stats"] is None
    assert "fix `path:`" in caught.value.summary["failures"][0]["error"]
    left = [p.name for p in (tmp_path / "corpus").glob("*")]
    assert left in ([], [LOCK_FILE])  # at most the ingest lock


def test_the_incomplete_ingest_error_survives_pickling() -> None:
    summary = {"failures": [{"source": "a", "error": "gone"}], "sources": [{}, {}], "stats": None}
    copy = pickle.loads(pickle.dumps(IngestIncomplete(summary)))
    assert copy.summary == summary and str(copy) == str(IngestIncomplete(summary))
