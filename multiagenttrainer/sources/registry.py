"""The source registry: config `type` -> adapter class, plus naming and `--repo` arguments.

Each entry imports its adapter on first use (a plain import inside a small function, so readers and
tools can follow it), so that `mat sources` does not pay for boto3 or PyGithub.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlparse

from multiagenttrainer.config import (
    GithubConfig,
    GithubRepoSource,
    RemoteRepoSource,
    SourceConfig,
)
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.sources.base import Source, SourceContext


def _local_repo() -> type:
    from multiagenttrainer.sources.local_repo import LocalRepo

    return LocalRepo


def _remote_repo() -> type:
    from multiagenttrainer.sources.remote_repo import RemoteRepo

    return RemoteRepo


def _github_repo() -> type:
    from multiagenttrainer.sources.github_repo import GithubRepo

    return GithubRepo


def _github_org() -> type:
    from multiagenttrainer.sources.github_org import GithubOrg

    return GithubOrg


def _github_repo_list() -> type:
    from multiagenttrainer.sources.github_repo_list import GithubRepoList

    return GithubRepoList


def _bedrock_knowledge_base() -> type:
    from multiagenttrainer.sources.bedrock_kb import BedrockKnowledgeBase

    return BedrockKnowledgeBase


SOURCE_ADAPTERS: dict[str, Callable[[], type]] = {
    "local_repo": _local_repo,
    "remote_repo": _remote_repo,
    "github_repo": _github_repo,
    "github_org": _github_org,
    "github_repo_list": _github_repo_list,
    "bedrock_knowledge_base": _bedrock_knowledge_base,
}


def adapter_class(source_type: str) -> Any:
    """The adapter class registered for a source type."""
    try:
        load = SOURCE_ADAPTERS[source_type]
    except KeyError:
        valid = ", ".join(SOURCE_ADAPTERS)
        raise ConfigError(f"sources: unknown type {source_type!r}; valid types: {valid}") from None
    return load()


def make_source(cfg: SourceConfig, name: str, ctx: SourceContext) -> Source:
    """Build the adapter for one configured source."""
    source: Source = adapter_class(cfg.type)(cfg, name, ctx)
    return source


def make_sources(cfgs: Iterable[SourceConfig], ctx: SourceContext | None = None) -> list[Source]:
    """Adapters for every configured source, each with a unique name."""
    ctx = ctx or SourceContext()
    cfgs = list(cfgs)
    return [make_source(cfg, name, ctx) for cfg, name in zip(cfgs, unique_names(cfgs), strict=True)]


def unique_names(cfgs: list[SourceConfig]) -> list[str]:
    """Explicit names where given, otherwise derived ones; clashes get -2, -3, ..."""
    names: list[str] = []
    for cfg in cfgs:
        base = cfg.name or default_name(cfg)
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


def default_name(cfg: SourceConfig) -> str:
    """A readable name for a source without an explicit `name:`."""
    if cfg.type == "local_repo":
        return PurePosixPath(cfg.path.rstrip("/")).name or "local"
    if cfg.type in ("remote_repo", "github_repo"):
        return repo_slug(cfg.url)
    if cfg.type == "github_org":
        return repo_slug(cfg.url) or "org"
    if cfg.type == "github_repo_list":
        return "repo-list"
    assert cfg.type == "bedrock_knowledge_base"
    return f"kb-{cfg.knowledge_base_id[-10:]}"


def repo_slug(url: str) -> str:
    """`owner/repo` for a GitHub-style URL, the last path part otherwise, without `.git`."""
    path = urlparse(url).path if "://" in url else url.split(":", 1)[-1]
    parts = [p for p in path.strip("/").removesuffix(".git").split("/") if p]
    return "/".join(parts[-2:]) if len(parts) >= 2 else (parts[-1] if parts else url)


SHORTHAND = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def repo_argument_to_source(arg: str, github: GithubConfig) -> SourceConfig:
    """A `--repo` value (owner/repo or a full URL) as a source config."""
    arg = arg.strip()
    if SHORTHAND.match(arg):
        return GithubRepoSource(type="github_repo", url=f"{github.web_url}/{arg.removesuffix('.git')}")
    if is_git_url(arg):
        if same_host(arg, github.web_url):
            return GithubRepoSource(type="github_repo", url=arg)
        return RemoteRepoSource(type="remote_repo", url=arg)
    raise ConfigError(
        f"--repo {arg!r}: expected owner/repo or a git URL "
        "(https://, http://, git://, ssh://, file://, user@host:path)"
    )


def is_git_url(value: str) -> bool:
    return bool(re.match(r"^(https?|git|ssh|file)://", value) or re.match(r"^[\w.-]+@[\w.-]+:", value))


def same_host(url: str, web_url: str) -> bool:
    return urlparse(url).netloc.lower() == urlparse(web_url).netloc.lower() and bool(urlparse(url).netloc)
