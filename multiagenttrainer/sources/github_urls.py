"""GitHub helpers shared by the github_* sources: clone URLs, when to send a token, and error messages.

A GitHub token is sent only to the configured GitHub host (`github.web_url`, same scheme, host and
port), never to any other server a repository list happens to name.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from dulwich.client import HTTPUnauthorized

from multiagenttrainer.config import GithubConfig
from multiagenttrainer.errors import ConfigError, SourceError, TransientSourceError
from multiagenttrainer.sources.base import SourceContext
from multiagenttrainer.sources.git import GitCredentials, GitFetchError, redact_url
from multiagenttrainer.sources.registry import SHORTHAND, is_git_url

# The user name GitHub expects next to a token in HTTP basic auth (any name works for PATs).
TOKEN_USERNAME = "x-access-token"

# Hosts whose web URLs are turned into clone URLs even when web_url points at GitHub Enterprise.
PUBLIC_GITHUB_HOSTS = ("github.com", "www.github.com")

NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, with the scheme's default port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:  # a non-numeric port
        port = None
    return scheme, (parts.hostname or "").lower(), port


def same_origin(url: str, other: str) -> bool:
    """Whether two URLs share scheme, host and port (and have a host at all)."""
    first = origin(url)
    return bool(first[1]) and first == origin(other)


def is_http_url(url: str) -> bool:
    """Whether the URL uses http or https, the only schemes that take token credentials."""
    return origin(url)[0] in DEFAULT_PORTS


def web_base(url: str, github: GithubConfig) -> str | None:
    """The web root (`web_url`, or https://github.com) that `url` lives under, or None if none."""
    if same_origin(url, github.web_url):
        return github.web_url
    scheme, host, _ = origin(url)
    if scheme in DEFAULT_PORTS and host in PUBLIC_GITHUB_HOSTS:
        return f"{scheme}://{urlsplit(url).netloc}"
    return None


def web_url_parts(url: str, base: str) -> tuple[str, str, str | None]:
    """(owner, repo, branch or None) of a GitHub web URL such as <base>/owner/repo/tree/dev."""
    prefix = urlsplit(base).path.strip("/")
    path = urlsplit(url).path.strip("/")
    if prefix and path.startswith(prefix + "/"):
        path = path[len(prefix) + 1 :]
    parts = path.split("/")
    if len(parts) < 2 or not NAME.match(parts[0]) or not NAME.match(parts[1].removesuffix(".git")):
        raise ConfigError(f"{redact_url(url)}: expected a repository URL like {base}/OWNER/REPO")
    branch = "/".join(parts[3:]) if len(parts) > 3 and parts[2] == "tree" else None
    return parts[0], parts[1].removesuffix(".git"), branch or None


def clone_url_for(repo_ref: str, github: GithubConfig) -> str:
    """The clone URL for owner/repo, a GitHub web URL (…/tree/BRANCH allowed) or any git URL."""
    ref = repo_ref.strip()
    if SHORTHAND.match(ref):
        owner, repo = ref.split("/")
        return f"{github.web_url}/{owner}/{repo.removesuffix('.git')}.git"
    if not is_git_url(ref):
        raise ConfigError(
            f"{redact_url(ref)!r}: expected owner/repo, a GitHub web URL or a git URL "
            "(https://, http://, git://, ssh://, file://, user@host:path)"
        )
    base = web_base(ref, github)
    if base is None:
        return ref
    owner, repo, _ = web_url_parts(ref, base)
    scheme, netloc = urlsplit(ref)[:2]
    prefix = urlsplit(base).path.rstrip("/")
    return f"{scheme}://{netloc}{prefix}/{owner}/{repo}.git"


def branch_in_ref(repo_ref: str, github: GithubConfig) -> str | None:
    """The branch named by a web URL ending in /tree/BRANCH, or None."""
    ref = repo_ref.strip()
    base = web_base(ref, github) if is_git_url(ref) else None
    return web_url_parts(ref, base)[2] if base else None


def github_credentials(ctx: SourceContext, url: str, token_env: str | None) -> GitCredentials | None:
    """The token from `token_env` as credentials, but only for URLs on the GitHub host."""
    token = ctx.secret(token_env)
    if token is None or not same_origin(url, ctx.github.web_url):
        return None
    return GitCredentials(TOKEN_USERNAME, token)


def auth_hint(token_env: str | None, token_sent: bool) -> str:
    """What to do when a server refused us (HTTP 401)."""
    if token_sent:
        return f"the token in {token_env} was refused; check that it is valid and can read this repository"
    if token_env:
        return f"the server wants a token: set {token_env} to a token that can read this repository"
    return "the server wants a token: add `token_env: VAR` to the source and set VAR to a token"


def github_auth_hint(ctx: SourceContext, url: str, token_env: str | None, token_sent: bool) -> str:
    """Like `auth_hint`, but explains that GitHub tokens go only to the GitHub host."""
    if not token_sent and not same_origin(url, ctx.github.web_url):
        return (
            f"the server wants a token, and {token_env} is sent only to {ctx.github.web_url}; "
            "for another host use a remote_repo source with `token_env:`"
        )
    if not token_sent:
        return f"the repository is private or needs a token: set {token_env} to a token that can read it"
    return auth_hint(token_env, token_sent)


def source_error(name: str, exc: GitFetchError, hint: str | None = None) -> SourceError:
    """A git failure as source `name`'s SourceError (TransientSourceError when a retry may help).

    `hint` replaces the generic advice when the server refused the credentials (HTTP 401).
    """
    message = str(exc)
    if hint and isinstance(exc.__cause__, HTTPUnauthorized):
        message = f"{message.partition(';')[0]}; {hint}"
    error_type = TransientSourceError if exc.transient else SourceError
    return error_type(name, message)
