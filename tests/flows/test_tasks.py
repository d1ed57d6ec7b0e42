"""The ingest tasks called directly (`task.fn`): thin wrappers that re-create sources from JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiagenttrainer.errors import SourceError
from multiagenttrainer.ingest import staging_dir_for
from multiagenttrainer.sources import Snapshot
from tasks.ingest import fetch_source, resolve_source
from tests.support.git_servers import RepoFactory

GITHUB = {"web_url": "https://github.com", "api_url": "https://api.github.com"}


def test_resolve_returns_the_remote_head(flow_repos: RepoFactory) -> None:
    repo = flow_repos.create()
    cfg = {"type": "remote_repo", "url": repo.bare.as_uri()}
    assert resolve_source.fn(cfg, "widgets", GITHUB) == repo.head()


def test_fetch_returns_a_json_snapshot_of_files_in_the_sources_staging_dir(
    flow_repos: RepoFactory, tmp_path: Path
) -> None:
    repo = flow_repos.create()
    cfg = {"type": "remote_repo", "url": repo.bare.as_uri(), "exclude": ["docs/**"]}
    result = fetch_source.fn(cfg, "widgets", GITHUB, str(tmp_path), repo.head())
    snapshot = Snapshot.from_dict(result)
    assert snapshot.source == "widgets" and snapshot.version == repo.head()
    assert snapshot.exclude == ["docs/**"]
    assert snapshot.is_present()
    assert all(
        Path(tree.path).is_relative_to(staging_dir_for(tmp_path, "widgets")) for tree in snapshot.trees
    )


def test_fetch_failures_name_the_source(tmp_path: Path) -> None:
    cfg = {"type": "remote_repo", "url": (tmp_path / "absent.git").as_uri()}
    with pytest.raises(SourceError) as caught:
        fetch_source.fn(cfg, "absent", GITHUB, str(tmp_path / "staging"), None)
    assert caught.value.source == "absent"
