"""The `github_repo_list` source: several repositories (owner/repo shorthands or URLs) as one source.

Each repository is cloned like `github_repo`. When some fail and others work, the snapshot holds
the ones that worked and names each failure in its `failures` (the ingest then exits 1, with
the others in the corpus); only when all fail is the source an error.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from multiagenttrainer.config import GithubRepoListSource
from multiagenttrainer.errors import ConfigError, SourceError, TransientSourceError
from multiagenttrainer.sources.base import Snapshot, SourceContext, SourceInfo, Tree
from multiagenttrainer.sources.git import GitFetchError, redact_url, remote_head
from multiagenttrainer.sources.github_urls import (
    branch_in_ref,
    clone_url_for,
    github_auth_hint,
    github_credentials,
    source_error,
)
from multiagenttrainer.sources.registry import repo_slug
from multiagenttrainer.sources.remote_repo import clone_dir_name, clone_tree

log = logging.getLogger(__name__)

LIST_WORKERS = 4  # clones are network-bound; a few at once
T = TypeVar("T")


@dataclass(frozen=True)
class RepoTarget:
    """One entry of `repos:`, resolved to a clone URL and a clone directory name."""

    ref: str
    url: str
    label: str
    dir_name: str
    branch: str | None


@dataclass(frozen=True)
class RepoFailure:
    """One entry that could not be resolved or fetched."""

    ref: str
    reason: str
    transient: bool = False


def plan_targets(
    repos: Iterable[str], branch: str | None, ctx: SourceContext
) -> tuple[list[RepoTarget], list[RepoFailure]]:
    """Clone URLs and unique directory names for `repos`; unparseable entries become failures."""
    targets: list[RepoTarget] = []
    failures: list[RepoFailure] = []
    seen_urls: set[str] = set()
    used_dirs: set[str] = set()
    for ref in repos:
        try:
            url = clone_url_for(ref, ctx.github)
            ref_branch = branch or branch_in_ref(ref, ctx.github)
        except ConfigError as exc:
            failures.append(RepoFailure(ref, str(exc)))
            continue
        if url in seen_urls:
            continue
        seen_urls.add(url)
        label = repo_slug(url)
        dir_name = unique_dir_name(clone_dir_name(label), used_dirs)
        targets.append(RepoTarget(ref, url, label, dir_name, ref_branch))
    return targets, failures


def unique_dir_name(name: str, used: set[str]) -> str:
    """`name`, or `name` with -2, -3, ... before .git when taken; records the result in `used`."""
    candidate, n = name, 2
    while candidate in used:
        candidate, n = f"{name.removesuffix('.git')}-{n}.git", n + 1
    used.add(candidate)
    return candidate


def list_version(pairs: Iterable[tuple[str, str]]) -> str:
    """A stable hash over (clone URL, commit SHA) pairs, independent of their order."""
    lines = sorted(f"{redact_url(url)} {sha}" for url, sha in pairs)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def all_failed_error(name: str, failures: list[RepoFailure]) -> SourceError:
    """The error for a list where no repository could be fetched; transient only if every cause is."""
    details = "; ".join(f"{f.ref}: {f.reason}" for f in failures)
    error_type = TransientSourceError if all(f.transient for f in failures) else SourceError
    return error_type(name, f"none of the {len(failures)} repositories could be fetched: {details}")


def run_each(items: list[RepoTarget], work: Callable[[RepoTarget], T]) -> list[T]:
    """`work` applied to every item, a few at a time, results in input order."""
    with ThreadPoolExecutor(max_workers=min(LIST_WORKERS, max(1, len(items)))) as pool:
        return list(pool.map(work, items))


class GithubRepoList:
    """A list of GitHub repositories ingested as one source."""

    source_type = "github_repo_list"

    def __init__(self, cfg: GithubRepoListSource, name: str, ctx: SourceContext) -> None:
        self.cfg = cfg
        self.name = name
        self.ctx = ctx

    def describe(self) -> SourceInfo:
        """Name, type, the repositories as listed, and the configured branch."""
        location = ", ".join(redact_url(ref.strip()) for ref in self.cfg.repos)
        return SourceInfo(self.name, self.source_type, location, self.cfg.branch)

    def resolve(self) -> str | None:
        """A hash over every repository's head SHA; None when some (not all) cannot be resolved."""
        targets, failures = plan_targets(self.cfg.repos, self.cfg.branch, self.ctx)
        outcomes = run_each(targets, self._resolve_one)
        failures += [o for o in outcomes if isinstance(o, RepoFailure)]
        pairs = [o for o in outcomes if isinstance(o, tuple)]
        if not pairs:
            raise all_failed_error(self.name, failures)
        return None if failures else list_version(pairs)

    def fetch(self, staging: Path) -> Snapshot:
        """Clone or update every repository; those that fail are the snapshot's `failures`."""
        targets, failures = plan_targets(self.cfg.repos, self.cfg.branch, self.ctx)
        outcomes = run_each(targets, lambda target: self._fetch_one(target, staging))
        failures += [o for o in outcomes if isinstance(o, RepoFailure)]
        fetched = [(t, o) for t, o in zip(targets, outcomes, strict=True) if isinstance(o, Tree)]
        if not fetched:
            raise all_failed_error(self.name, failures)
        for failure in failures:
            log.warning("source %r: skipped %s: %s", self.name, failure.ref, failure.reason)
        return Snapshot(
            source=self.name,
            type=self.source_type,
            version=list_version((target.url, tree.commit or "") for target, tree in fetched),
            trees=[tree for _, tree in fetched],
            include=list(self.cfg.include),
            exclude=list(self.cfg.exclude),
            failures=[f"{failure.ref}: {failure.reason}" for failure in failures],
        )

    def _resolve_one(self, target: RepoTarget) -> tuple[str, str] | RepoFailure:
        credentials = github_credentials(self.ctx, target.url, self.cfg.token_env)
        try:
            return target.url, remote_head(target.url, target.branch, credentials, self.ctx.timeout_s)[1]
        except GitFetchError as exc:
            return self._failure(target, exc, credentials is not None)

    def _fetch_one(self, target: RepoTarget, staging: Path) -> Tree | RepoFailure:
        credentials = github_credentials(self.ctx, target.url, self.cfg.token_env)
        try:
            clone = staging / target.dir_name
            return clone_tree(target.label, target.url, clone, target.branch, credentials, self.ctx.timeout_s)
        except GitFetchError as exc:
            return self._failure(target, exc, credentials is not None)

    def _failure(self, target: RepoTarget, exc: GitFetchError, token_sent: bool) -> RepoFailure:
        hint = github_auth_hint(self.ctx, target.url, self.cfg.token_env, token_sent)
        error = source_error(self.name, exc, hint)
        return RepoFailure(target.ref, error.reason, isinstance(error, TransientSourceError))
