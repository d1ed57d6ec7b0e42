"""The ingest stage, written once: fetch every source, then build one corpus from what was fetched.

    plan = plan_ingest(cfg, repos=["acme/api"])
    summary = run_ingest(plan)                    # plain calls (this module's PlainSteps)
    summary = run_ingest(plan, PrefectSteps())    # each step a Prefect task (flows/ingest.py)

The rules live here and nowhere else:
- every source is resolved (what it would fetch, for cache keys) and fetched as soon as its version is
  known, FETCH_WORKERS at a time; transient failures are retried by SOURCE_RETRY (retry.py);
- a source that fails is recorded with its reason and left out; it never stops the others;
- a source fetched only in part (its snapshot names `failures`, e.g. organisation repositories that
  could not be cloned) keeps what it fetched in the corpus and is recorded as incomplete (`partial`);
- the corpus is built from the sources that worked, in source-name order, so the output does not depend
  on which fetch finished first;
- when any source failed or is incomplete, IngestIncomplete is raised after the corpus is written
  (exit code 1);
- one ingest at a time writes a corpus directory (and its staging): the whole stage holds an exclusive
  lock on `<corpus dir>/.ingest.lock`; a second ingest of the same directory says it is waiting and
  waits (CorpusError after LOCK_WAIT_S);
- every progress event is also logged as the line `mat ingest` prints (progress.LoggedIngestProgress).

Steps are the only thing a caller swaps: `IngestSteps` says what resolving, fetching and building one
thing means (plain calls here, Prefect tasks with caching in tasks/ingest.py). `Ingester` is the library
API (`Ingester(cfg.sources, Path(".staging")).fetch_all()`), a thin wrapper over the same functions.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import fcntl
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from multiagenttrainer.config import Config, CorpusConfig, GithubConfig, SourceConfig, expand_path
from multiagenttrainer.errors import ConfigError, CorpusError, IngestIncomplete, MatError, SourceError
from multiagenttrainer.progress import IngestProgress, LoggedIngestProgress, NullProgress
from multiagenttrainer.retry import SOURCE_RETRY
from multiagenttrainer.snapshot import Snapshot, SourceContext
from multiagenttrainer.sources.base import Source
from multiagenttrainer.sources.registry import make_source, repo_argument_to_source, unique_names

log = logging.getLogger(__name__)

T = TypeVar("T")

FETCH_WORKERS = 4  # clones are network-bound; a few at once
LISTINGS_DIR = ".listings"  # under the staging directory: local_repo's listing snapshots
LOCK_FILE = ".ingest.lock"  # in the corpus directory, held by the ingest writing it
LOCK_WAIT_S = 1800.0  # how long an ingest waits for another one writing the same corpus directory
LOCK_POLL_S = 0.2
NO_SOURCES = (
    "sources: nothing to ingest; add a `sources:` section to the config "
    "(see configs/config.example.yaml) or pass --repo owner/repo"
)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SourceJob:
    """One source to ingest: its validated config and its unique name."""

    name: str
    config: SourceConfig

    @property
    def type(self) -> str:
        return self.config.type


@dataclass(frozen=True)
class IngestPlan:
    """Everything the stage needs: the sources and absolute output paths."""

    jobs: list[SourceJob]
    github: GithubConfig
    staging: Path
    corpus: CorpusConfig  # corpus.dir is absolute

    @property
    def corpus_dir(self) -> Path:
        return Path(self.corpus.dir)

    @property
    def corpus_txt(self) -> Path:
        return self.corpus_dir / "corpus.txt"


def plan_ingest(cfg: Config, repos: Sequence[str] = (), corpus_dir: str | Path | None = None) -> IngestPlan:
    """The sources to ingest (the config's plus --repo ones) and absolute output paths."""
    sources: list[SourceConfig] = [*cfg.sources, *(repo_argument_to_source(r, cfg.github) for r in repos)]
    if not sources:
        raise ConfigError(NO_SOURCES)
    return plan_for_sources(sources, cfg.github, expand_path(cfg.corpus.staging_dir), cfg.corpus, corpus_dir)


def plan_for_sources(
    sources: Iterable[SourceConfig],
    github: GithubConfig,
    staging: Path,
    corpus: CorpusConfig,
    corpus_dir: str | Path | None = None,
) -> IngestPlan:
    """A plan for these sources, with every path made absolute."""
    configs = list(sources)
    out_dir = expand_path(str(corpus_dir or corpus.dir)).resolve()
    return IngestPlan(
        jobs=[SourceJob(n, c) for n, c in zip(unique_names(configs), configs, strict=True)],
        github=github,
        staging=Path(staging).resolve(),
        corpus=corpus.model_copy(update={"dir": str(out_dir)}),
    )


def listings_dir(staging: Path) -> Path:
    """Where local sources keep the listing snapshots that let an unchanged tree skip its walk."""
    return Path(staging) / LISTINGS_DIR


def staging_dir_for(staging: Path, source_name: str) -> Path:
    """The directory a source fetches into: one per source, named after it."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in source_name)
    return Path(staging) / safe


def source_for(job: SourceJob, plan: IngestPlan, env: Mapping[str, str] | None = None) -> Source:
    """The adapter of one job; secrets come from `env` (the process environment by default)."""
    context = SourceContext(github=plan.github, cache_dir=listings_dir(plan.staging))
    if env is not None:
        context = dataclasses.replace(context, env=env)
    return make_source(job.config, job.name, context)


def fetch_source(source: Source, staging: Path) -> Snapshot:
    """Fetch one source into its own staging directory; any failure becomes a SourceError."""
    target = staging_dir_for(staging, source.name)
    try:
        target.mkdir(parents=True, exist_ok=True)
        return source.fetch(target)
    except SourceError:
        raise
    except MatError as exc:
        raise SourceError(source.name, str(exc)) from exc
    except OSError as exc:
        raise SourceError(source.name, f"{exc.strerror or exc} ({exc.filename or target})") from exc


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class Fetched:
    """A fetched source; `cached` when a cache answered and nothing was fetched."""

    snapshot: Snapshot
    cached: bool = False


@dataclass(frozen=True)
class Built:
    """A corpus on disk: its stats and how it came to be (built, reused or cached)."""

    stats: dict[str, Any]
    status: str


class IngestSteps(Protocol):
    """What resolving, fetching and building mean for one caller (plain calls, Prefect tasks)."""

    def resolve(self, job: SourceJob, plan: IngestPlan) -> str | None:
        """What the source would fetch now (for cache keys), or None when that is not worth asking."""
        ...

    def fetch(self, job: SourceJob, plan: IngestPlan, version: str | None) -> Fetched:
        """Fetch one source into the plan's staging directory; raises SourceError."""
        ...

    def build(self, snapshots: list[Snapshot], plan: IngestPlan, progress: IngestProgress) -> Built:
        """Write corpus.txt, corpus.jsonl and stats.json from the snapshots."""
        ...


def build_corpus_files(snapshots: list[Snapshot], corpus: CorpusConfig, progress: IngestProgress) -> Built:
    """Build the corpus in `corpus.dir` (or find the identical one already there)."""
    from multiagenttrainer.corpus import build_corpus

    corpus_txt = Path(corpus.dir) / "corpus.txt"
    stats = build_corpus(snapshots, corpus, corpus_txt, progress=progress)
    return Built(stats, "reused" if stats.get("reused") else "built")


class PlainSteps:
    """Each step a plain call in this process. No cache, so sources are not resolved ahead of a fetch."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = env

    def resolve(self, job: SourceJob, plan: IngestPlan) -> str | None:
        return None

    def fetch(self, job: SourceJob, plan: IngestPlan, version: str | None) -> Fetched:
        source = source_for(job, plan, self.env)
        return Fetched(SOURCE_RETRY.call(lambda: fetch_source(source, plan.staging)))

    def build(self, snapshots: list[Snapshot], plan: IngestPlan, progress: IngestProgress) -> Built:
        return build_corpus_files(snapshots, plan.corpus, progress)


# --------------------------------------------------------------------------- the stage


def in_context(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> Future[T]:
    """Submit `fn` with the caller's context variables (Prefect's run context, progress receivers)."""
    return pool.submit(contextvars.copy_context().run, fn, *args)


def failure_message(error: BaseException) -> str:
    """What to tell the user about a failed source: its reason, or the exception itself."""
    if isinstance(error, SourceError):
        return error.reason
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


@dataclass
class FetchReport:
    """Per-source outcomes of the fetch half of the stage, reported to `progress` as they happen."""

    jobs: list[SourceJob]
    progress: IngestProgress
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)
    errors: list[SourceError] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rows = {j.name: {"name": j.name, "type": j.type, "status": "pending"} for j in self.jobs}

    def failed(self, name: str, error: BaseException) -> None:
        message = failure_message(error)
        log.error("source %r: %s", name, message)
        self.errors.append(error if isinstance(error, SourceError) else SourceError(name, message))
        self.rows[name].update(status="failed", error=message)
        self.progress.source_finished(name, message, cached=False)

    def fetched(self, name: str, outcome: Fetched) -> None:
        self.snapshots.append(outcome.snapshot)
        status = "cached" if outcome.cached else "fetched"
        self.rows[name].update(status=status, version=outcome.snapshot.version)
        incomplete = outcome.snapshot.failure_summary()
        if incomplete is not None:
            self.rows[name].update(status="incomplete", error=incomplete)
        self.progress.source_finished(name, None, cached=outcome.cached)

    def failures(self) -> list[dict[str, Any]]:
        """One entry per failed source, and per source fetched only in part (`partial`: true)."""
        return [
            {
                "source": r["name"],
                "error": r["error"],
                **({"partial": True} if r["status"] == "incomplete" else {}),
            }
            for r in self.rows.values()
            if r["status"] in ("failed", "incomplete")
        ]

    def ordered_snapshots(self) -> list[Snapshot]:
        """The snapshots in source-name order, whatever order the fetches finished in."""
        return sorted(self.snapshots, key=lambda snapshot: snapshot.source)


def resolve_then_fetch(steps: IngestSteps, job: SourceJob, plan: IngestPlan) -> Fetched:
    """One source: resolve, then fetch with the version it resolved to."""
    return steps.fetch(job, plan, steps.resolve(job, plan))


def fetch_sources(
    plan: IngestPlan, steps: IngestSteps, progress: IngestProgress | None = None
) -> FetchReport:
    """Fetch every source of the plan, FETCH_WORKERS at once; failures are recorded, not raised."""
    report = FetchReport(plan.jobs, progress or NullProgress())
    with ThreadPoolExecutor(max_workers=FETCH_WORKERS, thread_name_prefix="mat-fetch") as pool:
        pending: dict[Future[Fetched], str] = {}
        for job in plan.jobs:
            report.progress.source_started(job.name)
            pending[in_context(pool, resolve_then_fetch, steps, job, plan)] = job.name
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                name = pending.pop(future)
                error = future.exception()
                if error is None:
                    report.fetched(name, future.result())
                elif isinstance(error, Exception):
                    report.failed(name, error)
                else:
                    raise error  # KeyboardInterrupt and the like end the stage
    return report


def ingest_summary(plan: IngestPlan, report: FetchReport, built: Built | None) -> dict[str, Any]:
    """What the stage returns (and IngestIncomplete carries): outputs, per-source rows, failures,
    and the snapshots the corpus was built from (their trees are where later stages find LICENSE files)."""
    return {
        "corpus_dir": str(plan.corpus_dir),
        "corpus_txt": str(plan.corpus_txt),
        "corpus_status": built.status if built else "not built",
        "stats": built.stats if built else None,
        "failures": report.failures(),
        "sources": list(report.rows.values()),
        "snapshots": [snapshot.to_dict() for snapshot in report.ordered_snapshots()],
    }


def lock_holder(handle: Any) -> str:
    """Who holds a corpus lock, as its holder wrote it (`pid 123 on host`)."""
    handle.seek(0)
    return handle.read(200).strip() or "another process"


def try_lock(handle: Any) -> bool:
    """Take the exclusive lock on an open file without waiting; whether it was taken."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def corpus_lock(corpus_dir: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the corpus directory's ingest lock; while another ingest holds it, say so and wait."""
    corpus_dir.mkdir(parents=True, exist_ok=True)
    with open(corpus_dir / LOCK_FILE, "a+", encoding="utf-8") as handle:
        if not try_lock(handle):
            holder = lock_holder(handle)
            log.warning("another ingest (%s) is writing %s; waiting for it to finish", holder, corpus_dir)
            deadline = time.monotonic() + wait_s
            while not try_lock(handle):
                if time.monotonic() > deadline:
                    raise CorpusError(
                        f"{corpus_dir} is still being written by another ingest ({holder}) after "
                        f"{wait_s:.0f} s; wait for it to finish (or stop it), then run the command again"
                    )
                time.sleep(LOCK_POLL_S)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_ingest(
    plan: IngestPlan, steps: IngestSteps | None = None, progress: IngestProgress | None = None
) -> dict[str, Any]:
    """The whole stage: fetch every source, build the corpus from those that worked, then judge.

    Returns the summary; raises IngestIncomplete (carrying the same summary) when a source failed.
    """
    steps = steps or PlainSteps()
    progress = LoggedIngestProgress(progress or NullProgress())
    with corpus_lock(plan.corpus_dir):
        report = fetch_sources(plan, steps, progress)
        built = steps.build(report.ordered_snapshots(), plan, progress) if report.snapshots else None
    summary = ingest_summary(plan, report, built)
    if summary["failures"]:
        raise IngestIncomplete(summary)
    return summary


# --------------------------------------------------------------------------- the library API


@dataclass
class IngestResult:
    """What an ingest produced: snapshots of the sources that worked, errors of those that did not."""

    snapshots: list[Snapshot] = field(default_factory=list)
    failures: list[SourceError] = field(default_factory=list)


class Ingester:
    """Fetch sources into a staging directory and build a corpus from them (the library API).

    >>> ingester = Ingester(cfg.sources, Path(".staging"))
    >>> ingester.fetch_all()
    >>> ingester.build_corpus(Path("corpus/corpus.txt"))
    """

    def __init__(
        self,
        sources: Iterable[SourceConfig],
        staging: Path,
        *,
        github: GithubConfig | None = None,
        corpus: CorpusConfig | None = None,
        context: SourceContext | None = None,
    ) -> None:
        github = github or (context.github if context else GithubConfig())
        self.plan = plan_for_sources(sources, github, Path(staging), corpus or CorpusConfig())
        self.steps = PlainSteps(env=context.env if context else None)
        self.result = IngestResult()

    @property
    def snapshots(self) -> list[Snapshot]:
        return self.result.snapshots

    @property
    def failures(self) -> list[SourceError]:
        return self.result.failures

    def fetch_all(self, progress: IngestProgress | None = None) -> IngestResult:
        """Fetch every source (a few in parallel); failures are collected, not raised."""
        report = fetch_sources(self.plan, self.steps, progress)
        self.result = IngestResult(report.ordered_snapshots(), report.errors)
        return self.result

    def build_corpus(self, corpus_path: Path, progress: IngestProgress | None = None) -> dict[str, Any]:
        """Write corpus.txt at `corpus_path` and corpus.jsonl and stats.json beside it; return the stats."""
        from multiagenttrainer.corpus import build_corpus

        progress = progress or NullProgress()
        return build_corpus(self.snapshots, self.plan.corpus, Path(corpus_path), progress=progress)
