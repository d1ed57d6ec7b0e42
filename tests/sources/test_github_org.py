"""github_org against a fake GitHub REST server on 127.0.0.1, cloning real bare repositories."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dulwich.repo import Repo

from multiagenttrainer.config import GithubConfig, GithubOrgSource
from multiagenttrainer.errors import SourceError, TransientSourceError
from multiagenttrainer.sources import registry
from multiagenttrainer.sources.base import SourceContext
from multiagenttrainer.sources.github_org import GithubOrg, org_from_url
from tests.support.api_fixtures import WEB_URL, clones_in
from tests.support.bare_repos import commit_files, empty_bare_repo
from tests.support.fake_github import RATE_LIMIT_RESET_S, FakeRepo
from tests.support.git_servers import GitHttpServer

FAST_FAIL_S = 10


def listed(source: GithubOrg) -> list[str]:
    return [repo.full_name for repo in source.list_repos()]


def many_repos(count: int, private_every: int = 3, host: str = WEB_URL) -> list[FakeRepo]:
    return [
        FakeRepo(f"repo-{i:03d}", f"{host}/acme/repo-{i:03d}.git", i % private_every == 0)
        for i in range(count)
    ]


# --------------------------------------------------------------------------- listing


@pytest.mark.parametrize(
    ("visibility", "expected"),
    [
        ("all", ["acme/alpha", "acme/beta", "acme/gamma"]),
        ("public", ["acme/alpha", "acme/gamma"]),
        ("private", ["acme/beta"]),
    ],
)
def test_visibility_selects_repositories(make_org, fake_github, git_org, visibility, expected):
    assert listed(make_org(visibility=visibility)) == expected
    (request,) = fake_github.requests_to("/orgs/acme/repos")
    assert request.query["type"] == visibility
    assert request.query["per_page"] == "100"


def test_token_is_sent_as_authorization_header(make_org, fake_github, git_org):
    listed(make_org())
    assert fake_github.requests
    assert {r.authorization for r in fake_github.requests} == {f"token {fake_github.token}"}


def test_without_token_only_public_repositories_are_listed(make_org, fake_github, git_org):
    assert listed(make_org(token=None)) == ["acme/alpha", "acme/gamma"]
    assert {r.authorization for r in fake_github.requests} == {None}


def test_private_listing_without_token_says_to_set_one(make_org, git_org):
    with pytest.raises(SourceError, match="no private repositories visible.*set GITHUB_TOKEN"):
        make_org(token=None, visibility="private").list_repos()


def test_paging_follows_link_headers(make_org, fake_github):
    fake_github.orgs["acme"] = many_repos(250)
    assert len(listed(make_org(max_repos=1000))) == 250
    pages = [r.query.get("page", "1") for r in fake_github.requests_to("/orgs/acme/repos")]
    assert pages == ["1", "2", "3"]


@pytest.mark.parametrize(("max_repos", "pages_needed"), [(120, ["1", "2"]), (100, ["1"]), (5, ["1"])])
def test_max_repos_stops_paging_early(make_org, fake_github, max_repos, pages_needed):
    fake_github.orgs["acme"] = many_repos(250)
    names = listed(make_org(max_repos=max_repos))
    assert names == [f"acme/repo-{i:03d}" for i in range(max_repos)]
    pages = [r.query.get("page", "1") for r in fake_github.requests_to("/orgs/acme/repos")]
    assert pages == pages_needed
    assert fake_github.requests_to("/orgs/acme") == []  # lazy: no separate organisation look-up


def test_private_listing_pages_only_the_private_repositories(make_org, fake_github):
    fake_github.orgs["acme"] = many_repos(250)  # 84 private: one page
    assert len(listed(make_org(visibility="private"))) == 84
    assert len(fake_github.requests_to("/orgs/acme/repos")) == 1


# --------------------------------------------------------------------------- API errors


def test_bad_token_gives_clear_error_without_the_token(make_org, fake_github, git_org):
    source = make_org(token="ghp_wrong_token_should_not_leak")
    with pytest.raises(SourceError) as caught:
        source.list_repos()
    assert not isinstance(caught.value, TransientSourceError)
    message = str(caught.value)
    assert "GitHub rejected the token in GITHUB_TOKEN" in message
    assert "ghp_wrong_token_should_not_leak" not in message
    assert message.startswith("source 'org-acme':")


def test_unknown_organisation(make_org):
    with pytest.raises(
        SourceError, match=re.escape(f"organisation 'nope' not found at {WEB_URL}; check the url")
    ):
        make_org("nope", web_url=WEB_URL).fetch(Path("/nonexistent-staging"))


def test_primary_rate_limit_fails_fast_with_reset_time(make_org, fake_github):
    fake_github.behaviours["busy"] = "rate_limited"
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        make_org("busy", token=None).list_repos()
    elapsed = time.monotonic() - started
    assert elapsed < FAST_FAIL_S
    reset = datetime.fromtimestamp(time.time() + RATE_LIMIT_RESET_S, UTC)
    message = str(caught.value)
    assert f"GitHub rate limit reached for busy; resets at {reset:%H:%M} UTC (in 180 min)" in message
    assert "set GITHUB_TOKEN for a higher limit or lower max_repos" in message
    assert len(fake_github.requests_to("/orgs/busy/repos")) == 1


def test_rate_limit_with_a_token_does_not_suggest_setting_one(make_org, fake_github):
    fake_github.behaviours["busy"] = "rate_limited"
    with pytest.raises(SourceError, match="resets at .* UTC") as caught:
        make_org("busy").list_repos()
    assert "set GITHUB_TOKEN" not in str(caught.value)
    assert fake_github.token not in str(caught.value)


def test_secondary_rate_limit_with_long_retry_after_fails_fast(make_org, fake_github):
    fake_github.behaviours["busy"] = "secondary_rate_limited"
    started = time.monotonic()
    with pytest.raises(
        SourceError, match=r"GitHub rate limit reached for busy; resets at \d\d:\d\d UTC \(in 60 min\)"
    ):
        make_org("busy").list_repos()
    assert time.monotonic() - started < FAST_FAIL_S


def test_short_rate_limit_is_waited_out(make_org, fake_github, git_org):
    fake_github.orgs["soon"] = fake_github.orgs["acme"]
    fake_github.behaviours["soon"] = "briefly_rate_limited"
    assert listed(make_org("soon")) == ["soon/alpha", "soon/beta", "soon/gamma"]
    assert len(fake_github.requests_to("/orgs/soon/repos")) == 2


def test_forbidden_says_the_token_lacks_permission(make_org, fake_github):
    fake_github.behaviours["locked"] = "forbidden"
    with pytest.raises(SourceError, match=r"403: Resource not accessible.*lacks permission") as caught:
        make_org("locked").list_repos()
    assert not isinstance(caught.value, TransientSourceError)


def test_server_errors_are_transient_and_not_retried_inside_the_client(make_org, fake_github):
    fake_github.behaviours["flaky"] = "bad_gateway"
    with pytest.raises(TransientSourceError, match="kept failing with server errors"):
        make_org("flaky").list_repos()
    assert len(fake_github.requests_to("/orgs/flaky/repos")) == 1  # retrying is SOURCE_RETRY's job


def test_a_flaky_org_is_tried_as_often_as_the_one_retry_policy_says(make_org, fake_github, tmp_path):
    """The ingest stage applies SOURCE_RETRY once: 1 + its retries API calls, never more."""
    from multiagenttrainer.ingest import Ingester
    from multiagenttrainer.retry import SOURCE_RETRY

    fake_github.behaviours["flaky"] = "bad_gateway"
    source = make_org("flaky")
    result = Ingester([source.cfg], tmp_path / "staging", context=source.ctx).fetch_all()
    assert [type(f) for f in result.failures] == [TransientSourceError]
    assert len(fake_github.requests_to("/orgs/flaky/repos")) == 1 + SOURCE_RETRY.retries


def test_unreachable_api_is_transient(make_org, fake_github):
    source = make_org()
    fake_github.stop()
    started = time.monotonic()
    with pytest.raises(TransientSourceError, match="cannot reach the GitHub API at http://127.0.0.1"):
        source.list_repos()
    assert time.monotonic() - started < FAST_FAIL_S


# --------------------------------------------------------------------------- URL shape and describe


@pytest.mark.parametrize("url", [f"{WEB_URL}/acme", f"{WEB_URL}/acme/", f"{WEB_URL}/ACME"])
def test_org_url_shapes_accepted(url):
    assert org_from_url(url, WEB_URL).lower() == "acme"


@pytest.mark.parametrize(
    "url", ["https://gitlab.example.test/acme", f"{WEB_URL}/acme/widgets", f"{WEB_URL}/", "acme"]
)
def test_other_urls_are_rejected_with_the_expected_shape(url, fake_github):
    ctx = SourceContext(github=GithubConfig(web_url=WEB_URL, api_url=fake_github.url), env={})
    source = GithubOrg(GithubOrgSource(type="github_org", url=url), "org", ctx)
    with pytest.raises(SourceError, match=re.escape(f"expected {WEB_URL}/<org>")):
        source.resolve()
    assert fake_github.requests == []


def test_describe_needs_no_network(make_org, fake_github):
    info = make_org(visibility="public", max_repos=7, web_url=WEB_URL).describe()
    assert (info.name, info.type, info.branch) == ("org-acme", "github_org", None)
    assert info.location == f"{WEB_URL}/acme (public, max 7)"
    assert fake_github.requests == []


def test_registry_builds_the_adapter(fake_github):
    cfg = GithubOrgSource(type="github_org", url=f"{WEB_URL}/acme")
    (source,) = registry.make_sources([cfg], SourceContext(github=GithubConfig(web_url=WEB_URL)))
    assert isinstance(source, GithubOrg)
    assert source.name == "acme"


# --------------------------------------------------------------------------- resolve and fetch


def test_resolve_changes_only_when_a_repository_moves(make_org, git_org):
    source = make_org()
    first = source.resolve()
    assert source.resolve() == first
    commit_files(git_org["beta"], {"README.md": "# beta v2\n"})
    second = source.resolve()
    assert second != first
    assert source.resolve() == second


def test_fetch_clones_each_repository_at_its_head(make_org, git_org, tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    source = make_org()
    snapshot = source.fetch(staging)
    heads = {
        f"acme/{name}": Repo(str(path)).refs[b"refs/heads/main"].decode() for name, path in git_org.items()
    }
    assert {tree.repo: tree.commit for tree in snapshot.trees} == heads
    for tree in snapshot.trees:
        assert tree.kind == "git"
        assert Path(tree.path) == staging / f"{tree.repo.replace('/', '__')}.git"
        with Repo(tree.path) as clone:
            assert clone.bare
            assert clone.refs[b"HEAD"].decode() == tree.commit
    assert (snapshot.source, snapshot.type, snapshot.warnings) == ("org-acme", "github_org", [])
    assert snapshot.version == source.resolve()


def test_fetch_again_updates_the_existing_clone(make_org, git_org, tmp_path):
    source = make_org(visibility="public")
    source.fetch(tmp_path)
    new_sha = commit_files(git_org["alpha"], {"README.md": "# alpha v2\n"})
    snapshot = source.fetch(tmp_path)
    assert {t.repo: t.commit for t in snapshot.trees}["acme/alpha"] == new_sha
    with Repo(str(tmp_path / "acme__alpha.git")) as clone:
        assert clone.refs[b"HEAD"].decode() == new_sha


def test_clones_of_repositories_no_longer_listed_are_removed(make_org, fake_github, git_org, tmp_path):
    staging = tmp_path / "staging"
    make_org().fetch(staging)
    clones = ["acme__alpha.git", "acme__beta.git", "acme__gamma.git"]
    assert sorted(p.name for p in staging.iterdir()) == clones
    (staging / "notes.txt").write_text("not a clone\n")
    fake_github.orgs["acme"] = [r for r in fake_github.orgs["acme"] if r.name != "beta"]  # beta left the org
    snapshot = make_org().fetch(staging)
    assert sorted(t.repo for t in snapshot.trees) == ["acme/alpha", "acme/gamma"]
    assert sorted(p.name for p in staging.iterdir()) == ["acme__alpha.git", "acme__gamma.git", "notes.txt"]
    make_org(max_repos=1).fetch(staging)  # past max_repos: gamma goes too
    assert sorted(p.name for p in staging.iterdir()) == ["acme__alpha.git", "notes.txt"]


def test_include_and_exclude_are_passed_on(make_org, git_org, tmp_path):
    snapshot = make_org(include=["*.py"], exclude=["tests/**"]).fetch(tmp_path)
    assert (snapshot.include, snapshot.exclude) == (["*.py"], ["tests/**"])


def test_one_failing_repository_is_named_in_the_failures(make_org, fake_github, git_org, git_host, tmp_path):
    fake_github.orgs["acme"].append(FakeRepo("ghost", f"{git_host.url}/acme/ghost.git"))
    snapshot = make_org().fetch(tmp_path / "staging")
    assert sorted(t.repo for t in snapshot.trees) == ["acme/alpha", "acme/beta", "acme/gamma"]
    assert snapshot.warnings == []
    (failure,) = snapshot.failures
    assert failure.startswith("acme/ghost: ") and "/acme/ghost.git" in failure
    assert snapshot.failure_summary() == f"1 repository not fetched (3 were): {failure}"


def test_empty_repository_is_skipped_with_a_warning(make_org, fake_github, git_org, git_host, tmp_path):
    empty_bare_repo(tmp_path / "remote" / "acme" / "void.git")
    fake_github.orgs["acme"].append(FakeRepo("void", f"{git_host.url}/acme/void.git", size=0))
    snapshot = make_org().fetch(tmp_path / "staging")
    assert len(snapshot.trees) == 3
    assert snapshot.warnings == ["acme/void: empty repository (no commits); skipped"]
    assert snapshot.failures == []


def test_every_repository_failing_is_an_error(make_org, fake_github, git_host, tmp_path):
    fake_github.orgs["acme"] = many_repos(3, host=git_host.url)
    with pytest.raises(
        SourceError, match="none of the 3 repositories of organisation 'acme' could be cloned"
    ):
        make_org().fetch(tmp_path)


def test_token_goes_only_to_the_github_host(fake_github, tmp_path):
    """Clone URLs on web_url's host get the token; a clone URL on another host is refused unrequested."""
    token = fake_github.token
    with GitHttpServer(tmp_path / "served", token=token) as git_server:
        web_url = git_server.url
        shas = {
            name: commit_files(tmp_path / "served" / "acme" / f"{name}.git", {"a.py": name}) for name in "xy"
        }
        other_host = web_url.replace("127.0.0.1", "localhost")
        fake_github.orgs["acme"] = [
            FakeRepo("x", f"{web_url}/acme/x.git", private=True),
            FakeRepo("y", f"{other_host}/acme/y.git"),
        ]
        ctx = SourceContext(
            github=GithubConfig(web_url=web_url, api_url=fake_github.url), env={"GITHUB_TOKEN": token}
        )
        source = GithubOrg(GithubOrgSource(type="github_org", url=f"{web_url}/acme"), "org", ctx)
        snapshot = source.fetch(tmp_path / "staging")
        assert [(t.repo, t.commit) for t in snapshot.trees] == [("acme/x", shas["x"])]
        (failure,) = snapshot.failures
        assert failure.startswith(f"acme/y: refused the clone URL '{other_host}/acme/y.git'")
        assert f"it is not on {web_url}" in failure
        assert all(r.authorization for r in git_server.requests_for("/acme/x.git"))
        assert git_server.requests_for("/acme/y.git") == []
    config = (tmp_path / "staging" / "acme__x.git" / "config").read_text()
    assert token not in config and token not in failure
    assert f"{web_url}/acme/x.git" in config


# --------------------------------------------------------------------------- hostile API answers


def hostile_urls(host: str, private: Path) -> dict[str, str]:
    """Clone URLs a hostile or broken API might return for acme/secret, and what each one is."""
    port = host.rsplit(":", 1)[1]
    return {
        "file": f"file://{private}",
        "bare path": str(private),
        "other host": f"http://localhost:{port}/acme/secret.git",
        "credentials": f"http://x-access-token:stolen@127.0.0.1:{port}/acme/secret.git",
        "ssh": f"ssh://git@127.0.0.1:{port}/acme/secret.git",
        "scp-like": "git@127.0.0.1:acme/secret.git",
        "other scheme": f"https://127.0.0.1:{port}/acme/secret.git",
        "other repository": f"{host}/acme/alpha.git",
        "query": f"{host}/acme/secret.git?x=1",
    }


@pytest.mark.parametrize(
    "kind",
    [
        "file",
        "bare path",
        "other host",
        "credentials",
        "ssh",
        "scp-like",
        "other scheme",
        "other repository",
        "query",
    ],
)
def test_clone_urls_off_the_github_host_are_refused(
    kind, make_org, fake_github, git_org, git_host, private_repo, tmp_path
):
    url = hostile_urls(git_host.url, private_repo)[kind]
    fake_github.orgs["acme"].append(FakeRepo("secret", url))
    staging = tmp_path / "staging"
    snapshot = make_org().fetch(staging)
    assert sorted(t.repo for t in snapshot.trees) == ["acme/alpha", "acme/beta", "acme/gamma"]
    (failure,) = snapshot.failures
    assert failure.startswith("acme/secret: refused the clone URL '")
    assert f"only {git_host.url}/acme/secret.git is cloned" in failure
    assert "stolen" not in failure
    assert clones_in(staging) == ["acme__alpha.git", "acme__beta.git", "acme__gamma.git"]
    assert git_host.requests_for("/acme/secret.git") == []


@pytest.mark.parametrize(
    ("full_name", "branch", "reason"),
    [
        ("acme/../../etc", "main", "invalid name"),
        ("acme/x\x1b[31m", "main", "invalid name"),
        ("evil/secret", "main", "not in organisation 'acme'"),
        ("acme/secret", "../../HEAD", "invalid default branch"),
    ],
)
def test_invalid_names_and_branches_from_the_api_are_refused(
    full_name, branch, reason, make_org, fake_github, git_org, git_host, tmp_path
):
    url = f"{git_host.url}/{full_name}.git"
    fake_github.orgs["acme"].append(FakeRepo("secret", url, default_branch=branch, full_name=full_name))
    snapshot = make_org().fetch(tmp_path / "staging")
    assert len(snapshot.trees) == 3
    (failure,) = snapshot.failures
    assert reason in failure and "\x1b" not in failure


def test_an_entry_listed_twice_is_cloned_once(make_org, fake_github, git_org, git_host, tmp_path):
    fake_github.orgs["acme"].append(fake_github.orgs["acme"][0])
    snapshot = make_org().fetch(tmp_path / "staging")
    assert sorted(t.repo for t in snapshot.trees) == ["acme/alpha", "acme/beta", "acme/gamma"]
    assert snapshot.failures == []


def test_a_malformed_listing_is_a_clear_error(make_org, fake_github):
    fake_github.orgs["acme"] = [FakeRepo("alpha", 12345)]  # type: ignore[arg-type]
    with pytest.raises(SourceError, match=r"sent a malformed repository list for 'acme'"):
        make_org().list_repos()


def test_every_repository_refused_is_an_error(make_org, fake_github, private_repo, tmp_path):
    fake_github.orgs["acme"] = [FakeRepo("secret", f"file://{private_repo}")]
    source = make_org()
    assert source.resolve()  # refused repositories are never contacted, not even for their HEAD
    with pytest.raises(
        SourceError, match=r"none of the 1 repositories .* first: acme/secret: refused the clone"
    ):
        source.fetch(tmp_path / "staging")
