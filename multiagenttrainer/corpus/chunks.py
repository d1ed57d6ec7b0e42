"""Turning a chunk of planned files into corpus bytes: the hot loop, run in worker processes.

For each file: read it, apply the content rules, decode, dedupe within the chunk by git blob
SHA-1, redact secrets, pick the split, and append its corpus.txt and corpus.jsonl bytes to the
chunk's two buffers. Files on disk go through the native encoder (accel.py, native/encode.c) in
runs: it does all of that in C and hands back to the Python rules here only the files they must
decide (not plain UTF-8 text, a content rule that may apply, scanner hits that may be secrets).
The parent process decides, in corpus order, which records survive dedupe across chunks and
where they go in the output files (assemble.py); `write_chunk` then writes them there, so the
result is the same for any chunking and any number of workers.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter

import orjson
from dulwich.objects import ObjectID
from dulwich.repo import Repo

from multiagenttrainer.corpus import accel
from multiagenttrainer.corpus.filters import content_skip_reason, decode_text
from multiagenttrainer.corpus.plan import FileSpan, Item, TreeInfo
from multiagenttrainer.corpus.secrets import SCANNER, TRIGGER_REQUIRES, Hits, redact_secrets


@dataclass(frozen=True)
class ChunkSettings:
    """The corpus options the hot loop needs."""

    max_file_bytes: int
    dedupe: bool
    redact: bool
    val_fraction: float
    skip_generated: bool
    native: bool = False  # use the C encoder (accel.py) for plain text files


@dataclass(frozen=True)
class ChunkJob:
    """One chunk of work: its items (or the span of a directory tree they are planned from) and every
    tree they point into."""

    index: int
    trees: tuple[TreeInfo, ...]
    items: list[Item] | FileSpan
    settings: ChunkSettings


@dataclass
class ChunkResult:
    """What a chunk produced, without the bytes: one column per field of its kept records, in order,
    and what was skipped, per tree. Columns of plain values travel between processes cheaply.
    """

    index: int
    shas: list[bytes] = field(default_factory=list)  # git blob SHA-1 of the original bytes: the dedupe key
    txt_bytes: list[int] = field(default_factory=list)  # length of the record in corpus.txt
    jsonl_bytes: list[int] = field(default_factory=list)  # length of the record in corpus.jsonl
    sizes: list[int] = field(default_factory=list)  # original file size in bytes
    splits: list[str] = field(default_factory=list)
    trees: list[int] = field(default_factory=list)
    secrets: dict[int, dict[str, int]] = field(default_factory=dict)  # record position -> redactions per rule
    skipped: dict[tuple[int, str], int] = field(default_factory=dict)
    files: int = 0
    bytes_read: int = 0
    replaced_encoding: int = 0

    def skip(self, tree: int, reason: str) -> None:
        self.skipped[tree, reason] = self.skipped.get((tree, reason), 0) + 1

    def add_record(
        self,
        sha: bytes,
        txt_bytes: int,
        jsonl_bytes: int,
        size: int,
        split: str,
        tree: int,
        secrets: dict[str, int] | None,
    ) -> None:
        if secrets:
            self.secrets[len(self.shas)] = secrets
        self.shas.append(sha)
        self.txt_bytes.append(txt_bytes)
        self.jsonl_bytes.append(jsonl_bytes)
        self.sizes.append(size)
        self.splits.append(split)
        self.trees.append(tree)


@dataclass
class ChunkOutput:
    """A processed chunk: the result, and its records' corpus.txt and corpus.jsonl bytes back to back
    (record i is result.txt_bytes[i] / result.jsonl_bytes[i] long)."""

    result: ChunkResult
    txt: bytearray = field(default_factory=bytearray)
    jsonl: bytearray = field(default_factory=bytearray)


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


SPLITS = ("train", "val")


def val_threshold(val_fraction: float) -> int:
    """Keys whose 64-bit split hash is below this go to "val" (2**64: all of them)."""
    return math.ceil(val_fraction * 2**64)


def split_for(key: str, threshold: int) -> str:
    """The split of a file: "val" for a stable share of keys (the first 8 bytes of SHA-1 of
    source/repo/path, big-endian, below `val_threshold`); the native encoder computes the same."""
    digest = hashlib.sha1(key.encode(), usedforsecurity=False).digest()
    return SPLITS[int.from_bytes(digest[:8], "big") < threshold]


def open_beneath(path: str) -> int:
    """An absolute path opened without following a symbolic link in any component (the C encoder's
    open_no_links does the same): a directory swapped for a link during the build leads nowhere."""
    if not path.startswith("/"):
        raise OSError(errno.EINVAL, "not an absolute path", path)
    parts = [part for part in path.split("/") if part]
    at = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
            os.close(at)
            at = inner
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
    finally:
        os.close(at)


def read_file(path: str, expected: int, limit: int) -> bytes:
    """A file's bytes; at most limit + 1 of them, so an oversized file is detected without reading it all."""
    fd = open_beneath(path)
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
    """Files on disk, read by path (when the native encoder is off: it reads them itself otherwise)."""
    limit = settings.max_file_bytes
    return lambda item: (read_file(str(item.ref), item.size, limit), None)


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
    """Appends one kept file to the chunk's corpus.txt bytes (header, text, final newline) and corpus.jsonl
    bytes.

    A record is `{"source", "repo", "commit", "path", "bytes", "sha", "split", "text"}` as orjson
    writes it. With text already escaped (by the native encoder), the line is put together from the
    fields before the text, the escaped text and the closing, with the same bytes; the native run
    encoder (encode_dir_items) writes the same bytes itself, from `headers` and `record_starts`.
    """

    def __init__(self, trees: tuple[TreeInfo, ...], output: ChunkOutput) -> None:
        self.trees = trees
        self.output = output
        self.txt, self.jsonl = output.txt, output.jsonl  # where records go (see native_run)
        self.headers = [f"--- source: {t.source} | repo: {t.repo} | path: ".encode() for t in trees]
        self.record_starts = [
            orjson.dumps({"source": t.source, "repo": t.repo, "commit": t.commit})[:-1] + b',"path":'
            for t in trees
        ]

    def add(self, item: Item, data: bytes, text: str, size: int, sha: bytes, split: str) -> tuple[int, int]:
        """Encode one file (its text as a str); returns its length in (corpus.txt, corpus.jsonl) bytes."""
        tree = self.trees[item.tree]
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
        return self._append(item, data, (orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE),))

    def add_escaped(
        self, item: Item, data: bytes, escaped: bytes, size: int, sha: bytes, split: str
    ) -> tuple[int, int]:
        """Encode one file whose text is already the body of a JSON string; the same bytes as `add`."""
        fields = b'%b%b,"bytes":%d,"sha":"%b","split":"%b","text":"' % (
            self.record_starts[item.tree],
            orjson.dumps(item.path),
            size,
            sha.hex().encode(),
            split.encode(),
        )
        return self._append(item, data, (fields, escaped, b'"}\n'))

    @contextmanager
    def native_run(self) -> Iterator[tuple[bytearray, bytearray]]:
        """While the native encoder writes a run into the output, records made here go to a pair of
        pending buffers, which it moves into place after each file it hands back."""
        pending = bytearray(), bytearray()
        self.txt, self.jsonl = pending
        try:
            yield pending
        finally:
            self.txt, self.jsonl = self.output.txt, self.output.jsonl

    def _append(self, item: Item, data: bytes, line: tuple[bytes, ...]) -> tuple[int, int]:
        txt, jsonl = self.txt, self.jsonl
        txt_start, jsonl_start = len(txt), len(jsonl)
        txt += self.headers[item.tree]
        txt += item.path.encode()
        txt += b" ---\n"
        txt += data
        if not data.endswith(b"\n"):
            txt += b"\n"
        for piece in line:
            jsonl += piece
        return len(txt) - txt_start, len(jsonl) - jsonl_start


def run_chunk(job: ChunkJob) -> ChunkOutput:
    """Process one chunk in memory (in a worker process, or in-process when there are no workers)."""
    output = ChunkOutput(ChunkResult(job.index))
    processor = ItemProcessor(job.settings, RecordEncoder(job.trees, output))
    items = job.items
    if isinstance(items, FileSpan):  # a directory tree's files, planned here
        tree = items.tree
        items, files = items.items(lambda reason, _is_dir: output.result.skip(tree, reason))
        output.result.files += files - len(items)  # skipped by the path rules: looked at all the same
    with ExitStack() as stack:
        loaders: dict[int, Loader] = {}
        for tree_index, run in groupby(items, key=itemgetter(0)):
            tree = job.trees[tree_index]
            if tree.kind == "dir" and processor.native is not None:
                processor.process_dir_run(list(run))
                continue
            if tree_index not in loaders:
                loaders[tree_index] = LOADERS[tree.kind](tree, job.settings, stack)
            for item in run:
                processor.process(item, loaders[tree_index])
    return output


class ItemProcessor:
    """Read, filter, dedupe, redact and encode files, one after another, into one chunk's output."""

    def __init__(self, settings: ChunkSettings, encoder: RecordEncoder) -> None:
        self.settings = settings
        self.encoder = encoder
        self.result = encoder.output.result
        self.seen: set[bytes] = set()
        self.native = accel.encoder() if settings.native else None
        self.threshold = val_threshold(settings.val_fraction)

    def process_dir_run(self, items: list[Item]) -> None:
        """Consecutive files on disk, encoded natively; files for the Python rules come back one by one."""
        assert self.native is not None
        trees = self.encoder.trees
        result = self.result
        result.files += len(items)
        with self.encoder.native_run() as pending:
            result.bytes_read += self._encode_dir_items(items, trees, pending)

    def _encode_dir_items(
        self, items: list[Item], trees: tuple[TreeInfo, ...], pending: tuple[bytearray, bytearray]
    ) -> int:
        assert self.native is not None
        result = self.result
        read: int = self.native.encode_dir_items(
            items=items,
            headers=self.encoder.headers,
            record_starts=self.encoder.record_starts,
            split_prefixes=[f"{t.source}/{t.repo}/".encode() for t in trees],
            split_names=SPLITS,
            val_threshold=self.threshold,
            limit=self.settings.max_file_bytes,
            skip_generated=self.settings.skip_generated,
            dedupe=self.settings.dedupe,
            seen=self.seen,
            scanner=SCANNER if self.settings.redact else None,
            trigger_requires=TRIGGER_REQUIRES,
            txt=self.encoder.output.txt,
            jsonl=self.encoder.output.jsonl,
            pending=pending,
            columns=(
                result.shas,
                result.txt_bytes,
                result.jsonl_bytes,
                result.sizes,
                result.splits,
                result.trees,
            ),
            skip=result.skip,
            fallback=self.take_back,
            secrets=self.take_secrets,
        )
        return read

    def take_back(self, item: Item, data: bytes | None) -> None:
        """A file the native encoder hands back: unreadable (no data), or for the content rules."""
        if data is None:
            self.result.skip(item.tree, "unreadable")
        else:
            self.process_by_rules(item, data, None)

    def take_secrets(self, item: Item, data: bytes, sha: bytes, hits: Hits) -> bool:
        """A plain file the native encoder has written, whose scanner hits the secret rules look at:
        True when they found secrets (its record is then made here, redacted)."""
        redacted, found = redact_secrets(data, hits)
        if found:
            self.encode_redacted(item, redacted, len(data), sha, found)
        return bool(found)

    def process(self, item: Item, load: Loader) -> None:
        """One file: the native encoder takes plain text files, the Python rules everything else."""
        result = self.result
        result.files += 1
        try:
            data, sha = load(item)
        except (OSError, KeyError):  # vanished, unreadable, or a blob missing from the object store
            result.skip(item.tree, "unreadable")
            return
        result.bytes_read += len(data)
        if self.native is not None:
            limit, skip_generated = self.settings.max_file_bytes, self.settings.skip_generated
            plain, escaped, blob_sha = self.native.encode(data, limit, skip_generated)
            if plain:
                self.keep_plain(item, data, escaped, sha or blob_sha)
                return
        self.process_by_rules(item, data, sha)

    def keep_plain(self, item: Item, data: bytes, escaped: bytes, sha: bytes) -> None:
        """A valid UTF-8 text file no content rule applies to, already escaped for JSON."""
        if self.settings.dedupe:
            if sha in self.seen:
                self.result.skip(item.tree, "duplicate")
                return
            self.seen.add(sha)
        self.encode_plain(item, data, escaped, sha, None)

    def encode_plain(self, item: Item, data: bytes, escaped: bytes, sha: bytes, hits: Hits | None) -> None:
        """keep_plain after the dedupe; `hits`: the secret scanner's, when the caller ran it already."""
        if self.settings.redact:
            redacted, found = redact_secrets(data, hits)
            if found:
                self.encode_redacted(item, redacted, len(data), sha, found)
                return
        split = self.split_of(item)
        txt_bytes, jsonl_bytes = self.encoder.add_escaped(item, data, escaped, len(data), sha, split)
        self.result.add_record(sha, txt_bytes, jsonl_bytes, len(data), split, item.tree, None)

    def encode_redacted(self, item: Item, data: bytes, size: int, sha: bytes, found: dict[str, int]) -> None:
        """A plain text file with its secrets redacted (`size`: before the redaction)."""
        escaped = self.native.escape(data) if self.native is not None else None
        if escaped is None:  # not UTF-8 after the redaction, or no native encoder: the general way
            text = data.decode("utf-8", "replace")
            self.add_record(item, text.encode(), text, size, sha, found)
            return
        split = self.split_of(item)
        txt_bytes, jsonl_bytes = self.encoder.add_escaped(item, data, escaped, size, sha, split)
        self.result.add_record(sha, txt_bytes, jsonl_bytes, size, split, item.tree, found)

    def process_by_rules(self, item: Item, data: bytes, sha: bytes | None) -> None:
        """The Python rules: skip reasons, lenient decoding, dedupe, redaction."""
        result, settings = self.result, self.settings
        reason = content_skip_reason(data, item.path, settings.max_file_bytes, settings.skip_generated)
        decoded = None if reason else decode_text(data)
        if decoded is None:
            result.skip(item.tree, reason or "undecodable")
            return
        text, lossy = decoded
        sha = sha or git_blob_sha(data)
        if settings.dedupe and sha in self.seen:
            result.skip(item.tree, "duplicate")
            return
        self.seen.add(sha)
        size = len(data)
        if lossy:
            data = text.encode()  # kept with replacement characters: the corpus is always valid UTF-8
            result.replaced_encoding += 1
        redacted = None
        if settings.redact:
            data, found = redact_secrets(data)
            if found:
                text, redacted = data.decode("utf-8", "replace"), found
                data = text.encode()  # the same bytes unless a redaction cut a character
        self.add_record(item, data, text, size, sha, redacted)

    def add_record(
        self, item: Item, data: bytes, text: str, size: int, sha: bytes, redacted: dict[str, int] | None
    ) -> None:
        split = self.split_of(item)
        txt_bytes, jsonl_bytes = self.encoder.add(item, data, text, size, sha, split)
        self.result.add_record(sha, txt_bytes, jsonl_bytes, size, split, item.tree, redacted)

    def split_of(self, item: Item) -> str:
        tree = self.encoder.trees[item.tree]
        return split_for(f"{tree.source}/{tree.repo}/{item.path}", self.threshold)


IOV_BATCH = 512  # pieces per pwritev call, below every platform's IOV_MAX


def write_chunk(output: ChunkOutput, placement: Placement, txt_fd: int, jsonl_fd: int) -> None:
    """Write a chunk's kept records at their places in the two output files."""
    result, keep = output.result, placement.keep
    write_at(txt_fd, kept_bytes(output.txt, result.txt_bytes, keep), placement.txt_offset)
    write_at(jsonl_fd, kept_bytes(output.jsonl, result.jsonl_bytes, keep), placement.jsonl_offset)


def kept_bytes(buffer: bytearray, lengths: list[int], keep: list[bool]) -> list[memoryview]:
    """The kept records of a buffer of records back to back, as few slices as possible."""
    view = memoryview(buffer)
    if all(keep):
        return [view]
    slices, start, run_start = [], 0, None
    for length, kept in zip(lengths, keep, strict=True):
        if kept and run_start is None:
            run_start = start
        elif not kept and run_start is not None:
            slices.append(view[run_start:start])
            run_start = None
        start += length
    if run_start is not None:
        slices.append(view[run_start:start])
    return slices


def write_at(fd: int, pieces: list[memoryview], offset: int) -> None:
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
