"""Listing snapshots: "did anything change since the last walk?" answered without walking (git's index idea).

After a walk, `list_directory` stores a snapshot of it in a cache directory: the fingerprint, the
time the walk started (by the filesystem's own clock: the mtime of a file created just before it)
and the stat fields (type, size, mtime, ctime, inode) of every directory it entered (and every
unreadable one), every file git listed, every .gitignore in those directories (git read them,
ignored or not), and of the files outside the tree that decided the listing: each work tree's
exclude file and index (or that there was none) and the git executable.

Next time, `verify` stats those paths again. A directory's mtime changes when an entry is added to
it, removed or renamed; a file's when it is written; ctime also on chmod or a backdated mtime (ctime
cannot be set back). So when all of them stat the same, a walk would list the same files with the
same sizes and mtimes, and the stored fingerprint is the answer. git and the walk read the tree at
slightly different moments, so a snapshot in which anything changed less than 2 s before the walk
started, or later, is not saved (git's racy-git rule, widened to the whole walk): the next
fingerprint walks again.

`stat_fields` is the one stat loop both use: in C (`_statfields`, native/statfields.c, on up to four
threads) when it is built, else os.stat here; both give the same bytes. The C loop checks the
benchmark tree's snapshot (23,000 paths) about twice as fast, which keeps a re-ingest of an unchanged
tree under a tenth of its first build on a busy machine (benchmarks/corpus_build.py).

File layout, native byte order: magic; start_ns; the lengths of root, key and fingerprint; the entry
count and the length of the paths; those three strings; one byte per entry (1: follow symlinks);
the paths (relative to the root, or absolute), each ended by a NUL; the stat fields, 40 bytes per
entry (STAT); and the SHA-1 of all of that.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import struct
import tempfile
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from multiagenttrainer.corpus import accel
from multiagenttrainer.corpus.filters import CACHE_DIRS, VCS_DIRS
from multiagenttrainer.corpus.gitview import CONTROLLED_CONFIG, PRUNED_PATTERNS
from multiagenttrainer.corpus.ignore import PathSelector

log = logging.getLogger(__name__)

MAGIC = b"MATLIST2"
WALK_RULES = (
    2  # bump when what the walk lists changes (git's listing, pruning), so old snapshots stop answering
)
HEADER = struct.Struct("=8sqIIIII")  # magic, start_ns, root_len, key_len, fingerprint_len, count, paths_len
STAT = struct.Struct("=qqqqQ")  # type, size, mtime_ns, ctime_ns, inode; all zero when stat failed
TYPE_MISSING, TYPE_DIR, TYPE_FILE, TYPE_SYMLINK, TYPE_OTHER = range(5)
LSTAT, FOLLOW = 0, 1  # per path: lstat, or stat following symlinks (the root "" is always followed)
RACY_NS = 2_000_000_000  # a time this close to the walk's start (or after it) may hide an edit
SHA1_BYTES = 20


def stat_fields(top: bytes, modes: bytes, paths: Sequence[bytes]) -> bytes:
    """STAT fields of every path (relative to top, or absolute; "" is top itself), in order."""
    native = accel.stat_module()
    if native is not None:
        fields: bytes = native.stat_fields(top, modes, paths)
        return fields
    return stat_fields_python(top, modes, paths)


def stat_fields_python(top: bytes, modes: bytes, paths: Sequence[bytes]) -> bytes:
    """The Python stat loop: relative paths are resolved from a descriptor of top, as in C."""
    if len(modes) != len(paths):
        raise ValueError("one mode per path")
    out = bytearray(len(paths) * STAT.size)
    try:
        root: int | None = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        root = None
    try:
        for index, (mode, path) in enumerate(zip(modes, paths, strict=True)):
            st = _stat_one(root, path, mode)
            if st is not None:
                STAT.pack_into(
                    out,
                    index * STAT.size,
                    _type(st.st_mode),
                    st.st_size,
                    st.st_mtime_ns,
                    st.st_ctime_ns,
                    st.st_ino,
                )
    finally:
        if root is not None:
            os.close(root)
    return bytes(out)


def _stat_one(root: int | None, path: bytes, mode: int) -> os.stat_result | None:
    if b"\0" in path:
        raise ValueError("a path with a NUL byte")
    try:
        if not path:
            return None if root is None else os.stat(root)
        if root is None and path[:1] != b"/":
            return None
        return os.stat(path, dir_fd=root, follow_symlinks=bool(mode))
    except OSError:
        return None


def _type(mode: int) -> int:
    if stat.S_ISDIR(mode):
        return TYPE_DIR
    if stat.S_ISREG(mode):
        return TYPE_FILE
    return TYPE_SYMLINK if stat.S_ISLNK(mode) else TYPE_OTHER


class Records:
    """What a snapshot stats again: paths, their modes, and the fields the walk saw."""

    def __init__(self) -> None:
        self.modes = bytearray()
        self.paths: list[bytes] = []
        self.fields = bytearray()

    def add(self, modes: bytes, paths: Sequence[bytes], fields: bytes) -> None:
        """Entries already stat-ed by the walk (`fields` from stat_fields)."""
        self.modes += modes
        self.paths.extend(paths)
        self.fields += fields

    def add_unstated(self, top: bytes, modes: bytes, paths: Sequence[bytes]) -> None:
        """Entries to stat now."""
        self.add(modes, paths, stat_fields(top, modes, paths))

    def latest_ns(self) -> int:
        """The latest mtime or ctime among the entries (0 without any)."""
        if not self.fields:
            return 0
        numbers = array("q", self.fields)  # inode, read as signed, is never looked at
        return max(max(numbers[2::5]), max(numbers[3::5]))


def _selector_text(selector: PathSelector | None) -> str:
    if not selector:
        return ""
    return repr(([g.patterns for g in selector.includes], [g.patterns for g in selector.excludes]))


def snapshot_path(cache_dir: Path, top: str, selector: PathSelector | None) -> Path:
    """Where the snapshot of this root and selector lives; one file each, whatever the salt."""
    name = hashlib.sha1(f"{top}\0{_selector_text(selector)}".encode("utf-8", "surrogateescape"))
    return Path(cache_dir) / f"{name.hexdigest()[:24]}.listing"


def snapshot_key(top: str, selector: PathSelector | None, salt: str) -> bytes:
    """What a snapshot must have been written for: the root, the selector, the salt (HEAD commit) and
    the walk's own rules."""
    rules = f"{WALK_RULES}\0{sorted(VCS_DIRS)}\0{sorted(CACHE_DIRS)}\0{CONTROLLED_CONFIG}\0{PRUNED_PATTERNS}"
    text = f"{top}\0{_selector_text(selector)}\0{salt}\0{rules}"
    return hashlib.sha1(text.encode("utf-8", "surrogateescape")).digest()


def usable_cache(cache_dir: Path | None, top: str) -> Path | None:
    """The cache directory, unless it lies inside the walked tree (writing there would change the tree)."""
    if cache_dir is None:
        return None
    cache = Path(os.path.realpath(cache_dir))
    return None if cache.is_relative_to(os.path.realpath(top)) else cache


def cached_fingerprint(cache_dir: Path, top: str, selector: PathSelector | None, salt: str) -> str | None:
    """The stored fingerprint when nothing the last walk saw has changed; None means walk again."""
    return verify(snapshot_path(cache_dir, top, selector), top, snapshot_key(top, selector, salt))


def verify(path: Path, top: str, key: bytes) -> str | None:
    """The fingerprint stored at path when the snapshot is intact, made for this root and key, and
    every entry stats the same; else None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    body = data[:-SHA1_BYTES]
    if len(data) < HEADER.size + SHA1_BYTES or hashlib.sha1(body).digest() != data[-SHA1_BYTES:]:
        return None
    magic, _start, root_len, key_len, fingerprint_len, count, paths_len = HEADER.unpack_from(body)
    strings = _split(body, HEADER.size, (root_len, key_len, fingerprint_len, count, paths_len))
    if strings is None or len(
        body
    ) != HEADER.size + root_len + key_len + fingerprint_len + paths_len + count * (1 + STAT.size):
        return None
    root, stored_key, fingerprint, modes, paths, fields = strings
    if magic != MAGIC or root != os.fsencode(top) or stored_key != key or not fingerprint.isascii():
        return None
    names = paths.split(b"\0")
    if names.pop() != b"" or len(names) != count:
        return None
    return fingerprint.decode("ascii") if stat_fields(root, modes, names) == fields else None


def _split(body: bytes, at: int, lengths: tuple[int, int, int, int, int]) -> list[bytes] | None:
    """root, key, fingerprint, modes, paths and fields, cut from body at their lengths."""
    root_len, key_len, fingerprint_len, count, paths_len = lengths
    parts = []
    for length in (root_len, key_len, fingerprint_len, count, paths_len, count * STAT.size):
        if at + length > len(body):
            return None
        parts.append(body[at : at + length])
        at += length
    return parts


class SnapshotWriter:
    """A snapshot being made: created before the walk (its file's mtime is the walk's start), saved after."""

    def __init__(self, cache_dir: Path, top: str, selector: PathSelector | None, salt: str) -> None:
        self.path = snapshot_path(cache_dir, top, selector)
        self.top = top
        self.key = snapshot_key(top, selector, salt)
        cache_dir.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=cache_dir, prefix=".listing-", suffix=".tmp")
        self.handle: int | None = handle
        self.temp = Path(temp)
        self.start_ns = os.fstat(handle).st_mtime_ns

    def save(self, fingerprint: str, records: Records) -> None:
        """Write the snapshot and move it into place atomically; or, when racy, remove the old one."""
        if records.latest_ns() > self.start_ns - RACY_NS:
            self.path.unlink(missing_ok=True)
            return
        root = os.fsencode(self.top)
        fingerprint_bytes = fingerprint.encode("ascii")
        paths = b"\0".join(records.paths) + b"\0" if records.paths else b""
        counts = (len(fingerprint_bytes), len(records.paths), len(paths))
        header = HEADER.pack(MAGIC, self.start_ns, len(root), len(self.key), *counts)
        body = b"".join((header, root, self.key, fingerprint_bytes, records.modes, paths, records.fields))
        assert self.handle is not None
        with open(self.handle, "wb", closefd=False) as out:
            out.write(body)
            out.write(hashlib.sha1(body).digest())
        self.close()
        os.replace(self.temp, self.path)

    def close(self) -> None:
        if self.handle is not None:
            os.close(self.handle)
            self.handle = None

    def discard(self) -> None:
        """Remove the temporary file when the snapshot was not saved."""
        self.close()
        with suppress(FileNotFoundError):
            self.temp.unlink()


@contextmanager
def snapshot_writer(
    cache_dir: Path | None, top: str, selector: PathSelector | None, salt: str
) -> Iterator[SnapshotWriter | None]:
    """A writer for this walk's snapshot, or None without a usable cache directory.

    The snapshot only saves time, so a cache directory that cannot be written is logged and ignored.
    """
    usable = usable_cache(cache_dir, top)
    writer = None
    if usable is not None:
        try:
            writer = SnapshotWriter(usable, top, selector, salt)
        except OSError as exc:
            log.debug("no listing snapshot in %s: %s", usable, exc)
    try:
        yield writer
    finally:
        if writer is not None:
            writer.discard()


def save_snapshot(writer: SnapshotWriter, fingerprint: str, records: Records) -> None:
    """Save, logging rather than failing when the cache directory cannot be written."""
    try:
        writer.save(fingerprint, records)
    except OSError as exc:
        log.debug("listing snapshot %s not written: %s", writer.path, exc)
