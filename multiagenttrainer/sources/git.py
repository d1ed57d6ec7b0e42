"""Shallow, single-branch, bare git clones with dulwich, and cheap remote HEAD look-ups.

Files are read from the commit's tree later, so there is never a checkout. Credentials are given
to the transport only: they are never written to the clone's config or put in a message.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import urllib3
from dulwich.client import GitClient, HTTPUnauthorized, get_transport_and_path
from dulwich.errors import GitProtocolError, HangupException, NotGitRepository
from dulwich.objects import ObjectID
from dulwich.refs import HEADREF, Ref
from dulwich.repo import Repo

CLONE_DEPTH = 1


@dataclass(frozen=True)
class GitCredentials:
    """HTTP basic credentials; the password (a token) is hidden from repr."""

    username: str
    password: str = field(repr=False)


class GitFetchError(Exception):
    """A clone, fetch or ls-remote failed; `transient` says whether a retry may help."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def redact_url(url: str) -> str:
    """The URL without any user:password part."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _client(url: str, credentials: GitCredentials | None, timeout_s: float) -> tuple[GitClient, str]:
    # No transport-level retries: dulwich's default pool manager retries 3 times, multiplying
    # timeouts and logging each attempt; retrying transient failures is the orchestrator's job.
    retries = urllib3.Retry(total=3, connect=0, read=0, status=0, other=0, redirect=3)
    pool = urllib3.PoolManager(timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s), retries=retries)
    username, password = (credentials.username, credentials.password) if credentials else (None, None)
    return get_transport_and_path(url, pool_manager=pool, quiet=True, username=username, password=password)


def _translate(exc: BaseException, url: str) -> GitFetchError:
    where = redact_url(url)
    if isinstance(exc, HTTPUnauthorized):
        return GitFetchError(
            f"authentication failed for {where}; check the token (GITHUB_TOKEN or token_env)"
        )
    if isinstance(exc, NotGitRepository):
        return GitFetchError(f"no git repository at {where}; check the URL")
    text = str(exc)
    if isinstance(exc, GitProtocolError) and ("404" in text or _says_not_found(text)):
        return GitFetchError(f"repository not found at {where}; check the URL and that the token can read it")
    if isinstance(exc, GitProtocolError) and "403" in text:
        return GitFetchError(f"access denied to {where}; the token lacks read access")
    if isinstance(exc, HangupException):
        return GitFetchError(
            f"the server at {where} hung up; check the URL and access rights", transient=True
        )
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | socket.timeout | GitProtocolError):
        reason = _network_reason(text.replace(url, where) if url != where else text)
        advice = "check the host and port, or retry later"
        return GitFetchError(f"cannot reach {where}: {reason}; {advice}", transient=True)
    return GitFetchError(f"git error for {where}: {type(exc).__name__}: {text[:200]}")


# How git daemon and ssh servers say a repository is missing (or hidden).
NOT_FOUND_PHRASES = (
    "not found",
    "no such repository",
    "not exported",
    "does not appear to be a git repository",
)

# Short reasons for the usual socket failures, instead of urllib3's long reprs.
NETWORK_REASONS = {
    "refused": "connection refused",
    "timed out": "timed out",
    "name or service not known": "unknown host",
    "name resolution": "unknown host",
    "nodename nor servname": "unknown host",
    "network is unreachable": "network unreachable",
}


def _says_not_found(text: str) -> bool:
    return any(phrase in text.lower() for phrase in NOT_FOUND_PHRASES)


def _network_reason(text: str) -> str:
    lowered = text.lower()
    return next((reason for needle, reason in NETWORK_REASONS.items() if needle in lowered), text[:200])


def _strip_secrets(message: str, credentials: GitCredentials | None) -> str:
    return message.replace(credentials.password, "***") if credentials and credentials.password else message


def ls_remote(
    url: str, credentials: GitCredentials | None, timeout_s: float = 30.0
) -> tuple[dict[bytes, bytes], str | None]:
    """The remote's refs and the branch its HEAD points to (None if it does not say)."""
    try:
        client, path = _client(url, credentials, timeout_s)
        result = client.get_refs(path.encode() if isinstance(path, str) else path)
    except Exception as exc:  # translated at the boundary
        error = _translate(exc, url)
        raise GitFetchError(_strip_secrets(str(error), credentials), transient=error.transient) from exc
    head = bytes(result.symrefs.get(HEADREF) or b"")
    branch = head.decode().removeprefix("refs/heads/") if head.startswith(b"refs/heads/") else None
    return {bytes(name): bytes(sha) for name, sha in result.refs.items() if sha is not None}, branch


def remote_head(
    url: str, branch: str | None, credentials: GitCredentials | None, timeout_s: float = 30.0
) -> tuple[str, str]:
    """(branch, commit SHA) the remote has for `branch`, or for its default branch when None."""
    refs, default = ls_remote(url, credentials, timeout_s)
    chosen = branch or default or _guess_default(refs)
    sha = refs.get(f"refs/heads/{chosen}".encode()) if chosen else None
    if sha is None:
        heads = sorted(r.decode().removeprefix("refs/heads/") for r in refs if r.startswith(b"refs/heads/"))
        hint = f"branches there: {', '.join(heads[:10])}" if heads else "the repository has no branches"
        raise GitFetchError(f"branch {chosen!r} not found at {redact_url(url)}; {hint}")
    return chosen or "", sha.decode()


def _guess_default(refs: dict[bytes, bytes]) -> str | None:
    for name in ("main", "master"):
        if f"refs/heads/{name}".encode() in refs:
            return name
    return None


def clone_or_update(
    url: str,
    dest: Path,
    branch: str | None,
    credentials: GitCredentials | None,
    timeout_s: float = 30.0,
) -> tuple[str, str]:
    """Make `dest` a bare, shallow clone of one branch of `url`; fetch incrementally if it exists.

    Returns (branch, commit SHA). Nothing is downloaded when the branch has not moved.
    """
    chosen, sha = remote_head(url, branch, credentials, timeout_s)
    ref = Ref(f"refs/heads/{chosen}".encode())
    repo = Repo(str(dest)) if (dest / "HEAD").exists() else Repo.init_bare(str(dest), mkdir=not dest.exists())
    with repo:
        if ObjectID(sha.encode()) not in repo.object_store:
            _fetch_branch(repo, url, ref, credentials, timeout_s)
        repo.refs[ref] = ObjectID(sha.encode())
        repo.refs.set_symbolic_ref(HEADREF, ref)
        _record_origin(repo, url)
    return chosen, sha


def _fetch_branch(
    repo: Repo, url: str, ref: bytes, credentials: GitCredentials | None, timeout_s: float
) -> None:
    try:
        client, path = _client(url, credentials, timeout_s)
        client.fetch(
            path,
            repo,
            determine_wants=lambda refs, depth=None: [refs[ref]] if ref in refs else [],
            depth=CLONE_DEPTH,
            ref_prefix=[ref],
        )
    except Exception as exc:
        error = _translate(exc, url)
        raise GitFetchError(_strip_secrets(str(error), credentials), transient=error.transient) from exc


def _record_origin(repo: Repo, url: str) -> None:
    """Remember where the clone came from, without any credentials."""
    config = repo.get_config()
    config.set((b"remote", b"origin"), b"url", redact_url(url).encode())
    config.write_to_path()
