"""Prefect tasks for ingest: resolve a source, fetch it, build the corpus. Thin wrappers over the library.

Task inputs are plain JSON (a source's config as a dict, paths as strings): each task re-creates
its source from the registry, so inputs stay small and cache keys stay stable. Two custom cache
policies make re-runs cheap without ever handing back something that is gone from disk:

- fetch: keyed on the source's config, name, resolved version (commit SHA) and staging path; no
  key when the version is unknown or when the cached snapshot's trees no longer exist.
- corpus: keyed on every snapshot, the corpus options, the output path and the current output
  files' sizes and mtimes; no key while an output file is missing.

Progress events go to the object installed with `reporting_progress` (a context variable that
Prefect's thread pool copies into task threads); progress never enters a task's inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import CachePolicy
from prefect.client.schemas.objects import State
from prefect.context import TaskRunContext
from prefect.results import ResultStore
from pydantic import TypeAdapter

import multiagenttrainer
from blocks.secrets import environment_with_secrets
from multiagenttrainer import ingest as library
from multiagenttrainer.config import CorpusConfig, GithubConfig, SourceConfig
from multiagenttrainer.errors import TransientSourceError
from multiagenttrainer.progress import IngestProgress, NullProgress
from multiagenttrainer.sources import Snapshot, Source, SourceContext, make_source

RETRY_DELAYS_S = [1.0, 5.0]  # transient network errors: two more attempts, soon
CORPUS_OUTPUTS = ("corpus.jsonl", "stats.json")  # written beside corpus.txt

_SOURCE_CONFIG: TypeAdapter[SourceConfig] = TypeAdapter(SourceConfig)
_PROGRESS: ContextVar[IngestProgress | None] = ContextVar("mat_ingest_progress", default=None)


# --------------------------------------------------------------------------- progress hook


def current_progress() -> IngestProgress:
    """The progress receiver of the run in this context, or one that ignores everything."""
    return _PROGRESS.get() or NullProgress()


@contextmanager
def reporting_progress(progress: IngestProgress | None) -> Iterator[None]:
    """Send ingest progress events raised in this context (and task threads it starts) to `progress`."""
    token = _PROGRESS.set(progress)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


# --------------------------------------------------------------------------- cache keys


def digest(*parts: Any) -> str:
    """A stable hash of JSON-able parts, tagged with mat's version so upgrades never reuse old results."""
    text = json.dumps([multiagenttrainer.__version__, *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def fetch_cache_key(
    source_cfg: Mapping[str, Any], name: str, github: Mapping[str, Any], staging: str, version: str | None
) -> str | None:
    """The cache key of one fetch; None when the source cannot say what it would fetch.

    The working directory is part of the key because relative paths in a config depend on it.
    """
    if version is None:
        return None
    return "mat-fetch-" + digest(dict(source_cfg), name, dict(github), staging, version, os.getcwd())


def output_fingerprint(corpus_txt: str) -> list[list[Any]] | None:
    """Size and mtime of each corpus output file, or None when one is missing."""
    txt = Path(corpus_txt)
    fingerprint = []
    for path in (txt, *(txt.with_name(name) for name in CORPUS_OUTPUTS)):
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        fingerprint.append([path.name, stat.st_size, stat.st_mtime_ns])
    return fingerprint


def corpus_cache_key(
    snapshots: list[dict[str, Any]], options: Mapping[str, Any], corpus_txt: str
) -> str | None:
    """The cache key of a corpus build; None while its output files are missing.

    The current files' sizes and mtimes are part of the key, so a cached result is only reused
    while the files it describes are exactly the ones on disk.
    """
    fingerprint = output_fingerprint(corpus_txt)
    if fingerprint is None:
        return None
    ordered = sorted(snapshots, key=lambda snapshot: str(snapshot.get("source")))
    return "mat-corpus-" + digest(ordered, dict(options), corpus_txt, fingerprint)


def cached_snapshot_is_gone(store: ResultStore, key: str) -> bool:
    """Whether a snapshot cached under `key` names trees that no longer exist on disk."""
    if not store.exists(key):
        return False
    return not Snapshot.from_dict(store.read(key).result).is_present()


@dataclass
class FetchCachePolicy(CachePolicy):
    """Cache a fetch on the source's config and resolved version, never past its files' deletion."""

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        key = fetch_cache_key(
            inputs["source_cfg"], inputs["name"], inputs["github"], inputs["staging"], inputs["version"]
        )
        if key is None or cached_snapshot_is_gone(task_ctx.result_store, key):
            return None
        return key


@dataclass
class CorpusCachePolicy(CachePolicy):
    """Cache a corpus build on its snapshots, options and output files."""

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        return corpus_cache_key(inputs["snapshots"], inputs["options"], inputs["corpus_txt"])


def retry_if_transient(task: Any, task_run: Any, state: State[Any]) -> bool:
    """Retry only failures that may pass on their own (network errors, 5xx, rate limits)."""
    return isinstance(state.result(raise_on_failure=False), TransientSourceError)


# --------------------------------------------------------------------------- tasks


def source_from_config(
    source_cfg: Mapping[str, Any], name: str, github: Mapping[str, Any], staging: str | None = None
) -> Source:
    """Re-create a source adapter from its JSON config; a missing token may come from a Secret block."""
    cfg = _SOURCE_CONFIG.validate_python(dict(source_cfg))
    env = environment_with_secrets([getattr(cfg, "token_env", None)])
    cache_dir = library.listings_dir(Path(staging)) if staging else None
    return make_source(cfg, name, SourceContext(github=GithubConfig(**github), env=env, cache_dir=cache_dir))


@task(
    name="resolve-source",
    task_run_name="resolve {name}",
    retries=len(RETRY_DELAYS_S),
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=retry_if_transient,
    persist_result=False,
)
def resolve_source(
    source_cfg: dict[str, Any], name: str, github: dict[str, Any], staging: str | None = None
) -> str | None:
    """What the source would fetch now (a commit SHA, a directory's fingerprint), or None when it
    cannot tell cheaply."""
    return source_from_config(source_cfg, name, github, staging).resolve()


@task(
    name="fetch-source",
    task_run_name="fetch {name}",
    cache_policy=FetchCachePolicy(),
    result_serializer="json",
    retries=len(RETRY_DELAYS_S),
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=retry_if_transient,
)
def fetch_source(
    source_cfg: dict[str, Any], name: str, github: dict[str, Any], staging: str, version: str | None
) -> dict[str, Any]:
    """Fetch one source into its staging directory and return its snapshot as a dict."""
    source = source_from_config(source_cfg, name, github, staging)
    return library.fetch_source(source, Path(staging)).to_dict()


@task(name="build-corpus", cache_policy=CorpusCachePolicy(), result_serializer="json")
def build_corpus(snapshots: list[dict[str, Any]], options: dict[str, Any], corpus_txt: str) -> dict[str, Any]:
    """Write corpus.txt, corpus.jsonl and stats.json from the snapshots; return the stats."""
    from multiagenttrainer.corpus import build_corpus as build

    stats: dict[str, Any] = build(
        [Snapshot.from_dict(snapshot) for snapshot in snapshots],
        CorpusConfig(**options),
        Path(corpus_txt),
        progress=current_progress(),
    )
    return stats
