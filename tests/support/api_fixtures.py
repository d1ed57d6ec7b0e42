"""Fixtures for the API-backed sources: a fake GitHub REST server and a fake Bedrock endpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from multiagenttrainer.config import GithubConfig, GithubOrgSource
from multiagenttrainer.sources.base import SourceContext
from multiagenttrainer.sources.github_org import GithubOrg
from tests.support.aws import isolate_aws
from tests.support.bare_repos import commit_files
from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_github import FakeGithub, FakeRepo
from tests.support.git_servers import GitHttpServer

WEB_URL = "https://github.example.test"  # for tests that never clone
TIMEOUT_S = 5.0
ACCESS_KEY = "AKIAFAKEACCESSKEY123"
SECRET_KEY = "fake/secret+key/never-printed-0123456789"


@pytest.fixture
def fake_github() -> Iterator[FakeGithub]:
    with FakeGithub() as server:
        yield server


@pytest.fixture
def git_host(tmp_path: Path) -> Iterator[GitHttpServer]:
    """The GitHub host (`github.web_url`) of these tests: smart HTTP for <tmp>/remote/<owner>/<repo>.git."""
    with GitHttpServer(tmp_path / "remote") as server:
        yield server


@pytest.fixture
def make_org(fake_github: FakeGithub, git_host: GitHttpServer) -> Callable[..., GithubOrg]:
    """Build a GithubOrg source against the fake API and git host; `token=None` means no GITHUB_TOKEN."""

    def build(
        org: str = "acme",
        *,
        token: str | None = fake_github.token,
        web_url: str | None = None,
        **fields: object,
    ):
        web_url = web_url or git_host.url
        cfg = GithubOrgSource(type="github_org", url=f"{web_url}/{org}", **fields)
        env = {"GITHUB_TOKEN": token} if token else {}
        ctx = SourceContext(
            github=GithubConfig(web_url=web_url, api_url=fake_github.url), env=env, timeout_s=TIMEOUT_S
        )
        return GithubOrg(cfg, f"org-{org}", ctx)

    return build


@pytest.fixture
def git_org(tmp_path: Path, fake_github: FakeGithub, git_host: GitHttpServer) -> dict[str, Path]:
    """Organisation `acme` with three real bare repositories served by `git_host`, one of them private."""
    names = {"alpha": False, "beta": True, "gamma": False}
    paths = {}
    for name in names:
        path = tmp_path / "remote" / "acme" / f"{name}.git"
        commit_files(path, {"README.md": f"# {name}\n", f"{name}.py": f"NAME = {name!r}\n"})
        paths[name] = path
    fake_github.orgs["acme"] = [
        FakeRepo(name, f"{git_host.url}/acme/{name}.git", private) for name, private in names.items()
    ]
    return paths


MARKER = "PRIVATE_MARKER_never_in_the_corpus_7f3a"


def clones_in(staging: Path) -> list[str]:
    """The clone directories under a github_org source's staging directory."""
    return sorted(p.name for p in staging.iterdir() if p.name.endswith(".git"))


@pytest.fixture
def private_repo(tmp_path: Path) -> Path:
    """A bare repository outside the GitHub host, holding a marker that must never be ingested."""
    path = tmp_path / "private" / "secret.git"
    commit_files(path, {"secret.py": f"TOKEN = {MARKER!r}\n"})
    return path


@pytest.fixture
def fake_bedrock() -> Iterator[FakeBedrock]:
    with FakeBedrock() as server:
        yield server


@pytest.fixture
def aws_env(monkeypatch, tmp_path, fake_bedrock):
    """Fake credentials in env vars, no config files, no instance metadata, boto3 pointed at the fake."""
    isolate_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENT_RUNTIME", fake_bedrock.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    return monkeypatch
