"""The `remote_repo` source: any git URL, cloned bare, shallow and single-branch with dulwich.

The clone lives in the source's staging directory and is updated in place: a re-fetch of an
unchanged branch downloads nothing. Files are read later from the commit's tree (no checkout).
The helpers here are shared by the github_* sources.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

from dulwich.config import ConfigFile

from multiagenttrainer.config import GithubRepoSource, RemoteRepoSource
from multiagenttrainer.sources.base import Snapshot, SourceContext, SourceInfo, Tree
from multiagenttrainer.sources.git import (
    GitCredentials,
    GitFetchError,
    clone_or_update,
    redact_url,
    remote_head,
)
from multiagenttrainer.sources.github_urls import TOKEN_USERNAME, auth_hint, is_http_url, source_error
from multiagenttrainer.sources.registry import repo_slug

log = logging.getLogger(__name__)


def clone_dir_name(label: str) -> str:
    """A directory name for the clone of `label` (owner/repo -> owner__repo.git)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", label.replace("/", "__")).lstrip(".")
    return f"{safe or 'repo'}.git"


def recorded_origin(clone: Path) -> str | None:
    """The origin URL written into an existing clone's config, if any."""
    config = clone / "config"
    if not config.is_file():
        return None
    try:
        return ConfigFile.from_path(str(config)).get((b"remote", b"origin"), b"url").decode()
    except (KeyError, ValueError, OSError):
        return None


def discard_foreign_clone(clone: Path, url: str) -> None:
    """Delete a clone that came from another URL, so that two repositories never share objects."""
    origin = recorded_origin(clone)
    if origin is not None and origin != redact_url(url):
        log.info("%s was cloned from %s; starting again from %s", clone, origin, redact_url(url))
        shutil.rmtree(clone)


def url_username(url: str) -> str | None:
    """The user name written in a URL (https://USER@host/...), if any."""
    username = urlsplit(url).username
    return unquote(username) if username else None


def clone_tree(
    label: str,
    url: str,
    clone: Path,
    branch: str | None,
    credentials: GitCredentials | None,
    timeout_s: float,
) -> Tree:
    """Clone or update one branch of `url` into `clone` and describe it as a git tree."""
    discard_foreign_clone(clone, url)
    clone.parent.mkdir(parents=True, exist_ok=True)
    chosen, sha = clone_or_update(url, clone, branch, credentials, timeout_s)
    log.info("%s: %s at %s", label, chosen, sha[:12])
    return Tree(repo=label, kind="git", path=str(clone), commit=sha)


class RemoteRepo:
    """A git repository at any URL (https, http, git, ssh, file)."""

    source_type = "remote_repo"

    def __init__(self, cfg: RemoteRepoSource | GithubRepoSource, name: str, ctx: SourceContext) -> None:
        self.cfg = cfg
        self.name = name
        self.ctx = ctx

    def clone_url(self) -> str:
        """The URL handed to git."""
        return self.cfg.url.strip()

    def branch(self) -> str | None:
        """The branch to fetch; None means the remote's default branch."""
        return self.cfg.branch

    def credentials(self, url: str) -> GitCredentials | None:
        """The token from `token_env` for an http(s) URL; the user chose to send it to this host."""
        if not is_http_url(url):
            return None  # git://, ssh:// and file:// take no token
        token = self.ctx.secret(self.cfg.token_env)
        if token is None:
            if self.cfg.token_env:
                log.warning(
                    "source %r: %s is not set; connecting without a token", self.name, self.cfg.token_env
                )
            return None
        username = url_username(url) or TOKEN_USERNAME
        return GitCredentials(username, token)

    def auth_hint(self, url: str, credentials: GitCredentials | None) -> str:
        """Advice for an HTTP 401 from `url`."""
        return auth_hint(self.cfg.token_env, credentials is not None)

    def describe(self) -> SourceInfo:
        """Name, type, the URL without credentials, and the configured branch."""
        return SourceInfo(self.name, self.source_type, redact_url(self.cfg.url.strip()), self.cfg.branch)

    def resolve(self) -> str | None:
        """The commit SHA the branch points to on the remote (one ref listing, no download)."""
        url = self.clone_url()
        credentials = self.credentials(url)
        try:
            return remote_head(url, self.branch(), credentials, self.ctx.timeout_s)[1]
        except GitFetchError as exc:
            raise source_error(self.name, exc, self.auth_hint(url, credentials)) from exc

    def fetch(self, staging: Path) -> Snapshot:
        """Clone or update the branch under `staging` and return its snapshot."""
        url = self.clone_url()
        label = repo_slug(url)
        credentials = self.credentials(url)
        clone = staging / clone_dir_name(label)
        try:
            tree = clone_tree(label, url, clone, self.branch(), credentials, self.ctx.timeout_s)
        except GitFetchError as exc:
            raise source_error(self.name, exc, self.auth_hint(url, credentials)) from exc
        return Snapshot(
            source=self.name,
            type=self.source_type,
            version=tree.commit or "",
            trees=[tree],
            include=list(self.cfg.include),
            exclude=list(self.cfg.exclude),
        )
