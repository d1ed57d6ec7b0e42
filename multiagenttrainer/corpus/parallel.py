"""Running chunk jobs: in this process, or in forked worker processes that write where they are told.

Either way results come back in corpus order, each with its Placement (what survives dedupe
across chunks, and at which offsets), so the output is the same byte for byte; then one None,
when every chunk is written. Worker processes are stopped and waited for when the run is closed:
the caller can put the outputs in place first (a worker's exit takes milliseconds).

With workers, the parent keeps two jobs queued per worker, places each result as soon as every
earlier chunk has reported, and sends the placement back; the worker writes that chunk's records
straight into the output files (positioned writes: no part files, no copies) between jobs.
Workers are forked, so they start in milliseconds with everything already imported; they run
only the corpus code. Each dies with the thread that forked it (PR_SET_PDEATHSIG): a killed mat
leaves none behind, although each worker holds the pipes of the workers forked before it.

Workers are forked after every job is made, so a job travels as its index into that list.
Messages:  parent -> worker: ("job", index) | ("place", (index, Placement)) | ("stop", None)
           worker -> parent: ("report", ChunkResult) | ("done", None) | ("error", text)
                             | ("disk_full", errno)
Writes are not acknowledged one by one (each message wakes the other process, which costs real
time on a busy machine): after the last placement the parent sends "stop" and waits for "done".
Each message stays well under a socket buffer (chunks hold at most 1,000 files), so neither side
blocks on a send while the other is busy sending.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import suppress
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkContext
from typing import Any

from multiagenttrainer.corpus import accel
from multiagenttrainer.corpus.assemble import Assembly
from multiagenttrainer.corpus.chunks import (
    ChunkJob,
    ChunkOutput,
    ChunkResult,
    Placement,
    run_chunk,
    write_chunk,
)
from multiagenttrainer.errors import CorpusError, is_disk_full
from multiagenttrainer.processes import die_with_parent_hook

Placed = tuple[ChunkResult, Placement]
Step = Placed | None  # None: every chunk is written
JOBS_PER_WORKER = 2
LIVENESS_CHECK_S = 1.0
STOP_TIMEOUT_S = 5.0


def run_in_process(jobs: Iterable[ChunkJob], assembly: Assembly) -> Generator[Step, None, None]:
    """Process, place and write each chunk here, one after another."""
    for job in jobs:
        output = run_chunk(job)
        placement = assembly.place(output.result)
        write_chunk(output, placement, assembly.txt_fd, assembly.jsonl_fd)
        yield output.result, placement
    yield None


def worker_main(
    conn: Connection,
    jobs: Sequence[ChunkJob],
    txt_path: str,
    jsonl_path: str,
    die_with_parent: Callable[[], None] | None = None,
) -> None:
    """A worker's loop: process jobs and report them; write each one when its placement arrives.
    `die_with_parent` (processes.die_with_parent_hook) first: a killed mat leaves no worker behind."""
    if die_with_parent is not None:
        die_with_parent()
    txt_fd = os.open(txt_path, os.O_WRONLY)
    jsonl_fd = os.open(jsonl_path, os.O_WRONLY)
    unplaced: dict[int, ChunkOutput] = {}
    native = accel.encoder()
    if native is not None:
        native.retain_freed_memory()
    try:
        while True:
            kind, payload = conn.recv()
            if kind == "job":
                output = run_chunk(jobs[payload])
                unplaced[payload] = output
                conn.send(("report", output.result))
            elif kind == "place":
                index, placement = payload
                write_chunk(unplaced.pop(index), placement, txt_fd, jsonl_fd)
            else:  # "stop": every placement sent before it is written by now
                conn.send(("done", None))
                return
    except (EOFError, KeyboardInterrupt):
        return  # the parent went away or is being interrupted
    except Exception as exc:  # reported to the parent, which raises a CorpusError (a full disk: itself)
        with suppress(OSError, ValueError):
            if isinstance(exc, OSError) and is_disk_full(exc):
                conn.send(("disk_full", exc.errno))
            else:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        os.close(txt_fd)
        os.close(jsonl_fd)


class Worker:
    """One forked worker process, the parent's end of its pipe, and the jobs it has not reported yet."""

    def __init__(
        self, context: ForkContext, jobs: Sequence[ChunkJob], txt_path: str, jsonl_path: str
    ) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=worker_main,
            args=(child, jobs, txt_path, jsonl_path, die_with_parent_hook()),
            name="mat-corpus-worker",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.outstanding: set[int] = set()

    def send(self, kind: str, payload: Any) -> None:
        self.conn.send((kind, payload))

    def receive(self) -> tuple[str, Any]:
        try:
            message: tuple[str, Any] = self.conn.recv()
        except (EOFError, OSError):
            raise CorpusError(self.death_notice()) from None
        if message[0] == "error":
            raise CorpusError(f"a corpus worker failed: {message[1]}")
        if message[0] == "disk_full":
            raise OSError(message[1], os.strerror(message[1]))
        return message

    def death_notice(self) -> str:
        self.process.join(0.1)
        return (
            f"a corpus worker process died (exit code {self.process.exitcode}), perhaps out of memory; "
            "retry, or build in one process (workers=0)"
        )

    def finish(self) -> None:
        """Ask the worker to stop after its pending writes, and wait until it has done them."""
        self.send("stop", None)
        while True:
            ready = wait([self.conn], timeout=LIVENESS_CHECK_S)
            if ready and self.receive()[0] == "done":
                return
            if not ready and not self.process.is_alive():
                raise CorpusError(self.death_notice())

    def stop(self) -> None:
        with suppress(OSError, ValueError):
            self.send("stop", None)
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()
        self.conn.close()


def run_in_workers(jobs: Sequence[ChunkJob], assembly: Assembly, count: int) -> Generator[Step, None, None]:
    """Process chunks in `count` forked workers; yield each result, placed, in corpus order, then None
    once every chunk is written. The workers are stopped and waited for when the run is closed.

    `jobs[i].index` must be i: workers receive indexes into the list they inherited.
    """
    context = multiprocessing.get_context("fork")
    workers: list[Worker] = []
    try:
        # Objects that exist now are frozen out of the workers' garbage collections: a collection
        # that visited them would copy every page of the parent's heap into the child.
        gc.freeze()
        try:
            workers = [Worker(context, jobs, assembly.txt_path, assembly.jsonl_path) for _ in range(count)]
        finally:
            gc.unfreeze()
        yield from _coordinate(iter(range(len(jobs))), workers, assembly)
        for worker in workers:  # the outputs are complete once every worker has written its chunks
            worker.finish()
        yield None
    finally:
        for worker in workers:
            worker.stop()


def _coordinate(jobs: Iterator[int], workers: list[Worker], assembly: Assembly) -> Iterator[Placed]:
    reports: dict[int, tuple[Worker, ChunkResult]] = {}
    next_index = 0
    more_jobs = True
    while True:
        for worker in workers:
            # A second job waits in the pipe, so a worker never idles while the parent places its last one.
            while more_jobs and len(worker.outstanding) < JOBS_PER_WORKER:
                job = next(jobs, None)
                more_jobs = job is not None
                if job is not None:
                    worker.send("job", job)
                    worker.outstanding.add(job)
        busy = [worker for worker in workers if worker.outstanding]
        if not busy:
            return
        for worker in _ready(busy):
            _, result = worker.receive()  # a report: the chunk is processed and waits for its placement
            reports[result.index] = (worker, result)
            worker.outstanding.discard(result.index)
        while next_index in reports:
            owner, result = reports.pop(next_index)
            placement = assembly.place(result)
            owner.send("place", (next_index, placement))
            yield result, placement
            next_index += 1


def _ready(busy: list[Worker]) -> list[Worker]:
    """The busy workers with a message waiting; raises if one of them has died."""
    while True:
        ready = wait([worker.conn for worker in busy], timeout=LIVENESS_CHECK_S)
        if ready:
            return [worker for worker in busy if worker.conn in ready]
        for worker in busy:
            if not worker.process.is_alive():
                raise CorpusError(worker.death_notice())
