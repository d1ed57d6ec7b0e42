"""github_repo against a local stand-in for the GitHub host (token required) and another git host."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from multiagenttrainer.config import GithubConfig, GithubRepoSource
from multiagenttrainer.errors import SourceError
from multiagenttrainer.ingest import Ingester
from multiagenttrainer.sources.base import SourceContext, SourceInfo
from multiagenttrainer.sources.github_repo import GithubRepo
from tests.support.git_fixtures import TOKEN, WRONG_TOKEN, make_context
from tests.support.git_servers import DEV_FILES, FixtureRepo, GitHttpServer, files_at_commit

pytestmark = pytest.mark.integration


def github_repo(url: str, ctx: SourceContext, branch: str | None = None) -> GithubRepo:
    return GithubRepo(GithubRepoSource(type="github_repo", url=url, branch=branch), "gh", ctx)


def fetch_error(source: GithubRepo, staging: Path) -> SourceError:
    with pytest.raises(SourceError) as info:
        source.fetch(staging)
    return info.value


def test_web_url_is_cloned_with_the_token(
    git_http: GitHttpServer, repo: FixtureRepo, ctx: SourceContext, tmp_path: Path
) -> None:
    source = github_repo(f"{git_http.url}/{repo.slug}", ctx)  # a web URL: no .git
    assert source.clone_url() == f"{git_http.url}{repo.path}"

    snapshot = source.fetch(tmp_path)

    assert (snapshot.type, snapshot.version) == ("github_repo", repo.head("main"))
    assert snapshot.trees[0].repo == repo.slug
    requests = git_http.requests_for(repo.path)
    assert requests and all(r.authorization and r.status == 200 for r in requests)


def test_shorthand_and_tree_url_pick_the_branch(
    git_http: GitHttpServer, repo: FixtureRepo, ctx: SourceContext, tmp_path: Path
) -> None:
    assert github_repo(repo.slug, ctx).resolve() == repo.head("main")
    tree_url = github_repo(f"{git_http.url}/{repo.slug}/tree/dev", ctx)
    [tree] = tree_url.fetch(tmp_path).trees
    assert tree.commit == repo.head("dev")
    assert "src/widgets/experimental.py" in files_at_commit(Path(tree.path), tree.commit)
    assert set(DEV_FILES) <= set(files_at_commit(Path(tree.path), tree.commit))
    explicit = github_repo(f"{git_http.url}/{repo.slug}/tree/dev", ctx, branch="main")
    assert explicit.resolve() == repo.head("main")


def test_github_token_is_not_sent_to_another_host(
    other_http: GitHttpServer, repo: FixtureRepo, ctx: SourceContext, tmp_path: Path
) -> None:
    source = github_repo(f"{other_http.url}{repo.path}", ctx)
    assert source.fetch(tmp_path).version == repo.head("main")
    requests = other_http.requests_for(repo.path)
    assert requests, "the other host should have been contacted"
    assert not any(r.authorization for r in requests)


def test_other_host_wanting_a_token_explains_the_rule(
    git_http: GitHttpServer, repo: FixtureRepo, tmp_path: Path
) -> None:
    elsewhere = make_context(GithubConfig(web_url="https://github.com"), GITHUB_TOKEN=TOKEN)
    error = fetch_error(github_repo(f"{git_http.url}{repo.path}", elsewhere), tmp_path)
    assert "GITHUB_TOKEN is sent only to https://github.com" in str(error)
    assert "remote_repo" in str(error)
    assert not any(r.authorization for r in git_http.requests_for(repo.path))


def test_wrong_and_missing_token(
    git_http: GitHttpServer, github: GithubConfig, repo: FixtureRepo, tmp_path: Path
) -> None:
    wrong = fetch_error(github_repo(repo.slug, make_context(github, GITHUB_TOKEN=WRONG_TOKEN)), tmp_path)
    assert str(wrong).startswith("source 'gh': authentication failed for")
    assert "the token in GITHUB_TOKEN was refused" in str(wrong)
    assert WRONG_TOKEN not in "".join(traceback.format_exception(wrong))

    missing = fetch_error(github_repo(repo.slug, make_context(github)), tmp_path)
    assert "set GITHUB_TOKEN to a token that can read it" in str(missing)


def test_unknown_repository(git_http: GitHttpServer, ctx: SourceContext, tmp_path: Path) -> None:
    error = fetch_error(github_repo("acme/does-not-exist", ctx), tmp_path)
    assert type(error) is SourceError
    assert f"{git_http.url}/acme/does-not-exist.git" in str(error) and "check the URL" in str(error)


def test_unparseable_url_is_a_source_error(ctx: SourceContext, tmp_path: Path) -> None:
    source = github_repo(f"{ctx.github.web_url}/only-owner", ctx)
    error = fetch_error(source, tmp_path)
    assert "expected a repository URL like" in str(error) and "fix `url:`" in str(error)
    assert source.describe().location == f"{ctx.github.web_url}/only-owner"


def test_describe(ctx: SourceContext) -> None:
    source = github_repo("https://github.com/acme/widgets", ctx, branch="dev")
    assert source.describe() == SourceInfo("gh", "github_repo", "https://github.com/acme/widgets", "dev")


def test_registry_builds_it_for_the_ingester(
    git_http: GitHttpServer, repo: FixtureRepo, ctx: SourceContext, tmp_path: Path
) -> None:
    cfg = GithubRepoSource(type="github_repo", url=repo.slug)
    ingester = Ingester([cfg], tmp_path, context=ctx)
    result = ingester.fetch_all()
    assert not result.failures
    [snapshot] = result.snapshots
    assert snapshot.version == repo.head("main") and snapshot.source == repo.slug
