"""Turning a chunk of planned files into corpus bytes: the hot loop, run in worker processes.

For each file: read it, apply the content rules, decode, dedupe within the chunk by git blob
SHA-1, redact secrets, pick the split, and keep its corpus.txt and corpus.jsonl bytes in
memory. The parent process decides, in corpus order, which records survive dedupe across
chunks and where they go in the output files (assemble.py); `write_chunk` then writes them
there, so the result is the same for any chunking and any number of workers.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import NamedTuple

import orjson
import xxhash
from dulwich.objects import ObjectID
from dulwich.repo import Repo

from multiagenttrainer.corpus.filters import content_skip_reason, decode_text
from multiagenttrainer.corpus.plan import Item, TreeInfo
from multiagenttrainer.corpus.secrets import redact_secrets


@dataclass(frozen=True)
class ChunkSettings:
    """The corpus options the hot loop needs."""

    max_file_bytes: int
    dedupe: bool
    redact: bool
    val_fraction: float
    skip_generated: bool


@dataclass(frozen=True)
class ChunkJob:
    """One chunk of work: its items and every tree they point into."""

    index: int
    trees: tuple[TreeInfo, ...]
    items: list[Item]
    settings: ChunkSettings


class Record(NamedTuple):
    """What the parent needs to know about one file the chunk kept."""

    sha: bytes  # git blob SHA-1 of the original bytes: the dedupe key
    txt_bytes: int
    jsonl_bytes: int
    size: int  # original file size in bytes
    split: str
    tree: int
    secrets: dict[str, int] | None


@dataclass
class ChunkResult:
    """What a chunk produced, without the bytes: its records in order, and what was skipped, per tree."""

    index: int
    records: list[Record] = field(default_factory=list)
    skipped: dict[tuple[int, str], int] = field(default_factory=dict)
    files: int = 0
    bytes_read: int = 0
    replaced_encoding: int = 0

    def skip(self, tree: int, reason: str) -> None:
        self.skipped[tree, reason] = self.skipped.get((tree, reason), 0) + 1


@dataclass
class ChunkOutput:
    """A processed chunk: the result, and each record's corpus.txt pieces and corpus.jsonl line."""

    result: ChunkResult
    txt: list[tuple[bytes, ...]] = field(default_factory=list)
    jsonl: list[bytes] = field(default_factory=list)


@dataclass(frozen=True)
class Placement:
    """Which records of a chunk to write (dedupe across chunks) and where they start in each file."""

    keep: list[bool]
    txt_offset: int
    jsonl_offset: int


def git_blob_sha(data: bytes) -> bytes:
    """The SHA-1 git gives these bytes as a blob."""
    digest = hashlib.sha1(b"blob %d\0" % len(data), usedforsecurity=False)
    digest.update(data)
    return digest.digest()


def split_for(key: str, val_fraction: float) -> str:
    """The split of a file: "val" for a stable val_fraction share of keys (xxh3 of source/repo/path)."""
    return "val" if xxhash.xxh3_64_intdigest(key.encode()) < val_fraction * 2**64 else "train"


def read_file(path: str, expected: int, limit: int) -> bytes:
    """A file's bytes; at most limit + 1 of them, so an oversized file is detected without reading it all."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        want = min(expected, limit) + 1
        data = os.read(fd, want)
        if len(data) < want or len(data) > limit:
            return data  # a regular file reads short only at its end: usually one read is all
        pieces, total = [data], len(data)
        while total <= limit and (piece := os.read(fd, limit + 1 - total)):
            pieces.append(piece)
            total += len(piece)
        return b"".join(pieces)
    finally:
        os.close(fd)


Loader = Callable[[Item], tuple[bytes, "bytes | None"]]  # item -> (data, blob SHA when already known)


def dir_loader(tree: TreeInfo, settings: ChunkSettings, stack: ExitStack) -> Loader:
    """Files on disk, read by path."""
    return lambda item: (read_file(str(item.ref), item.size, settings.max_file_bytes), None)


def git_loader(tree: TreeInfo, settings: ChunkSettings, stack: ExitStack) -> Loader:
    """Blobs from a bare repository's object store; the blob SHA is the listing's ref."""
    repo = stack.enter_context(Repo(tree.path))

    def load(item: Item) -> tuple[bytes, bytes | None]:
        blob_id = ObjectID(str(item.ref).encode())
        return repo.object_store[blob_id].as_raw_string(), bytes.fromhex(str(item.ref))

    return load


def docs_loader(tree: TreeInfo, settings: ChunkSettings, stack: ExitStack) -> Loader:
    """Records whose text travelled with the plan."""
    return lambda item: (bytes(item.ref) if isinstance(item.ref, bytes) else item.ref.encode(), None)


LOADERS: dict[str, Callable[[TreeInfo, ChunkSettings, ExitStack], Loader]] = {
    "dir": dir_loader,
    "git": git_loader,
    "docs": docs_loader,
}


class RecordEncoder:
    """Turns one kept file into its corpus.txt pieces (header, text, final newline) and corpus.jsonl line."""

    def __init__(self, trees: tuple[TreeInfo, ...], output: ChunkOutput) -> None:
        self.trees = trees
        self.output = output
        self.headers = [f"--- source: {t.source} | repo: {t.repo} | path: ".encode() for t in trees]

    def add(self, item: Item, data: bytes, text: str, size: int, sha: bytes, split: str) -> tuple[int, int]:
        """Encode one file; returns its length in (corpus.txt, corpus.jsonl) bytes."""
        tree = self.trees[item.tree]
        header = self.headers[item.tree] + item.path.encode() + b" ---\n"
        pieces = (header, data) if data.endswith(b"\n") else (header, data, b"\n")
        record = {
            "source": tree.source,
            "repo": tree.repo,
            "commit": tree.commit,
            "path": item.path,
            "bytes": size,
            "sha": sha.hex(),
            "split": split,
            "text": text,
        }
        line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        self.output.txt.append(pieces)
        self.output.jsonl.append(line)
        return sum(map(len, pieces)), len(line)


def run_chunk(job: ChunkJob) -> ChunkOutput:
    """Process one chunk in memory (in a worker process, or in-process when there are no workers)."""
    output = ChunkOutput(ChunkResult(job.index))
    encoder = RecordEncoder(job.trees, output)
    seen: set[bytes] = set()
    with ExitStack() as stack:
        loaders: dict[int, Loader] = {}
        for item in job.items:
            if item.tree not in loaders:
                tree = job.trees[item.tree]
                loaders[item.tree] = LOADERS[tree.kind](tree, job.settings, stack)
            process_item(item, loaders[item.tree], job.settings, seen, encoder, output.result)
    return output


def process_item(
    item: Item,
    load: Loader,
    settings: ChunkSettings,
    seen: set[bytes],
    encoder: RecordEncoder,
    result: ChunkResult,
) -> None:
    """Read, filter, dedupe, redact and encode one file."""
    result.files += 1
    try:
        data, sha = load(item)
    except (OSError, KeyError):  # vanished, unreadable, or a blob missing from the object store
        result.skip(item.tree, "unreadable")
        return
    result.bytes_read += len(data)
    reason = content_skip_reason(data, item.path, settings.max_file_bytes, settings.skip_generated)
    decoded = None if reason else decode_text(data)
    if decoded is None:
        result.skip(item.tree, reason or "undecodable")
        return
    text, lossy = decoded
    sha = sha or git_blob_sha(data)
    if settings.dedupe and sha in seen:
        result.skip(item.tree, "duplicate")
        return
    seen.add(sha)
    size = len(data)
    if lossy:
        data = text.encode()  # kept with replacement characters: the corpus is always valid UTF-8
        result.replaced_encoding += 1
    redacted = None
    if settings.redact:
        data, found = redact_secrets(data)
        if found:
            text, redacted = data.decode(), found
    tree = encoder.trees[item.tree]
    split = split_for(f"{tree.source}/{tree.repo}/{item.path}", settings.val_fraction)
    txt_bytes, jsonl_bytes = encoder.add(item, data, text, size, sha, split)
    result.records.append(Record(sha, txt_bytes, jsonl_bytes, size, split, item.tree, redacted))


IOV_BATCH = 512  # pieces per pwritev call, below every platform's IOV_MAX


def write_chunk(output: ChunkOutput, placement: Placement, txt_fd: int, jsonl_fd: int) -> None:
    """Write a chunk's kept records at their places in the two output files."""
    keep = placement.keep
    write_at(
        txt_fd,
        [p for pieces, k in zip(output.txt, keep, strict=True) if k for p in pieces],
        placement.txt_offset,
    )
    write_at(
        jsonl_fd, [line for line, k in zip(output.jsonl, keep, strict=True) if k], placement.jsonl_offset
    )


def write_at(fd: int, pieces: list[bytes], offset: int) -> None:
    """Write the pieces back to back starting at `offset` (positioned writes: workers share the files)."""
    for start in range(0, len(pieces), IOV_BATCH):
        batch = pieces[start : start + IOV_BATCH]
        size = sum(map(len, batch))
        written = os.pwritev(fd, batch, offset) if hasattr(os, "pwritev") else 0
        if written < size:  # no pwritev, or a short write: finish the rest piece by piece
            rest = b"".join(batch)[written:]
            while rest:
                count = os.pwrite(fd, rest, offset + size - len(rest))
                rest = rest[count:]
        offset += size
