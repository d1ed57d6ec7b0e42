"""The Ingester: fetch every configured source, then build one corpus from what was fetched.

A failing source does not stop the others: its SourceError is kept in `failures` and the corpus
is built from the sources that succeeded.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiagenttrainer.config import CorpusConfig, GithubConfig, SourceConfig
from multiagenttrainer.errors import MatError, SourceError
from multiagenttrainer.sources import Snapshot, Source, SourceContext, make_sources

log = logging.getLogger(__name__)

FETCH_WORKERS = 4  # clones are network-bound; a few at once
LISTINGS_DIR = ".listings"  # under the staging directory: local_repo's listing snapshots


def listings_dir(staging: Path) -> Path:
    """Where local sources keep the listing snapshots that let an unchanged tree skip its walk."""
    return Path(staging) / LISTINGS_DIR


@dataclass
class IngestResult:
    """What an ingest produced: snapshots of the sources that worked, errors of those that did not."""

    snapshots: list[Snapshot] = field(default_factory=list)
    failures: list[SourceError] = field(default_factory=list)


def staging_dir_for(staging: Path, source_name: str) -> Path:
    """The directory a source fetches into: one per source, named after it."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in source_name)
    return staging / safe


def fetch_source(source: Source, staging: Path) -> Snapshot:
    """Fetch one source into its own staging directory; any failure becomes a SourceError."""
    target = staging_dir_for(staging, source.name)
    target.mkdir(parents=True, exist_ok=True)
    try:
        return source.fetch(target)
    except SourceError:
        raise
    except MatError as exc:
        raise SourceError(source.name, str(exc)) from exc
    except OSError as exc:
        raise SourceError(source.name, f"{exc.strerror or exc} ({exc.filename or target})") from exc


class Ingester:
    """Fetch sources into a staging directory and build a corpus from them.

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
        self.staging = Path(staging)
        context = context or SourceContext(github=github or GithubConfig())
        if context.cache_dir is None:
            context = dataclasses.replace(context, cache_dir=listings_dir(self.staging))
        self.context = context
        self.sources = make_sources(list(sources), self.context)
        self.corpus_options = corpus or CorpusConfig()
        self.result = IngestResult()

    @property
    def snapshots(self) -> list[Snapshot]:
        return self.result.snapshots

    @property
    def failures(self) -> list[SourceError]:
        return self.result.failures

    def fetch_all(self, on_done: Callable[[str, SourceError | None], None] | None = None) -> IngestResult:
        """Fetch every source (a few in parallel); failures are collected, not raised."""
        self.result = IngestResult()
        with ThreadPoolExecutor(max_workers=FETCH_WORKERS) as pool:
            futures = [(s, pool.submit(fetch_source, s, self.staging)) for s in self.sources]
            for source, future in futures:
                try:
                    self.result.snapshots.append(future.result())
                    error = None
                except SourceError as exc:
                    log.error("%s", exc)
                    self.result.failures.append(exc)
                    error = exc
                if on_done:
                    on_done(source.name, error)
        return self.result

    def build_corpus(self, corpus_path: Path, progress: Any = None) -> dict[str, Any]:
        """Write corpus.txt at `corpus_path` and corpus.jsonl and stats.json beside it; return the stats."""
        from multiagenttrainer.corpus import build_corpus

        return build_corpus(self.snapshots, self.corpus_options, Path(corpus_path), progress=progress)
