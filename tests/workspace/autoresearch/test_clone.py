"""Cloning autoresearch into a workspace: every transport gives a normal, shallow work tree of one branch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from multiagenttrainer.config import GithubConfig
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.workspace.autoresearch import clone_workspace, repo_location
from multiagenttrainer.workspace.setup import clone_credentials
from tests.support.git_servers import GitDaemon, GitHttpServer, git
from tests.workspace.autoresearch.conftest import BRANCH_MARKER, PublishedRepo

pytestmark = pytest.mark.integration

SLUG_PATH = "/karpathy/autoresearch.git"

# How each test names the fixture repository: as a work-tree path, a bare path, or a URL.
LOCATIONS: dict[str, Callable[[PublishedRepo, GitHttpServer, GitDaemon], str]] = {
    "work-tree path": lambda repo, http, daemon: str(repo.work),
    "bare path": lambda repo, http, daemon: str(repo.bare),
    "file url": lambda repo, http, daemon: f"file://{repo.bare}",
    "http url": lambda repo, http, daemon: f"{http.url}{SLUG_PATH}",
    "git url": lambda repo, http, daemon: f"{daemon.url}{SLUG_PATH}",
}


@pytest.mark.parametrize("kind", sorted(LOCATIONS))
def test_clone_gives_a_shallow_work_tree_of_the_branch(
    kind: str,
    fake_autoresearch: PublishedRepo,
    served_http: GitHttpServer,
    served_daemon: GitDaemon,
    tmp_path: Path,
) -> None:
    location = repo_location(LOCATIONS[kind](fake_autoresearch, served_http, served_daemon))
    workspace = tmp_path / "workspace"
    workspace.mkdir()

    sha = clone_workspace(location, "cpu", workspace)

    assert sha == fake_autoresearch.head("cpu")
    assert git("rev-parse", "HEAD", cwd=workspace) == sha
    assert git("symbolic-ref", "HEAD", cwd=workspace) == "refs/heads/cpu"
    assert git("rev-list", "--count", "HEAD", cwd=workspace) == "1"  # depth 1: cpu has two commits
    assert git("rev-parse", "--is-bare-repository", cwd=workspace) == "false"
    assert git("status", "--porcelain", cwd=workspace) == ""
    assert (workspace / BRANCH_MARKER).read_text() == "cpu\n"
    assert git("config", "remote.origin.url", cwd=workspace) == location


def test_agents_can_commit_and_reset_in_the_clone(fake_autoresearch: PublishedRepo, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    base = clone_workspace(str(fake_autoresearch.bare), "master", workspace)
    train = workspace / "train.py"
    train.write_text(train.read_text().replace("DEPTH = 2 ", "DEPTH = 3 "))
    git("commit", "-q", "-am", "deeper", cwd=workspace)
    assert git("rev-parse", "HEAD~1", cwd=workspace) == base
    git("reset", "-q", "--hard", base, cwd=workspace)
    assert "DEPTH = 2 " in train.read_text()


def test_relative_paths_are_made_absolute(
    fake_autoresearch: PublishedRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(fake_autoresearch.work.parent)
    assert repo_location(fake_autoresearch.work.name) == str(fake_autoresearch.work)


def test_urls_are_kept_as_given() -> None:
    for url in ("https://github.com/karpathy/autoresearch", "git@github.com:karpathy/autoresearch.git"):
        assert repo_location(url) == url


FORK_TOKEN = "ghp_privateFork0123456789abcdefghijklmn"


def test_a_private_fork_on_the_github_host_is_cloned_with_github_token(
    fake_autoresearch: PublishedRepo, served_root: Path, tmp_path: Path
) -> None:
    with GitHttpServer(served_root, token=FORK_TOKEN) as private:
        url = f"{private.url}{SLUG_PATH}"
        github = GithubConfig(web_url=private.url, api_url=private.url)
        refused = tmp_path / "refused"
        refused.mkdir()
        with pytest.raises(ConfigError, match="authentication failed") as failure:
            clone_workspace(url, "cpu", refused, clone_credentials(url, github, {}))
        assert "GITHUB_TOKEN" in str(failure.value)

        workspace = tmp_path / "workspace"
        workspace.mkdir()
        credentials = clone_credentials(url, github, {"GITHUB_TOKEN": FORK_TOKEN})
        sha = clone_workspace(url, "cpu", workspace, credentials)

    assert sha == fake_autoresearch.head("cpu")
    assert FORK_TOKEN not in (workspace / ".git" / "config").read_text()
    assert git("config", "remote.origin.url", cwd=workspace) == url


def test_github_token_is_never_sent_to_another_host() -> None:
    github = GithubConfig()  # github.com
    env = {"GITHUB_TOKEN": FORK_TOKEN}
    assert clone_credentials("https://github.com/me/autoresearch.git", github, env) is not None
    assert clone_credentials("https://git.example.com/me/autoresearch.git", github, env) is None
    assert clone_credentials("http://github.com/me/autoresearch.git", github, env) is None  # other scheme
    assert clone_credentials(None, github, env) is None
