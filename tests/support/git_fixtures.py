"""Session-wide git servers on 127.0.0.1 and a factory of small fixture repositories.

`git_http` plays the GitHub host (it demands GITHUB_TOKEN), `other_http` an unrelated public git
host, `git_daemon` serves git://. All three serve the same directory of bare repositories.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from multiagenttrainer.config import GithubConfig
from multiagenttrainer.sources.base import SourceContext
from tests.support.git_servers import FixtureRepo, GitDaemon, GitHttpServer, RepoFactory

# Distinctive, so a leak anywhere is easy to spot.
TOKEN = "ghp_MatTestToken7f3a9c1e5b2d4f6a8c0e"
WRONG_TOKEN = "ghp_WrongToken0000aaaa1111bbbb2222"
NETWORK_TIMEOUT_S = 5.0


@pytest.fixture(scope="session")
def git_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every server exports: <owner>/<repo>.git."""
    return tmp_path_factory.mktemp("git-served")


@pytest.fixture(scope="session")
def repo_factory(git_root: Path, tmp_path_factory: pytest.TempPathFactory) -> RepoFactory:
    return RepoFactory(git_root, tmp_path_factory.mktemp("git-work"))


@pytest.fixture
def make_repo(repo_factory: RepoFactory) -> Callable[..., FixtureRepo]:
    """Create a fresh published repository (branches main and dev); `make_repo("owner/name")`."""
    return repo_factory.create


@pytest.fixture
def repo(make_repo: Callable[..., FixtureRepo]) -> FixtureRepo:
    """A fresh repository, unique to the test."""
    return make_repo()


@pytest.fixture(scope="session")
def git_http(git_root: Path) -> Iterator[GitHttpServer]:
    """Smart HTTP that requires TOKEN: the stand-in for the GitHub host."""
    with GitHttpServer(git_root, token=TOKEN) as server:
        yield server


@pytest.fixture(scope="session")
def other_http(git_root: Path) -> Iterator[GitHttpServer]:
    """Smart HTTP without authentication: some other git host."""
    with GitHttpServer(git_root, token=None) as server:
        yield server


@pytest.fixture(scope="session")
def git_daemon(git_root: Path) -> Iterator[GitDaemon]:
    with GitDaemon(git_root) as daemon:
        yield daemon


@pytest.fixture
def github(git_http: GitHttpServer) -> GithubConfig:
    """GitHub settings pointing at the token-checking HTTP server."""
    return GithubConfig(web_url=git_http.url, api_url=git_http.url)


def make_context(github: GithubConfig, **env: str) -> SourceContext:
    """A SourceContext with exactly `env` as its environment."""
    return SourceContext(github=github, env=dict(env), timeout_s=NETWORK_TIMEOUT_S)


@pytest.fixture
def ctx(github: GithubConfig) -> SourceContext:
    """GitHub at the local server, GITHUB_TOKEN set to the right token."""
    return make_context(github, GITHUB_TOKEN=TOKEN)
