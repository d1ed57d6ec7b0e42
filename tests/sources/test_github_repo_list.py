"""github_repo_list: several repositories as one source, partial failures named in the snapshot."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from multiagenttrainer.config import GithubRepoListSource
from multiagenttrainer.errors import SourceError, TransientSourceError
from multiagenttrainer.sources.base import SourceContext, SourceInfo
from multiagenttrainer.sources.github_repo_list import GithubRepoList, list_version
from tests.support.git_fixtures import TOKEN
from tests.support.git_servers import FixtureRepo, GitHttpServer, free_port

pytestmark = pytest.mark.integration


def repo_list(repos: list[str], ctx: SourceContext, branch: str | None = None) -> GithubRepoList:
    cfg = GithubRepoListSource(type="github_repo_list", repos=repos, branch=branch, include=["src/**"])
    return GithubRepoList(cfg, "team", ctx)


def test_every_repository_is_cloned(
    git_http: GitHttpServer, make_repo: Callable[..., FixtureRepo], ctx: SourceContext, tmp_path: Path
) -> None:
    first, second = make_repo(), make_repo()
    source = repo_list([first.slug, f"{git_http.url}/{second.slug}", first.slug], ctx, branch="dev")

    snapshot = source.fetch(tmp_path)

    assert snapshot.type == "github_repo_list" and snapshot.include == ["src/**"]
    assert [(t.repo, t.commit) for t in snapshot.trees] == [
        (first.slug, first.head("dev")),
        (second.slug, second.head("dev")),
    ]
    assert len({t.path for t in snapshot.trees}) == 2 and not snapshot.warnings and not snapshot.failures
    assert snapshot.version == source.resolve()
    assert snapshot.version == list_version(
        [
            (f"{git_http.url}{second.path}", second.head("dev")),
            (f"{git_http.url}{first.path}", first.head("dev")),
        ]
    )
    assert all(
        r.authorization for r in git_http.requests_for(first.path) + git_http.requests_for(second.path)
    )


def test_version_changes_when_one_repository_moves(
    make_repo: Callable[..., FixtureRepo], ctx: SourceContext, tmp_path: Path
) -> None:
    first, second = make_repo(), make_repo()
    source = repo_list([first.slug, second.slug], ctx)
    before = source.fetch(tmp_path)
    assert repo_list([second.slug, first.slug], ctx).resolve() == before.version  # order does not matter
    second.commit({"NEWS.md": b"news\n"})
    after = source.fetch(tmp_path)
    assert after.version == source.resolve() != before.version
    assert [t.commit for t in after.trees] == [first.head("main"), second.head("main")]


def test_partial_failure_returns_the_rest_and_names_the_failures(
    repo: FixtureRepo, ctx: SourceContext, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/acme/gone.git"
    source = repo_list([repo.slug, "acme/missing", "not a repo", closed], ctx)

    snapshot = source.fetch(tmp_path)

    assert [t.repo for t in snapshot.trees] == [repo.slug]
    failures = dict(w.split(": ", 1) for w in snapshot.failures)
    assert set(failures) == {"acme/missing", "not a repo", closed}
    assert "no git repository" in failures["acme/missing"]
    assert "expected owner/repo" in failures["not a repo"]
    assert "cannot reach" in failures[closed]
    assert snapshot.warnings == []
    assert source.resolve() is None  # not cacheable while some repositories fail
    assert "skipped acme/missing" in caplog.text and TOKEN not in caplog.text


def test_all_failing_is_a_source_error(ctx: SourceContext, tmp_path: Path) -> None:
    source = repo_list(["acme/missing-one", "acme/missing-two"], ctx)
    with pytest.raises(SourceError) as info:
        source.fetch(tmp_path)
    assert type(info.value) is SourceError
    message = str(info.value)
    assert message.startswith("source 'team': none of the 2 repositories could be fetched")
    assert "acme/missing-one: " in message and "acme/missing-two: " in message
    with pytest.raises(SourceError):
        source.resolve()


def test_all_unreachable_is_transient(ctx: SourceContext, tmp_path: Path) -> None:
    urls = [f"http://127.0.0.1:{free_port()}/acme/a.git", f"git://127.0.0.1:{free_port()}/acme/b.git"]
    with pytest.raises(TransientSourceError, match="none of the 2 repositories"):
        repo_list(urls, ctx).fetch(tmp_path)


def test_describe(ctx: SourceContext) -> None:
    source = repo_list(["acme/a", "https://x:secret@git.example.com/b/c.git"], ctx, branch="dev")
    assert source.describe() == SourceInfo(
        "team", "github_repo_list", "acme/a, https://git.example.com/b/c.git", "dev"
    )
