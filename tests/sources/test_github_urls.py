"""Clone URLs from GitHub references, the token-host rule, and error translation (no network)."""

from __future__ import annotations

import pytest
from dulwich.client import HTTPUnauthorized

from multiagenttrainer.config import GithubConfig
from multiagenttrainer.errors import ConfigError, SourceError, TransientSourceError
from multiagenttrainer.sources.base import SourceContext
from multiagenttrainer.sources.git import GitFetchError
from multiagenttrainer.sources.github_urls import (
    branch_in_ref,
    clone_url_for,
    github_credentials,
    source_error,
)

PUBLIC = GithubConfig()
ENTERPRISE = GithubConfig(web_url="https://ghe.example.com/git", api_url="https://ghe.example.com/api/v3")


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("acme/widgets", "https://github.com/acme/widgets.git"),
        ("acme/widgets.git", "https://github.com/acme/widgets.git"),
        ("https://github.com/acme/widgets", "https://github.com/acme/widgets.git"),
        ("https://github.com/acme/widgets/", "https://github.com/acme/widgets.git"),
        ("https://github.com/acme/widgets.git", "https://github.com/acme/widgets.git"),
        ("https://github.com/acme/widgets/tree/feature/x", "https://github.com/acme/widgets.git"),
        ("https://github.com/acme/widgets/blob/main/README.md", "https://github.com/acme/widgets.git"),
        ("  acme/widgets  ", "https://github.com/acme/widgets.git"),
        ("https://gitlab.example.com/group/sub/proj", "https://gitlab.example.com/group/sub/proj"),
        ("git://example.com/acme/widgets.git", "git://example.com/acme/widgets.git"),
        ("ssh://git@github.com/acme/widgets.git", "ssh://git@github.com/acme/widgets.git"),
        ("git@github.com:acme/widgets.git", "git@github.com:acme/widgets.git"),
        ("file:///srv/git/widgets.git", "file:///srv/git/widgets.git"),
    ],
)
def test_clone_url_for_public_github(ref: str, expected: str) -> None:
    assert clone_url_for(ref, PUBLIC) == expected


def test_clone_url_for_enterprise_keeps_the_web_url_prefix() -> None:
    assert clone_url_for("acme/widgets", ENTERPRISE) == "https://ghe.example.com/git/acme/widgets.git"
    assert (
        clone_url_for("https://ghe.example.com/git/acme/widgets/tree/dev", ENTERPRISE)
        == "https://ghe.example.com/git/acme/widgets.git"
    )
    # github.com web URLs are still understood when web_url points elsewhere
    assert (
        clone_url_for("https://github.com/acme/widgets", ENTERPRISE) == "https://github.com/acme/widgets.git"
    )


def test_clone_url_for_local_github_with_port() -> None:
    github = GithubConfig(web_url="http://127.0.0.1:8765")
    assert clone_url_for("http://127.0.0.1:8765/acme/w", github) == "http://127.0.0.1:8765/acme/w.git"
    assert clone_url_for("acme/w", github) == "http://127.0.0.1:8765/acme/w.git"
    # same host, other port: not GitHub, left alone
    assert clone_url_for("http://127.0.0.1:9999/acme/w", github) == "http://127.0.0.1:9999/acme/w"


@pytest.mark.parametrize(
    "ref", ["widgets", "acme/widgets/extra", "ftp://example.com/a/b", "https://github.com/acme", ""]
)
def test_clone_url_for_rejects_unparseable_references(ref: str) -> None:
    with pytest.raises(ConfigError, match="expected"):
        clone_url_for(ref, PUBLIC)


def test_clone_url_for_error_hides_url_credentials() -> None:
    with pytest.raises(ConfigError) as info:
        clone_url_for("https://user:s3cret@github.com/acme", PUBLIC)
    assert "s3cret" not in str(info.value)


def test_branch_in_ref() -> None:
    assert branch_in_ref("https://github.com/acme/w/tree/feature/x", PUBLIC) == "feature/x"
    assert branch_in_ref("https://github.com/acme/w", PUBLIC) is None
    assert branch_in_ref("acme/w", PUBLIC) is None
    assert branch_in_ref("https://gitlab.example.com/acme/w/tree/dev", PUBLIC) is None


def context(web_url: str, **env: str) -> SourceContext:
    return SourceContext(github=GithubConfig(web_url=web_url), env=env)


def test_github_credentials_only_for_the_github_host() -> None:
    ctx = context("https://github.com", GITHUB_TOKEN="t0k")
    creds = github_credentials(ctx, "https://github.com/acme/w.git", "GITHUB_TOKEN")
    assert creds is not None and (creds.username, creds.password) == ("x-access-token", "t0k")
    assert "t0k" not in repr(creds)
    assert github_credentials(ctx, "https://GitHub.com:443/acme/w.git", "GITHUB_TOKEN") is not None
    for other in (
        "https://gitlab.com/acme/w.git",
        "https://github.com.evil.example/acme/w.git",
        "http://github.com/acme/w.git",  # plain http would expose the token
        "https://github.com:8443/acme/w.git",
        "ssh://git@github.com/acme/w.git",
        "git@github.com:acme/w.git",
        "git://github.com/acme/w.git",
    ):
        assert github_credentials(ctx, other, "GITHUB_TOKEN") is None, other


def test_github_credentials_distinguishes_ports_on_one_host() -> None:
    ctx = context("http://127.0.0.1:8000", GITHUB_TOKEN="t0k")
    assert github_credentials(ctx, "http://127.0.0.1:8000/a/b.git", "GITHUB_TOKEN") is not None
    assert github_credentials(ctx, "http://127.0.0.1:8001/a/b.git", "GITHUB_TOKEN") is None


def test_github_credentials_none_when_unset_or_empty() -> None:
    assert github_credentials(context("https://github.com"), "https://github.com/a/b", "GITHUB_TOKEN") is None
    empty = context("https://github.com", GITHUB_TOKEN="")
    assert github_credentials(empty, "https://github.com/a/b", "GITHUB_TOKEN") is None
    assert github_credentials(empty, "https://github.com/a/b", None) is None


def test_source_error_keeps_transience() -> None:
    transient = source_error("s", GitFetchError("cannot reach x", transient=True))
    permanent = source_error("s", GitFetchError("no git repository at x; check the URL"))
    assert type(transient) is TransientSourceError
    assert type(permanent) is SourceError
    assert str(permanent) == "source 's': no git repository at x; check the URL"


def test_source_error_hint_replaces_advice_only_for_401() -> None:
    refused = GitFetchError("authentication failed for http://h/a.git; check the token")
    refused.__cause__ = HTTPUnauthorized('Basic realm="x"', "http://h/a.git")
    error = source_error("s", refused, "set GITHUB_TOKEN")
    assert error.reason == "authentication failed for http://h/a.git; set GITHUB_TOKEN"
    other = source_error("s", GitFetchError("no git repository at x; check the URL"), "set GITHUB_TOKEN")
    assert other.reason == "no git repository at x; check the URL"
