"""The github_org source: the repositories of a GitHub (or GitHub Enterprise) organisation.

Repositories are listed with PyGithub, page by page, stopping as soon as `max_repos` are seen.
Each one is then cloned like a remote_repo (bare, shallow, one branch).

The API's answers are untrusted: a repository is cloned only when its name is `owner/repo`, its
default branch a valid branch name, and its clone URL the repository's own http(s) URL on the
GitHub host (`github.web_url`: same scheme, host and port, no credentials). Anything else (a
`file://` URL, another host, ssh) is refused and named in a warning. Refused repositories and
those that cannot be cloned are the snapshot's `failures`, so the ingest exits 1 while the
corpus keeps the others; the source itself fails only when none can be cloned.

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
from urllib.parse import urlsplit

import requests
from dulwich.refs import Ref, check_ref_format
from github import Auth, Github, GithubException, GithubRetry
from github.GithubException import (
    BadAttributeException,
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
from multiagenttrainer.sources.git import (
    GitCredentials,
    GitFetchError,
    clone_or_update,
    redact_url,
    remote_head,
)
from multiagenttrainer.sources.github_urls import (
    github_auth_hint,
    github_credentials,
    is_http_url,
    same_origin,
    source_error,
)

log = logging.getLogger(__name__)
# PyGithub attaches its own stderr handler at INFO and logs every retried request through it,
# which would break through mat's progress display; keep its warnings only.
logging.getLogger("github").setLevel(logging.WARNING)

PAGE_SIZE = 100  # GitHub's maximum; fewer requests per org
RATE_LIMIT_WAITS = 1  # PyGithub may wait out one short rate limit; failures are retried by SOURCE_RETRY
MAX_RATE_LIMIT_WAIT_S = 30  # beyond this, fail with the reset time instead of sleeping
GIT_WORKERS = 4  # concurrent ls-remote / clone calls per org
ORG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
FULL_NAME = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")

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
        """The fields mat uses; BadAttributeException when the API sent a wrong type."""
        return cls(repo.full_name or "", repo.clone_url or "", repo.default_branch or None, repo.size or 0)

    @property
    def label(self) -> str:
        """The name for messages: `owner/repo`, or the API's text quoted when it is not that shape."""
        return self.full_name if FULL_NAME.fullmatch(self.full_name) else repr(self.full_name[:100])

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


def refusal(repo: OrgRepo, org: str, web_url: str) -> str | None:
    """Why mat will not clone this repository as the API described it, or None when it may."""
    if not FULL_NAME.fullmatch(repo.full_name):
        return "the GitHub API gave it an invalid name; refused"
    if repo.full_name.split("/")[0].lower() != org.lower():
        return f"the GitHub API listed it, but it is not in organisation {org!r}; refused"
    branch = repo.default_branch
    if branch is not None and not check_ref_format(Ref(f"refs/heads/{branch}".encode())):
        return f"the GitHub API gave an invalid default branch {branch[:100]!r}; refused"
    problem = clone_url_problem(repo.clone_url, repo.full_name, web_url)
    if problem is None:
        return None
    return (
        f"refused the clone URL {redact_url(repo.clone_url)[:200]!r} from the GitHub API: {problem}; "
        f"only {web_url}/{repo.full_name}.git is cloned (check github.web_url and github.api_url)"
    )


def clone_url_problem(clone_url: str, full_name: str, web_url: str) -> str | None:
    """What is wrong with a clone URL for `full_name` on the GitHub host, or None when it is its own."""
    try:
        parts = urlsplit(clone_url)
        has_credentials = parts.username is not None or parts.password is not None
    except ValueError:
        return "it is not a valid URL"
    if not is_http_url(clone_url):
        return f"{parts.scheme or 'no'} scheme, not http(s)"
    if has_credentials:
        return "it carries credentials"
    if not same_origin(clone_url, web_url):
        return f"it is not on {web_url}"
    expected = f"{urlsplit(web_url).path.rstrip('/')}/{full_name}".lower()
    if parts.query or parts.fragment or parts.path.lower().removesuffix(".git") != expected:
        return f"it is not the URL of {full_name}"
    return None


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


def rate_limit_waits_only() -> BoundedGithubRetry:
    """PyGithub's retry object, limited to waiting out one short rate limit (403/429 with a reset).

    Server errors and lost connections are not retried here: they become TransientSourceError, and the
    one retry policy of a source fetch (retry.SOURCE_RETRY, applied by the ingest stage or its Prefect
    task) tries again, so attempts never multiply.
    """
    return BoundedGithubRetry(
        total=RATE_LIMIT_WAITS, connect=0, read=0, other=0, redirect=0,
        status_forcelist=[429], max_rate_limit_wait=MAX_RATE_LIMIT_WAIT_S,
    )  # fmt: skip


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
        usable, refused = self._screen(self.list_repos())
        outcomes = self._for_each(usable, self._remote_sha)
        pairs = [(repo.full_name, self._sha_or_marker(result)) for repo, result in outcomes]
        return version_of(pairs + [(repo.full_name, "refused") for repo in refused])

    def fetch(self, staging: Path) -> Snapshot:
        """Clone or update every listed repository under `staging`; those that fail are `failures`."""
        repos = self.list_repos()
        usable, refused = self._screen(repos)
        staging.mkdir(parents=True, exist_ok=True)
        self._remove_departed(staging, usable)
        outcomes = self._for_each(usable, lambda repo: self._clone(repo, staging))
        trees = [
            Tree(repo=repo.full_name, kind="git", path=str(staging / repo.staging_name), commit=result)
            for repo, result in outcomes
            if isinstance(result, str)
        ]
        errors = [(repo, result) for repo, result in outcomes if isinstance(result, GitFetchError)]
        empty = [(repo, error) for repo, error in errors if self._is_empty(repo, error)]
        failures = [f"{repo.label}: {refused[repo]}" for repo in refused]
        failures += [self._failure(repo, error) for repo, error in errors if (repo, error) not in empty]
        warnings = [f"{repo.label}: empty repository (no commits); skipped" for repo, _ in empty]
        for line in failures + warnings:
            log.warning("source %r: %s", self.name, line)
        if not trees:
            transient = bool(errors) and not refused and all(error.transient for _, error in errors)
            raise self._all_failed(len(repos), failures + warnings, transient)
        return Snapshot(
            source=self.name,
            type="github_org",
            version=version_of([(tree.repo, tree.commit or "") for tree in trees]),
            trees=trees,
            include=list(self.cfg.include),
            exclude=list(self.cfg.exclude),
            warnings=warnings,
            failures=failures,
        )

    def _screen(self, repos: list[OrgRepo]) -> tuple[list[OrgRepo], dict[OrgRepo, str]]:
        """The repositories mat may clone, and the refused ones with the reason."""
        usable: list[OrgRepo] = []
        refused: dict[OrgRepo, str] = {}
        taken: set[str] = set()  # staging names: two entries must not share a clone directory
        for repo in dict.fromkeys(repos):  # an entry repeated while pages shifted counts once
            reason = refusal(repo, self._require_org(), self.ctx.github.web_url)
            if reason is None and repo.staging_name in taken:
                reason = "the GitHub API listed it twice, differently; the second entry is refused"
            if reason is None:
                usable.append(repo)
                taken.add(repo.staging_name)
            else:
                refused[repo] = reason
        return usable, refused

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
        except (GithubException, BadAttributeException, requests.RequestException) as exc:
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
            retry=rate_limit_waits_only(),
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
                f"the GitHub API at {self.ctx.github.api_url} kept failing with server errors "
                f"({status} for organisation {self.org!r}); try again later",
                True,
            )
        return self._error(f"GitHub API error {status} for organisation {self.org!r}: {detail}")

    def _malformed(self, exc: Exception) -> SourceError:
        return self._error(
            f"the GitHub API at {self.ctx.github.api_url} sent a malformed repository list for {self.org!r} "
            "(a field of the wrong type); check github.api_url"
        )

    def _kept_failing(self, exc: Exception) -> SourceError:
        return self._error(
            f"the GitHub API at {self.ctx.github.api_url} kept failing with server errors; try again later",
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

        with ThreadPoolExecutor(max_workers=min(GIT_WORKERS, max(1, len(repos)))) as pool:
            return list(pool.map(attempt, repos))

    @staticmethod
    def _sha_or_marker(result: str | GitFetchError) -> str:
        return result if isinstance(result, str) else "unavailable"

    @staticmethod
    def _is_empty(repo: OrgRepo, error: GitFetchError) -> bool:
        """Whether the clone failed because GitHub reports the repository empty (nothing to fetch)."""
        return repo.size_kb == 0 and not error.transient

    def _failure(self, repo: OrgRepo, error: GitFetchError) -> str:
        """`owner/repo: reason`, with GitHub-specific advice when a token was refused or missing."""
        sent = self._credentials(repo.clone_url) is not None
        hint = github_auth_hint(self.ctx, repo.clone_url, self.cfg.token_env, sent)
        return f"{repo.label}: {self._scrub(source_error(self.name, error, hint).reason)}"

    def _all_failed(self, count: int, problems: list[str], transient: bool) -> SourceError:
        return self._error(
            f"none of the {count} repositories of organisation {self.org!r} could be cloned; "
            f"first: {problems[0]}",
            transient=transient,
        )


ApiErrorHandler = Callable[[GithubOrg, Exception], SourceError]

# Most specific first: the first matching exception type explains the failure.
API_ERRORS: tuple[tuple[type[Exception], ApiErrorHandler], ...] = (
    (RateLimitExceededException, GithubOrg._rate_limited),
    (BadCredentialsException, GithubOrg._bad_token),
    (BadAttributeException, GithubOrg._malformed),
    (UnknownObjectException, GithubOrg._org_not_found),
    (GithubException, GithubOrg._refused),
    (requests.exceptions.RetryError, GithubOrg._kept_failing),
    (requests.RequestException, GithubOrg._unreachable),
)
