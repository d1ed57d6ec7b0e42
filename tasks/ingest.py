"""Prefect steps of the ingest stage: resolve a source, fetch it, build the corpus.

The stage itself (order, concurrency, failure rules) is `multiagenttrainer.ingest.run_ingest`; this
module only supplies its steps as Prefect tasks (`PrefectSteps`), so each step is a task run in the UI
with caching and the stage's one retry policy. Two custom cache policies make re-runs cheap without ever
handing back something that is gone from disk:

- fetch: keyed on the source's config, name, resolved version (commit SHA) and staging path; no
  key when the version is unknown, when the cached snapshot's trees no longer exist, or when it
  is incomplete (some repositories failed: the next run tries them again).
- corpus: keyed on every snapshot, the corpus options, the output path and the current output
  files' sizes and mtimes; no key while an output file is missing.

Progress events go to the object installed with `reporting_progress` (a context variable copied into
the stage's worker threads); progress never enters a task's inputs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import CachePolicy
from prefect.client.schemas.objects import State
from prefect.context import TaskRunContext
from prefect.results import ResultStore
from pydantic import BaseModel, TypeAdapter

import multiagenttrainer
from blocks.secrets import environment_with_secrets
from multiagenttrainer import ingest as stage
from multiagenttrainer.config import CorpusConfig, GithubConfig, SourceConfig
from multiagenttrainer.progress import IngestProgress, NullProgress
from multiagenttrainer.retry import SOURCE_RETRY
from multiagenttrainer.snapshot import Snapshot, SourceContext
from multiagenttrainer.sources.base import Source
from multiagenttrainer.sources.registry import make_source
from tasks import ProgressSlot

CORPUS_OUTPUTS = ("corpus.jsonl", "stats.json")  # written beside corpus.txt

PROGRESS: ProgressSlot[IngestProgress] = ProgressSlot("mat_ingest_progress", NullProgress)


# --------------------------------------------------------------------------- cache keys


def digest(*parts: Any) -> str:
    """A stable hash of JSON-able parts, tagged with mat's version so upgrades never reuse old results."""
    text = json.dumps([multiagenttrainer.__version__, *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def as_json(value: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """A config section (a model, or its JSON form) as JSON data for a cache key."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else dict(value)


def fetch_cache_key(
    source_cfg: SourceConfig | Mapping[str, Any],
    name: str,
    github: GithubConfig | Mapping[str, Any],
    staging: str,
    version: str | None,
) -> str | None:
    """The cache key of one fetch; None when the source cannot say what it would fetch.

    The working directory is not part of it: the version names what is fetched (a local directory's
    version includes its absolute path) and `staging` (absolute) where it goes, so a deployment's flow run
    working in a fresh clone of the project reuses what `mat ingest` fetched in the checkout.
    """
    if version is None:
        return None
    return "mat-fetch-" + digest(as_json(source_cfg), name, as_json(github), staging, version)


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
    snapshots: list[dict[str, Any]], options: CorpusConfig | Mapping[str, Any], corpus_txt: str
) -> str | None:
    """The cache key of a corpus build; None while its output files are missing.

    The current files' sizes and mtimes are part of the key, so a cached result is only reused
    while the files it describes are exactly the ones on disk.
    """
    fingerprint = output_fingerprint(corpus_txt)
    if fingerprint is None:
        return None
    ordered = sorted(snapshots, key=lambda snapshot: str(snapshot.get("source")))
    return "mat-corpus-" + digest(ordered, as_json(options), corpus_txt, fingerprint)


def cached_snapshot_is_gone(store: ResultStore, key: str) -> bool:
    """Whether a snapshot cached under `key` names trees that no longer exist on disk, or lacks some."""
    if not store.exists(key):
        return False
    snapshot = Snapshot.from_dict(store.read(key).result)
    return not snapshot.is_present() or bool(snapshot.failures)


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
    """Prefect's side of SOURCE_RETRY: retry only failures that may pass on their own."""
    return SOURCE_RETRY.should_retry(state.result(raise_on_failure=False))


# --------------------------------------------------------------------------- tasks


_SOURCE_CONFIG: TypeAdapter[SourceConfig] = TypeAdapter(SourceConfig)


def source_from_config(
    source_cfg: SourceConfig | Mapping[str, Any],
    name: str,
    github: GithubConfig | Mapping[str, Any],
    staging: str | None,
) -> Source:
    """The source adapter (from the config model, or its JSON form when a task is called with JSON);
    a token missing from the environment may come from a Secret block."""
    if isinstance(source_cfg, Mapping):
        source_cfg = _SOURCE_CONFIG.validate_python(dict(source_cfg))
    if isinstance(github, Mapping):
        github = GithubConfig.model_validate(dict(github))
    env = environment_with_secrets([getattr(source_cfg, "token_env", None)])
    cache_dir = stage.listings_dir(Path(staging)) if staging else None
    return make_source(source_cfg, name, SourceContext(github=github, env=env, cache_dir=cache_dir))


@task(
    name="resolve-source",
    task_run_name="resolve {name}",
    retries=SOURCE_RETRY.retries,
    retry_delay_seconds=list(SOURCE_RETRY.delays_s),
    retry_condition_fn=retry_if_transient,
    persist_result=False,
)
def resolve_source(
    source_cfg: SourceConfig | Mapping[str, Any],
    name: str,
    github: GithubConfig | Mapping[str, Any],
    staging: str | None = None,
) -> str | None:
    """What the source would fetch now (a commit SHA, a directory's fingerprint), or None when it
    cannot tell cheaply."""
    return source_from_config(source_cfg, name, github, staging).resolve()


@task(
    name="fetch-source",
    task_run_name="fetch {name}",
    cache_policy=FetchCachePolicy(),
    result_serializer="json",
    retries=SOURCE_RETRY.retries,
    retry_delay_seconds=list(SOURCE_RETRY.delays_s),
    retry_condition_fn=retry_if_transient,
)
def fetch_source(
    source_cfg: SourceConfig | Mapping[str, Any],
    name: str,
    github: GithubConfig | Mapping[str, Any],
    staging: str,
    version: str | None,
) -> dict[str, Any]:
    """Fetch one source into its staging directory and return its snapshot as a dict."""
    source = source_from_config(source_cfg, name, github, staging)
    return stage.fetch_source(source, Path(staging)).to_dict()


@task(name="build-corpus", cache_policy=CorpusCachePolicy(), result_serializer="json")
def build_corpus(snapshots: list[dict[str, Any]], options: CorpusConfig, corpus_txt: str) -> dict[str, Any]:
    """Write corpus.txt, corpus.jsonl and stats.json from the snapshots; return the stats."""
    built = stage.build_corpus_files([Snapshot.from_dict(s) for s in snapshots], options, PROGRESS.current())
    return built.stats


# --------------------------------------------------------------------------- the stage's steps


class PrefectSteps:
    """The ingest stage's steps as Prefect tasks: cached, retried, visible as task runs."""

    def resolve(self, job: stage.SourceJob, plan: stage.IngestPlan) -> str | None:
        version: str | None = resolve_source(job.config, job.name, plan.github, str(plan.staging))
        return version

    def fetch(self, job: stage.SourceJob, plan: stage.IngestPlan, version: str | None) -> stage.Fetched:
        state = fetch_source(job.config, job.name, plan.github, str(plan.staging), version, return_state=True)
        snapshot = Snapshot.from_dict(state.result())
        return stage.Fetched(snapshot, cached=state.name == "Cached")

    def build(
        self, snapshots: list[Snapshot], plan: stage.IngestPlan, progress: IngestProgress
    ) -> stage.Built:
        dicts = [s.to_dict() for s in snapshots]
        with PROGRESS.reporting(progress):
            state = build_corpus(dicts, plan.corpus, str(plan.corpus_txt), return_state=True)
        stats: dict[str, Any] = state.result()
        if state.name != "Cached":
            return stage.Built(stats, "reused" if stats.get("reused") else "built")
        progress.corpus_started(stats.get("files"))  # the builder did not run: report for it
        progress.corpus_finished(reused=True)
        return stage.Built({**stats, "reused": True}, "cached")
