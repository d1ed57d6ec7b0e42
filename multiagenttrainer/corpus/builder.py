"""build_corpus: snapshots in, corpus.txt + corpus.jsonl + stats.json out.

The build is skipped when stats.json beside the target already records the same fingerprint
(snapshot versions and trees, corpus options, format version, the redaction rules) and both
corpus files are there with the sizes it records: a second `mat ingest` with nothing changed
costs a file read.

Otherwise the plan (plan.py) is cut into chunks of about 1 MB that worker processes turn into
corpus bytes (chunks.py, parallel.py; directory trees in spans they plan themselves) and write
where this process places them, in corpus order (assemble.py). The same inputs give
byte-identical corpus files for any number of workers, with or without the native accelerators.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import xxhash

from multiagenttrainer.config import CorpusConfig
from multiagenttrainer.corpus import accel
from multiagenttrainer.corpus.assemble import Assembly, CorpusPaths
from multiagenttrainer.corpus.chunks import ChunkJob, ChunkSettings
from multiagenttrainer.corpus.collector import garbage_collection_paused
from multiagenttrainer.corpus.parallel import run_in_process, run_in_workers
from multiagenttrainer.corpus.plan import CHUNK_BYTES, CorpusPlan, plan_corpus
from multiagenttrainer.corpus.secrets import RULESET_DIGEST
from multiagenttrainer.corpus.stats import CorpusStats
from multiagenttrainer.errors import CorpusError, disk_full_error, is_disk_full
from multiagenttrainer.progress import IngestProgress, NullProgress
from multiagenttrainer.snapshot import Snapshot

# Bump whenever the corpus content for the same inputs changes (rules, formats), so old corpora are rebuilt.
CORPUS_FORMAT = 2  # 2: the split hash is SHA-1 (computed natively too), no longer xxh3
PARALLEL_MIN_BYTES = 16 << 20  # below this, worker processes cost more than they save
MAX_WORKERS = 4


def build_corpus(
    snapshots: list[Snapshot],
    options: CorpusConfig,
    corpus_txt: Path,
    progress: IngestProgress | None = None,
    *,
    workers: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> dict[str, Any]:
    """Write corpus_txt and, beside it, corpus.jsonl and stats.json; return the stats.

    `workers`: processes to use (0: none, everything in this process); by default one per core,
    up to 4, when the corpus is large enough to gain from them. `chunk_bytes`: the work unit.
    """
    progress = progress or NullProgress()
    paths = CorpusPaths.beside(Path(corpus_txt))
    fingerprint = corpus_fingerprint(snapshots, options, paths)
    previous = reusable_stats(paths, fingerprint)
    if previous is not None:
        progress.corpus_started(previous.get("files"))
        progress.corpus_finished(True)
        return previous
    started = time.perf_counter()
    with garbage_collection_paused():
        plan = plan_corpus(snapshots, options)
        progress.corpus_started(plan.files())
        stats = CorpusStats(plan, snapshots)
        processes = choose_workers(plan, workers)
        with disk_full_named(paths, plan), Assembly(paths, options.dedupe) as assembly:
            assembly.reserve(*expected_output_bytes(plan))
            jobs = list(make_jobs(plan, options, chunk_bytes))
            run = run_in_workers(jobs, assembly, processes) if processes else run_in_process(jobs, assembly)
            with closing(run) as steps:  # workers stop before the work directory goes, on any error too
                for step in steps:
                    if step is None:  # every chunk is written: in place, then the workers are waited for
                        break
                    result, placement = step
                    stats.add_chunk(result, placement.keep)
                    progress.corpus_advanced(result.files, result.bytes_read)
                else:
                    raise CorpusError("the corpus run ended before every chunk was written")
                summary = stats.summary(
                    fingerprint=fingerprint,
                    format=CORPUS_FORMAT,
                    paths=paths.as_dict(),
                    output_bytes=dict(assembly.sizes),
                    workers=processes,
                    native=accel.encoder() is not None,
                    build_seconds=round(time.perf_counter() - started, 3),
                )
                assembly.commit(summary)
        progress.corpus_finished(False)
        return summary


@contextmanager
def disk_full_named(paths: CorpusPaths, plan: CorpusPlan) -> Iterator[None]:
    """A full file system while the corpus is written becomes one DiskFullError naming the corpus
    directory and the space the build needs (the old corpus, if any, is left as it was)."""
    try:
        yield
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        needed = sum(expected_output_bytes(plan))
        raise disk_full_error(exc, paths.txt.parent, needed, "build the corpus again") from None


def expected_output_bytes(plan: CorpusPlan) -> tuple[int, int]:
    """Generous estimates of corpus.txt and corpus.jsonl from the plan (a header line per file;
    JSON escapes and fields), for reserving disk blocks; what is not used is given back."""
    planned, files = plan.planned_bytes(), plan.files()
    return planned + 128 * files, planned + planned // 4 + 256 * files


def corpus_fingerprint(snapshots: list[Snapshot], options: CorpusConfig, paths: CorpusPaths) -> str:
    """A hash of everything the corpus content depends on."""
    payload = {
        "format": CORPUS_FORMAT,
        "redaction": RULESET_DIGEST if options.redact_secrets else None,  # new rules: rebuild
        "options": options.model_dump(mode="json", exclude={"dir", "staging_dir"}),
        "snapshots": [
            {
                "source": s.source,
                "type": s.type,
                "version": s.version,
                "trees": [asdict(t) for t in s.trees],
                "include": s.include,
                "exclude": s.exclude,
            }
            for s in snapshots
        ],
        "txt_name": paths.txt.name,
    }
    return xxhash.xxh3_128_hexdigest(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS))


def reusable_stats(paths: CorpusPaths, fingerprint: str) -> dict[str, Any] | None:
    """The stats of an existing corpus built from the same inputs, or None when it must be built."""
    try:
        stats = orjson.loads(paths.stats.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(stats, dict) or stats.get("fingerprint") != fingerprint:
        return None
    sizes = stats.get("output_bytes") or {}
    for key, path in (("txt", paths.txt), ("jsonl", paths.jsonl)):
        try:
            if path.stat().st_size != sizes.get(key):
                return None
        except OSError:
            return None
    return {**stats, "reused": True}


def chunk_settings(options: CorpusConfig) -> ChunkSettings:
    return ChunkSettings(
        max_file_bytes=options.max_file_bytes,
        dedupe=options.dedupe,
        redact=options.redact_secrets,
        val_fraction=options.val_fraction,
        skip_generated=options.skip_generated,
        native=accel.encoder() is not None,
    )


def make_jobs(plan: CorpusPlan, options: CorpusConfig, chunk_bytes: int = CHUNK_BYTES) -> Iterator[ChunkJob]:
    """The plan as chunk jobs, in corpus order."""
    settings = chunk_settings(options)
    trees = tuple(plan.trees)
    for index, items in enumerate(plan.chunks(chunk_bytes)):
        yield ChunkJob(index, trees, items, settings)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def can_fork_workers() -> bool:
    """Worker processes are forked (cheap, nothing to re-import); only where fork is dependable."""
    return sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


def choose_workers(plan: CorpusPlan, requested: int | None) -> int:
    """How many worker processes to use; 0 means everything runs in this process."""
    if not can_fork_workers():
        return 0
    if requested is not None:
        return max(0, requested)
    if plan.planned_bytes() < PARALLEL_MIN_BYTES or usable_cores() < 2:
        return 0
    return min(usable_cores(), MAX_WORKERS)
