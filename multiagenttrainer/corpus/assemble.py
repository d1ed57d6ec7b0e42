"""Where each chunk's records go in corpus.txt and corpus.jsonl, and putting the outputs in place atomically.

Both files are written in a private work directory beside the outputs. Chunks are placed in
corpus order: records whose SHA an earlier chunk already kept are dropped, the rest get the next
offsets in each file, and whoever holds the chunk's bytes writes them there (positioned writes,
so worker processes write side by side without copies). On success the two files are renamed
over the old ones and stats.json is written last: a reader that finds a stats.json therefore
finds the files it describes.

Where the native code is built and the disk has room to spare, disk blocks for the expected sizes
are reserved up front (`reserve`): writing into reserved blocks costs the kernel about a third less
than its delayed allocation, a tenth of a whole build. The files' sizes are only ever what was
written; blocks reserved past the end are given back at commit. A build holds a lock on its work
directory; the next build in that directory removes work directories whose build is gone (killed),
so a killed build's reserved blocks do not stay taken.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from multiagenttrainer.atomic import write_bytes_atomically
from multiagenttrainer.corpus import accel
from multiagenttrainer.corpus.chunks import ChunkResult, Placement
from multiagenttrainer.errors import CorpusError


@dataclass(frozen=True)
class CorpusPaths:
    """corpus.txt where the caller wants it, corpus.jsonl and stats.json beside it."""

    txt: Path
    jsonl: Path
    stats: Path

    @classmethod
    def beside(cls, corpus_txt: Path) -> CorpusPaths:
        directory = corpus_txt.absolute().parent
        return cls(corpus_txt.absolute(), directory / "corpus.jsonl", directory / "stats.json")

    def as_dict(self) -> dict[str, str]:
        return {"txt": str(self.txt), "jsonl": str(self.jsonl), "stats": str(self.stats)}


WORK_PREFIX = ".corpus-build-"
ABANDONED_AFTER_S = 60  # a younger work directory may belong to a build that has not locked it yet


def lock_directory(directory: Path, blocking: bool) -> int:
    """A descriptor of directory holding an exclusive lock on it (BlockingIOError when taken and not
    blocking); closing the descriptor, or the end of every process holding it, releases the lock."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_abandoned_builds(directory: Path) -> None:
    """Remove the work directories of builds that are gone (killed): unlocked and over a minute old."""
    for work in directory.glob(WORK_PREFIX + "*"):
        try:
            if time.time() - work.lstat().st_mtime < ABANDONED_AFTER_S:
                continue
            fd = lock_directory(work, blocking=False)
        except OSError:  # in use (locked), gone meanwhile, or not a directory: left alone
            continue
        try:
            shutil.rmtree(work, ignore_errors=True)
        finally:
            os.close(fd)


class Assembly:
    """One build's output in progress; a context manager that removes its work directory."""

    def __init__(self, paths: CorpusPaths, dedupe: bool) -> None:
        self.paths = paths
        self.dedupe = dedupe
        self.seen: set[bytes] = set()
        self.sizes = {"txt": 0, "jsonl": 0}
        try:
            paths.txt.parent.mkdir(parents=True, exist_ok=True)
            remove_abandoned_builds(paths.txt.parent)
            self.work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=paths.txt.parent))
            self.owner = lock_directory(self.work, blocking=True)
        except OSError as exc:
            raise CorpusError(
                f"cannot write the corpus to {paths.txt.parent}: {exc.strerror}; "
                "choose another corpus.dir or --corpus-dir"
            ) from exc
        self.txt_path = str(self.work / "corpus.txt")
        self.jsonl_path = str(self.work / "corpus.jsonl")
        self.txt_fd = os.open(self.txt_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.jsonl_fd = os.open(self.jsonl_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.closed = False
        self.reserved = False

    def reserve(self, txt_bytes: int, jsonl_bytes: int) -> bool:
        """Reserve disk blocks for this many bytes of each output, when the native code can and the
        disk has twice that free; whether it did. The content is the same either way."""
        native = accel.encoder()
        if native is None or not has_room(self.work, 2 * (txt_bytes + jsonl_bytes)):
            return False
        reserved = [
            native.reserve_blocks(fd, size)
            for fd, size in ((self.txt_fd, txt_bytes), (self.jsonl_fd, jsonl_bytes))
        ]
        self.reserved = any(reserved)
        return self.reserved

    def __enter__(self) -> Assembly:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        shutil.rmtree(self.work, ignore_errors=True)
        os.close(self.owner)  # the lock goes last: nobody removes the directory while it is being removed

    def place(self, result: ChunkResult) -> Placement:
        """Decide which of the next chunk's records are kept, and reserve their bytes in both files."""
        keep = self._first_times(result.shas) if self.dedupe else [True] * len(result.shas)
        placement = Placement(keep, self.sizes["txt"], self.sizes["jsonl"])
        self.sizes["txt"] += sum(compress(result.txt_bytes, keep))
        self.sizes["jsonl"] += sum(compress(result.jsonl_bytes, keep))
        return placement

    def _first_times(self, shas: list[bytes]) -> list[bool]:
        """For each SHA, whether no earlier record had it (the first of equal records in a chunk wins)."""
        seen = self.seen
        keep = []
        for sha in shas:
            new = sha not in seen
            keep.append(new)
            seen.add(sha)
        return keep

    def commit(self, stats: dict[str, Any]) -> None:
        """Put corpus.txt and corpus.jsonl in place, then stats.json."""
        self.close()
        for path, size in ((self.txt_path, self.sizes["txt"]), (self.jsonl_path, self.sizes["jsonl"])):
            if os.path.getsize(path) != size:
                raise CorpusError(
                    f"{path} has {os.path.getsize(path)} bytes, {size} were placed; the build is incomplete"
                )
            if self.reserved:
                os.truncate(path, size)  # the same size: gives back the blocks reserved past the end
        self.paths.stats.unlink(missing_ok=True)  # it describes the files about to be replaced
        os.replace(self.txt_path, self.paths.txt)
        os.replace(self.jsonl_path, self.paths.jsonl)
        text = orjson.dumps(stats, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
        write_bytes_atomically(self.paths.stats, text)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.txt_fd)
            os.close(self.jsonl_fd)


def has_room(directory: Path, nbytes: int) -> bool:
    """Whether the file system of directory has nbytes free for this user."""
    try:
        info = os.statvfs(directory)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize >= nbytes
