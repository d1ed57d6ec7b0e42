"""The github_org source: the repositories of a GitHub (or GitHub Enterprise) organisation.

Repositories are listed with PyGithub, page by page, stopping as soon as `max_repos` are seen.
Each one is then cloned like a remote_repo (bare, shallow, one branch). A repository that cannot
be cloned becomes a warning on the snapshot; the source fails only when none can be cloned.

Rate limits: PyGithub waits for a reset that is near; when the wait would exceed
MAX_RATE_LIMIT_WAIT_S the source fails at once with the reset time and what to change.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import requests
from github import Auth, Github, GithubException, GithubRetry
from github.GithubException import (
    BadCredentialsException,
    RateLimitExceededExceedsMaxWait,
    RateLimitExceededException,
    UnknownObjectException,
)
from github.Repository import Repository
from urllib3.connectionpool import ConnectionPool
from urllib3.response import HTTPResponse
from urllib3.util.retry import Retry

from multiagenttrainer.config import GithubOrgSource
from multiagenttrainer.errors import SourceError, TransientSourceError
from multiagenttrainer.sources.base import Snapshot, SourceContext, SourceInfo, Tree
from multiagenttrainer.sources.git import GitCredentials, GitFetchError, clone_or_update, remote_head
from multiagenttrainer.sources.github_urls import github_auth_hint, github_credentials, source_error

log = logging.getLogger(__name__)
# PyGithub attaches its own stderr handler at INFO and logs every retried request through it,
# which would break through mat's progress display; keep its warnings only.
logging.getLogger("github").setLevel(logging.WARNING)

PAGE_SIZE = 100  # GitHub's maximum; fewer requests per org
API_RETRIES = 3  # for 5xx, connection errors and short rate-limit waits
MAX_RATE_LIMIT_WAIT_S = 30  # beyond this, fail with the reset time instead of sleeping
GIT_WORKERS = 4  # concurrent ls-remote / clone calls per org
ORG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

T = TypeVar("T")


@dataclass(frozen=True)
class OrgRepo:
    """What mat needs to know about one repository of the organisation."""

    full_name: str
    clone_url: str
    default_branch: str | None
    size_kb: int

    @classmethod
    def from_github(cls, repo: Repository) -> OrgRepo:
        return cls(repo.full_name, repo.clone_url, repo.default_branch or None, repo.size or 0)

    @property
    def staging_name(self) -> str:
        """`owner__repo.git`: the clone's directory name under the source's staging directory."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.full_name.replace("/", "__"))
        return f"{safe}.git"


def org_from_url(url: str, web_url: str) -> str | None:
    """The organisation in `<web_url>/<org>` (a trailing slash is fine), or None for any other shape."""
    prefix = web_url.rstrip("/") + "/"
    if not url.lower().startswith(prefix.lower()):
        return None
    rest = url[len(prefix) :].removesuffix("/")
    return rest if ORG_NAME.fullmatch(rest) else None


def version_of(pairs: list[tuple[str, str]]) -> str:
    """A stable key for a set of (repository, commit) pairs."""
    return hashlib.sha256(json.dumps(sorted(pairs)).encode()).hexdigest()


def header(headers: Mapping[str, Any] | None, name: str) -> str | None:
    """A response header, whatever the case of its name."""
    wanted = name.lower()
    return next((str(v) for k, v in (headers or {}).items() if k.lower() == wanted), None)


def describe_wait(seconds: float, now: datetime | None = None) -> str:
    """`HH:MM UTC (in N min)` for a wait that starts now."""
    now = now or datetime.now(UTC)
    at = datetime.fromtimestamp(now.timestamp() + seconds, UTC)
    return f"{at:%H:%M} UTC (in {max(1, math.ceil(seconds / 60))} min)"


def rate_limit_wait_s(exc: GithubException) -> float | None:
    """Seconds until GitHub accepts requests again, from X-RateLimit-Reset or Retry-After."""
    reset = header(exc.headers, "X-RateLimit-Reset")
    if reset and reset.isdigit():
        return max(0.0, int(reset) - datetime.now(UTC).timestamp())
    retry_after = header(exc.headers, "Retry-After")
    if retry_after and retry_after.isdigit():
        return float(retry_after)
    wait = getattr(exc, "wait", None)
    return float(wait) if isinstance(wait, int | float) else None


class BoundedGithubRetry(GithubRetry):
    """GithubRetry that also refuses to sleep through a long Retry-After header.

    PyGithub caps waits for X-RateLimit-Reset with max_rate_limit_wait, but leaves Retry-After
    (secondary limits, 429) to urllib3, which would sleep for as long as the server says.
    """

    def increment(  # type: ignore[override]
        self,
        method: str | None = None,
        url: str | None = None,
        response: HTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Retry:
        wait = self.get_retry_after(response) if response is not None else None
        limit = self.max_rate_limit_wait
        if response is not None and wait is not None and limit is not None and wait > limit:
            raise RateLimitExceededExceedsMaxWait(response.status, None, dict(response.headers), wait=wait)
        return super().increment(method, url, response, error, _pool, _stacktrace)


class GithubOrg:
    """Every repository (up to max_repos) of one organisation, each cloned at its default branch."""

    def __init__(self, cfg: GithubOrgSource, name: str, ctx: SourceContext) -> None:
        self.cfg = cfg
        self.name = name
        self.ctx = ctx
        self.org = org_from_url(cfg.url, ctx.github.web_url)

    def describe(self) -> SourceInfo:
        """Name, type, the org URL with visibility and limit; no branch (each repo uses its default)."""
        location = f"{self.cfg.url} ({self.cfg.visibility}, max {self.cfg.max_repos})"
        return SourceInfo(self.name, "github_org", location, None)

    def resolve(self) -> str:
        """A hash of every listed repository's name and current default-branch commit."""
        outcomes = self._for_each(self.list_repos(), self._remote_sha)
        return version_of([(repo.full_name, self._sha_or_marker(result)) for repo, result in outcomes])

    def fetch(self, staging: Path) -> Snapshot:
        """Clone or update every listed repository under `staging`; failures become warnings."""
        repos = self.list_repos()
        staging.mkdir(parents=True, exist_ok=True)
        self._remove_departed(staging, repos)
        outcomes = self._for_each(repos, lambda repo: self._clone(repo, staging))
        trees = [
            Tree(repo=repo.full_name, kind="git", path=str(staging / repo.staging_name), commit=result)
            for repo, result in outcomes
            if isinstance(result, str)
        ]
        failures = [(repo, result) for repo, result in outcomes if isinstance(result, GitFetchError)]
        warnings = [self._warning(repo, error) for repo, error in failures]
        for warning in warnings:
            log.warning("source %r: %s", self.name, warning)
        if not trees:
            raise self._all_failed(len(repos), warnings, all(error.transient for _, error in failures))
        return Snapshot(
            source=self.name,
            type="github_org",
            version=version_of([(tree.repo, tree.commit or "") for tree in trees]),
            trees=trees,
            include=list(self.cfg.include),
            exclude=list(self.cfg.exclude),
            warnings=warnings,
        )

    def _remove_departed(self, staging: Path, repos: list[OrgRepo]) -> None:
        """Remove the clones of repositories no longer listed (deleted, renamed, made private, or past
        max_repos), so the staging directory does not keep growing. Only clone-shaped directories
        (`owner__repo.git`) in this source's own staging directory are touched."""
        listed = {repo.staging_name for repo in repos}
        for entry in staging.iterdir():
            name = entry.name
            if name.endswith(".git") and "__" in name and name not in listed and entry.is_dir():
                log.info("source %r: removing %s, no longer listed in the organisation", self.name, name)
                shutil.rmtree(entry, ignore_errors=True)

    # ------------------------------------------------------------------ listing (GitHub API)

    def list_repos(self) -> list[OrgRepo]:
        """The organisation's repositories for the configured visibility, at most max_repos of them."""
        org = self._require_org()
        client = self._github()
        try:
            listing = client.get_organization(org).get_repos(type=self.cfg.visibility)
            repos = [OrgRepo.from_github(repo) for repo in islice(listing, self.cfg.max_repos)]
        except (GithubException, requests.RequestException) as exc:
            raise self._api_error(exc) from exc
        finally:
            client.close()
        if not repos:
            raise self._error(self._no_repos_message(org))
        return repos

    def _github(self) -> Github:
        token = self._token()
        return Github(
            base_url=self.ctx.github.api_url,
            auth=Auth.Token(token) if token else None,
            per_page=PAGE_SIZE,
            seconds_between_requests=None,
            lazy=True,
            retry=BoundedGithubRetry(total=API_RETRIES, max_rate_limit_wait=MAX_RATE_LIMIT_WAIT_S),
            timeout=max(1, math.ceil(self.ctx.timeout_s)),
        )

    def _require_org(self) -> str:
        if self.org is None:
            raise self._error(
                f"url {self.cfg.url!r} is not an organisation URL; expected {self.ctx.github.web_url}/<org> "
                "(set github.web_url for GitHub Enterprise)"
            )
        return self.org

    def _no_repos_message(self, org: str) -> str:
        hint = (
            f"; private repositories need a token: set {self.cfg.token_env}"
            if self._token() is None and self.cfg.visibility != "public"
            else ""
        )
        return f"organisation {org!r} has no {self.cfg.visibility} repositories visible to mat{hint}"

    # ------------------------------------------------------------------ error translation

    def _api_error(self, exc: Exception) -> SourceError:
        for kind, explain in API_ERRORS:
            if isinstance(exc, kind):
                return explain(self, exc)
        return self._error(
            f"GitHub API error for organisation {self.org!r}: {type(exc).__name__}: {self._scrub(str(exc))}"
        )

    def _rate_limited(self, exc: Exception) -> SourceError:
        assert isinstance(exc, GithubException)
        wait = rate_limit_wait_s(exc)
        when = f"; resets at {describe_wait(wait)}" if wait is not None else ""
        fix = (
            f"set {self.cfg.token_env} for a higher limit or lower max_repos"
            if self._token() is None
            else "wait for the reset, lower max_repos or run less often"
        )
        return self._error(f"GitHub rate limit reached for {self.org}{when}; {fix}")

    def _bad_token(self, exc: Exception) -> SourceError:
        return self._error(
            f"GitHub rejected the token in {self.cfg.token_env} (401 bad credentials); "
            f"create a new token or unset {self.cfg.token_env} to list public repositories only"
        )

    def _org_not_found(self, exc: Exception) -> SourceError:
        return self._error(
            f"organisation {self.org!r} not found at {self.ctx.github.web_url}; check the url "
            f"(for a private organisation, also that the token in {self.cfg.token_env} can see it)"
        )

    def _refused(self, exc: Exception) -> SourceError:
        assert isinstance(exc, GithubException)
        status = exc.status
        detail = self._scrub(
            exc.message or (exc.data.get("message") if isinstance(exc.data, dict) else None) or ""
        )
        if status == 429:
            return self._rate_limited(exc)
        if status == 401:
            return self._error(
                f"GitHub requires authentication to list organisation {self.org!r} (401: {detail}); "
                f"set {self.cfg.token_env} to a token that can read it"
            )
        if status == 403:
            return self._error(
                f"GitHub refused to list organisation {self.org!r} (403: {detail}); the token in "
                f"{self.cfg.token_env} lacks permission (it needs read access to the organisation's "
                "repositories)"
            )
        if status >= 500:
            return self._error(
                f"GitHub API error {status} for organisation {self.org!r}; try again later", True
            )
        return self._error(f"GitHub API error {status} for organisation {self.org!r}: {detail}")

    def _kept_failing(self, exc: Exception) -> SourceError:
        return self._error(
            f"the GitHub API at {self.ctx.github.api_url} kept failing with server errors "
            f"after {API_RETRIES} retries; try again later",
            transient=True,
        )

    def _unreachable(self, exc: Exception) -> SourceError:
        return self._error(
            f"cannot reach the GitHub API at {self.ctx.github.api_url} ({type(exc).__name__}); "
            "check the network and github.api_url",
            transient=True,
        )

    def _error(self, message: str, transient: bool = False) -> SourceError:
        return TransientSourceError(self.name, message) if transient else SourceError(self.name, message)

    def _scrub(self, text: str) -> str:
        """Text from a server (an API message, a git error) with the token, if any, masked."""
        token = self._token()
        return text.replace(token, "***") if token else text

    # ------------------------------------------------------------------ per-repository git work

    def _token(self) -> str | None:
        return self.ctx.secret(self.cfg.token_env)

    def _credentials(self, clone_url: str) -> GitCredentials | None:
        """The token as git credentials, only for clone URLs on the configured GitHub host."""
        return github_credentials(self.ctx, clone_url, self.cfg.token_env)

    def _remote_sha(self, repo: OrgRepo) -> str:
        _, sha = remote_head(
            repo.clone_url, repo.default_branch, self._credentials(repo.clone_url), self.ctx.timeout_s
        )
        return sha

    def _clone(self, repo: OrgRepo, staging: Path) -> str:
        dest = staging / repo.staging_name
        credentials = self._credentials(repo.clone_url)
        _, sha = clone_or_update(repo.clone_url, dest, repo.default_branch, credentials, self.ctx.timeout_s)
        return sha

    def _for_each(
        self, repos: list[OrgRepo], work: Callable[[OrgRepo], T]
    ) -> list[tuple[OrgRepo, T | GitFetchError]]:
        """Run `work` on every repository, a few at a time; a GitFetchError is returned, not raised."""

        def attempt(repo: OrgRepo) -> tuple[OrgRepo, T | GitFetchError]:
            try:
                return repo, work(repo)
            except GitFetchError as exc:
                return repo, exc

        with ThreadPoolExecutor(max_workers=min(GIT_WORKERS, len(repos))) as pool:
            return list(pool.map(attempt, repos))

    @staticmethod
    def _sha_or_marker(result: str | GitFetchError) -> str:
        return result if isinstance(result, str) else "unavailable"

    def _warning(self, repo: OrgRepo, error: GitFetchError) -> str:
        """`owner/repo: reason`, with GitHub-specific advice when a token was refused or missing."""
        if repo.size_kb == 0 and not error.transient:
            return f"{repo.full_name}: empty repository (no commits); skipped"
        sent = self._credentials(repo.clone_url) is not None
        hint = github_auth_hint(self.ctx, repo.clone_url, self.cfg.token_env, sent)
        return f"{repo.full_name}: {self._scrub(source_error(self.name, error, hint).reason)}"

    def _all_failed(self, count: int, warnings: list[str], transient: bool) -> SourceError:
        return self._error(
            f"none of the {count} repositories of organisation {self.org!r} could be cloned; "
            f"first: {warnings[0]}",
            transient=transient,
        )


ApiErrorHandler = Callable[[GithubOrg, Exception], SourceError]

# Most specific first: the first matching exception type explains the failure.
API_ERRORS: tuple[tuple[type[Exception], ApiErrorHandler], ...] = (
    (RateLimitExceededException, GithubOrg._rate_limited),
    (BadCredentialsException, GithubOrg._bad_token),
    (UnknownObjectException, GithubOrg._org_not_found),
    (GithubException, GithubOrg._refused),
    (requests.exceptions.RetryError, GithubOrg._kept_failing),
    (requests.RequestException, GithubOrg._unreachable),
)
