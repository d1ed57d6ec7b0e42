"""The `ingest` flow: resolve and fetch every source concurrently, then build one corpus.

A source that fails is reported by name and left out; the corpus is built from the others and the
flow then fails with IngestIncomplete, so the run is red in the UI and `mat ingest` exits 1.
Re-running on unchanged sources fetches nothing: fetch and corpus tasks are cached (tasks/ingest.py).

`run_ingest` is what the CLI calls: it runs the flow in this process and delivers live progress
events to the caller's progress object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.futures import PrefectFuture, as_completed
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.task_runners import ThreadPoolTaskRunner

from multiagenttrainer.config import Config, SourceConfig, expand_path, load_config
from multiagenttrainer.errors import ConfigError, IngestIncomplete, SourceError
from multiagenttrainer.ingest import FETCH_WORKERS
from multiagenttrainer.progress import IngestProgress
from multiagenttrainer.sources.registry import repo_argument_to_source, unique_names
from tasks.ingest import build_corpus, current_progress, fetch_source, reporting_progress, resolve_source

NO_SOURCES = (
    "no sources to ingest: add a `sources:` section to the config "
    "(see configs/config.example.yaml) or pass --repo owner/repo"
)


@dataclass(frozen=True)
class SourceJob:
    """One source as the tasks receive it: JSON config plus its unique name."""

    name: str
    type: str
    config: dict[str, Any]


@dataclass(frozen=True)
class IngestPlan:
    """Everything the flow needs, as plain JSON-able values."""

    jobs: list[SourceJob]
    github: dict[str, Any]
    staging: str
    corpus_dir: str
    corpus_options: dict[str, Any]

    @property
    def corpus_txt(self) -> str:
        return str(Path(self.corpus_dir) / "corpus.txt")


def plan_ingest(cfg: Config, repos: Sequence[str], corpus_dir: str | None) -> IngestPlan:
    """The sources to ingest (config plus --repo) and absolute output paths."""
    sources: list[SourceConfig] = [*cfg.sources, *(repo_argument_to_source(r, cfg.github) for r in repos)]
    if not sources:
        raise ConfigError(NO_SOURCES)
    names = unique_names(sources)
    out_dir = expand_path(corpus_dir or cfg.corpus.dir).resolve()
    return IngestPlan(
        jobs=[SourceJob(n, s.type, s.model_dump(mode="json")) for n, s in zip(names, sources, strict=True)],
        github=cfg.github.model_dump(mode="json"),
        staging=str(expand_path(cfg.corpus.staging_dir).resolve()),
        corpus_dir=str(out_dir),
        corpus_options=cfg.corpus.model_copy(update={"dir": str(out_dir)}).model_dump(mode="json"),
    )


def failure_message(error: BaseException) -> str:
    """What to tell the user about a failed task: the source's reason, or the exception itself."""
    if isinstance(error, SourceError):
        return error.reason
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def future_error(future: PrefectFuture[Any]) -> BaseException | None:
    """The exception a finished task failed with, or None when it completed."""
    future.wait()  # records the final state; `state` would otherwise ask the API
    state = future.state
    if state.is_completed():
        return None
    outcome = state.result(raise_on_failure=False)
    return outcome if isinstance(outcome, BaseException) else RuntimeError(state.message or state.name)


class SourceLedger:
    """Per-source outcomes, reported to the progress receiver as they happen."""

    def __init__(self, jobs: list[SourceJob], progress: IngestProgress) -> None:
        self.rows: dict[str, dict[str, Any]] = {
            job.name: {"name": job.name, "type": job.type, "status": "pending"} for job in jobs
        }
        self.snapshots: list[dict[str, Any]] = []
        self.progress = progress

    def failed(self, name: str, error: BaseException) -> None:
        message = failure_message(error)
        self.rows[name].update(status="failed", error=message)
        self.progress.source_finished(name, message, cached=False)

    def fetched(self, name: str, snapshot: dict[str, Any], cached: bool) -> None:
        self.snapshots.append(snapshot)
        self.rows[name].update(status="cached" if cached else "fetched", version=snapshot.get("version"))
        self.progress.source_finished(name, None, cached=cached)

    def failures(self) -> list[dict[str, str]]:
        return [
            {"source": r["name"], "error": r["error"]} for r in self.rows.values() if r["status"] == "failed"
        ]


def fetch_all(plan: IngestPlan, ledger: SourceLedger) -> None:
    """Resolve every source, fetch each as soon as its version is known, and record the outcomes."""
    names: dict[PrefectFuture[Any], str] = {}
    for job in plan.jobs:
        ledger.progress.source_started(job.name)
        names[resolve_source.submit(job.config, job.name, plan.github, plan.staging)] = job.name
    jobs = {job.name: job for job in plan.jobs}
    fetches: dict[PrefectFuture[Any], str] = {}
    for future in as_completed(list(names)):
        name = names[future]
        if (error := future_error(future)) is not None:
            ledger.failed(name, error)
            continue
        job = jobs[name]
        fetch = fetch_source.submit(job.config, name, plan.github, plan.staging, future.result())
        fetches[fetch] = name
    for future in as_completed(list(fetches)):
        if (error := future_error(future)) is not None:
            ledger.failed(fetches[future], error)
        else:
            ledger.fetched(fetches[future], future.result(), cached=future.state.name == "Cached")


def build_from(plan: IngestPlan, ledger: SourceLedger) -> tuple[dict[str, Any], str]:
    """Build the corpus from the fetched snapshots; returns its stats and built|reused|cached.

    "reused": the builder found an identical corpus on disk; "cached": Prefect's cache answered
    and the builder did not run at all.
    """
    snapshots = sorted(ledger.snapshots, key=lambda snapshot: str(snapshot["source"]))
    state = build_corpus(snapshots, plan.corpus_options, plan.corpus_txt, return_state=True)
    stats: dict[str, Any] = state.result()
    if state.name != "Cached":
        return stats, "reused" if stats.get("reused") else "built"
    ledger.progress.corpus_started(stats.get("files"))  # the builder did not run: report for it
    ledger.progress.corpus_finished(reused=True)
    return {**stats, "reused": True}, "cached"


@flow(
    name="ingest",
    task_runner=ThreadPoolTaskRunner(max_workers=FETCH_WORKERS),  # type: ignore[arg-type]  # invariant generic
)
def ingest(
    config_path: str | None = None, repos: list[str] | None = None, corpus_dir: str | None = None
) -> dict[str, Any]:
    """Fetch every configured source (plus --repo ones) and build the corpus; summary of what happened."""
    plan = plan_ingest(load_config(config_path), repos or [], corpus_dir)
    ledger = SourceLedger(plan.jobs, current_progress())
    fetch_all(plan, ledger)
    stats, corpus_status = build_from(plan, ledger) if ledger.snapshots else (None, "not built")
    summary = {
        "corpus_dir": plan.corpus_dir,
        "corpus_txt": plan.corpus_txt,
        "corpus_status": corpus_status,
        "stats": stats,
        "failures": ledger.failures(),
        "sources": list(ledger.rows.values()),
    }
    if summary["failures"]:
        raise IngestIncomplete(summary)
    return summary


@contextmanager
def in_process_settings() -> Iterator[None]:
    """Prefect settings for a short run inside the CLI process.

    Flow heartbeats are off: they only help a server notice a crashed worker-launched run, and
    stopping the heartbeat thread costs up to a second at the end of every run.
    """
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def run_ingest(
    config_path: str | Path | None = None,
    repos: Sequence[str] | None = None,
    corpus_dir: str | Path | None = None,
    progress: IngestProgress | None = None,
) -> dict[str, Any]:
    """Run the ingest flow here with live progress; raises IngestIncomplete or ConfigError."""
    with reporting_progress(progress), in_process_settings():
        summary: dict[str, Any] = ingest(
            config_path=str(config_path) if config_path is not None else None,
            repos=list(repos) if repos else None,
            corpus_dir=str(corpus_dir) if corpus_dir is not None else None,
        )
    return summary
