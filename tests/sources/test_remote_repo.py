"""remote_repo against real git servers on 127.0.0.1: http(s) with a token, git://, file://."""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path

import pytest

from multiagenttrainer.config import GithubConfig, RemoteRepoSource
from multiagenttrainer.errors import SourceError, TransientSourceError
from multiagenttrainer.sources.base import SourceInfo
from multiagenttrainer.sources.remote_repo import RemoteRepo, clone_dir_name
from tests.support.git_fixtures import TOKEN, WRONG_TOKEN, make_context
from tests.support.git_servers import (
    BASE_FILES,
    DEV_FILES,
    FixtureRepo,
    GitDaemon,
    GitHttpServer,
    files_at_commit,
    free_port,
)

pytestmark = pytest.mark.integration


def remote(
    url: str, branch: str | None = None, token_env: str | None = "REPO_TOKEN", **env: str
) -> RemoteRepo:
    cfg = RemoteRepoSource(type="remote_repo", url=url, branch=branch, token_env=token_env)
    return RemoteRepo(cfg, "widgets", make_context(GithubConfig(), **env))


def fetch_error(source: RemoteRepo, staging: Path) -> SourceError:
    with pytest.raises(SourceError) as info:
        source.fetch(staging)
    return info.value


def full_text(error: BaseException) -> str:
    """The error with its whole chain of causes, as a traceback would show it."""
    return "".join(traceback.format_exception(error))


def test_clone_over_http_with_token(git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path) -> None:
    source = remote(f"{git_http.url}{repo.path}", REPO_TOKEN=TOKEN)

    snapshot = source.fetch(tmp_path)

    assert snapshot.source == "widgets" and snapshot.type == "remote_repo"
    assert snapshot.version == repo.head("main")
    [tree] = snapshot.trees
    assert (tree.repo, tree.kind, tree.commit) == (repo.slug, "git", repo.head("main"))
    assert Path(tree.path) == tmp_path / clone_dir_name(repo.slug)
    assert files_at_commit(Path(tree.path), repo.head("main")) == BASE_FILES
    assert all(r.authorization for r in git_http.requests_for(repo.path))


def test_clone_is_bare_shallow_and_single_branch(
    git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path
) -> None:
    [tree] = remote(f"{git_http.url}{repo.path}", REPO_TOKEN=TOKEN).fetch(tmp_path).trees
    clone = Path(tree.path)
    assert (clone / "HEAD").read_text().strip() == "ref: refs/heads/main"
    assert not (clone / ".git").exists() and not (clone / "README.md").exists()
    assert (clone / "shallow").read_text().split() == [repo.head("main")]
    heads = sorted(p.name for p in (clone / "refs" / "heads").iterdir())
    assert heads == ["main"]


def test_explicit_branch(git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path) -> None:
    snapshot = remote(f"{git_http.url}{repo.path}", branch="dev", REPO_TOKEN=TOKEN).fetch(tmp_path)
    [tree] = snapshot.trees
    assert tree.commit == repo.head("dev") != repo.head("main")
    assert files_at_commit(Path(tree.path), repo.head("dev")) == {**BASE_FILES, **DEV_FILES}


def test_default_branch_is_the_remotes_head(
    git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path
) -> None:
    repo.set_default_branch("dev")
    source = remote(f"{git_http.url}{repo.path}", REPO_TOKEN=TOKEN)
    assert source.fetch(tmp_path).version == repo.head("dev")
    assert source.resolve() == repo.head("dev")


def test_unknown_branch_lists_the_branches(
    git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path
) -> None:
    error = fetch_error(remote(f"{git_http.url}{repo.path}", branch="nope", REPO_TOKEN=TOKEN), tmp_path)
    assert type(error) is SourceError
    assert str(error).startswith("source 'widgets': branch 'nope' not found")
    assert "branches there: dev, main" in str(error)


def test_missing_repository_is_a_permanent_error(git_http: GitHttpServer, tmp_path: Path) -> None:
    error = fetch_error(remote(f"{git_http.url}/acme/missing.git", REPO_TOKEN=TOKEN), tmp_path)
    assert type(error) is SourceError
    assert "'widgets'" in str(error) and "/acme/missing.git" in str(error) and "check the URL" in str(error)


def test_wrong_token_is_reported_without_the_token(
    git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path
) -> None:
    error = fetch_error(remote(f"{git_http.url}{repo.path}", REPO_TOKEN=WRONG_TOKEN), tmp_path)
    assert type(error) is SourceError
    assert "authentication failed" in str(error) and "the token in REPO_TOKEN was refused" in str(error)
    assert WRONG_TOKEN not in full_text(error)


def test_missing_token_says_which_variable_to_set(
    git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path
) -> None:
    error = fetch_error(remote(f"{git_http.url}{repo.path}"), tmp_path)
    assert "set REPO_TOKEN" in str(error)
    no_env = fetch_error(remote(f"{git_http.url}{repo.path}", token_env=None), tmp_path)
    assert "add `token_env: VAR` to the source" in str(no_env)


def test_unreachable_host_is_transient_and_fails_fast(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    for url in (f"http://127.0.0.1:{port}/acme/w.git", f"git://127.0.0.1:{port}/acme/w.git"):
        started = time.monotonic()
        error = fetch_error(remote(url, REPO_TOKEN=TOKEN), tmp_path)
        assert time.monotonic() - started < 5
        assert type(error) is TransientSourceError
        assert "cannot reach" in str(error) and "connection refused" in str(error)
        assert TOKEN not in full_text(error)


def test_incremental_update_fetches_only_when_head_moved(
    git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path
) -> None:
    source = remote(f"{git_http.url}{repo.path}", REPO_TOKEN=TOKEN)
    first = source.fetch(tmp_path)
    fetches = lambda: [r for r in git_http.requests_for(repo.path) if r.is_fetch]  # noqa: E731
    assert len(fetches()) == 1

    again = source.fetch(tmp_path)
    assert again.to_dict() == first.to_dict()
    assert len(fetches()) == 1, "an unchanged branch must not download anything"

    new_sha = repo.commit({"src/widgets/core.py": b"def spin(n: int) -> int:\n    return n * 3\n"})
    assert source.resolve() == new_sha
    updated = source.fetch(tmp_path)
    assert updated.version == new_sha != first.version
    assert len(fetches()) == 2
    assert updated.trees[0].path == first.trees[0].path
    files = files_at_commit(Path(updated.trees[0].path), new_sha)
    assert files["src/widgets/core.py"].endswith(b"n * 3\n")


def test_token_never_stored_logged_or_raised(
    git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    source = remote(f"{git_http.url}{repo.path}", REPO_TOKEN=TOKEN)
    source.resolve()
    [tree] = source.fetch(tmp_path).trees
    repo.commit({"later.txt": b"later\n"})
    source.fetch(tmp_path)
    errors = [
        fetch_error(remote(f"{git_http.url}{repo.path}", branch="nope", REPO_TOKEN=TOKEN), tmp_path / "b"),
        fetch_error(remote(f"{git_http.url}/acme/missing.git", REPO_TOKEN=TOKEN), tmp_path / "m"),
    ]

    config = (Path(tree.path) / "config").read_text()
    assert f"url = {git_http.url}{repo.path}" in config
    for file in Path(tree.path).rglob("*"):
        assert not file.is_file() or TOKEN.encode() not in file.read_bytes(), file
    assert caplog.records, "the fetch should have logged something"
    assert TOKEN not in caplog.text
    assert all(TOKEN not in full_text(error) for error in errors)


def test_git_protocol(git_daemon: GitDaemon, repo: FixtureRepo, tmp_path: Path) -> None:
    source = remote(f"{git_daemon.url}{repo.path}", branch="dev", REPO_TOKEN=TOKEN)
    assert source.resolve() == repo.head("dev")
    [tree] = source.fetch(tmp_path).trees
    assert tree.commit == repo.head("dev")
    assert (
        files_at_commit(Path(tree.path), tree.commit)["src/widgets/experimental.py"]
        == DEV_FILES["src/widgets/experimental.py"]
    )


def test_git_protocol_missing_repository_is_permanent(git_daemon: GitDaemon, tmp_path: Path) -> None:
    error = fetch_error(remote(f"{git_daemon.url}/acme/missing.git"), tmp_path)
    assert type(error) is SourceError
    assert "repository not found" in str(error)


def test_file_protocol(repo: FixtureRepo, tmp_path: Path) -> None:
    source = remote(f"file://{repo.bare}")
    snapshot = source.fetch(tmp_path / "staging")
    assert snapshot.version == source.resolve() == repo.head("main")
    assert files_at_commit(Path(snapshot.trees[0].path), snapshot.version) == BASE_FILES


def test_resolve_equals_fetched_sha(git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path) -> None:
    source = remote(f"{git_http.url}{repo.path}", branch="dev", REPO_TOKEN=TOKEN)
    before = len([r for r in git_http.requests_for(repo.path) if r.is_fetch])
    resolved = source.resolve()
    assert len([r for r in git_http.requests_for(repo.path) if r.is_fetch]) == before, (
        "resolve downloads nothing"
    )
    assert resolved == source.fetch(tmp_path).version == repo.head("dev")


def test_resolve_errors_are_source_errors(git_http: GitHttpServer, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no git repository"):
        remote(f"{git_http.url}/acme/missing.git", REPO_TOKEN=TOKEN).resolve()


def test_clone_from_another_url_is_replaced(
    git_http: GitHttpServer, git_daemon: GitDaemon, repo: FixtureRepo, tmp_path: Path
) -> None:
    remote(f"{git_http.url}{repo.path}", REPO_TOKEN=TOKEN).fetch(tmp_path)
    snapshot = remote(f"{git_daemon.url}{repo.path}", branch="dev").fetch(tmp_path)
    clone = Path(snapshot.trees[0].path)
    assert f"url = {git_daemon.url}{repo.path}" in (clone / "config").read_text()
    assert sorted(p.name for p in (clone / "refs" / "heads").iterdir()) == ["dev"]


def test_describe_redacts_url_credentials() -> None:
    source = remote("https://bob:hunter2@git.example.com/acme/w.git", branch="dev")
    assert source.describe() == SourceInfo(
        "widgets", "remote_repo", "https://git.example.com/acme/w.git", "dev"
    )
    assert remote("git://example.com/a/b.git").describe().branch is None
