"""Listing snapshots: "did anything change since the last walk?" answered without walking (git's index idea).

After a full native walk, `list_directory` stores a snapshot of it in a cache directory: the
fingerprint, the time the walk started (by the filesystem's own clock: the mtime of a file created
just before it) and the stat fields (size, mtime, ctime, inode) of every directory it entered, every
file it listed, every .gitignore it read and of `.git/info/exclude` (or that there was none).

Next time, `_walk.verify` stats those entries again. A directory's mtime changes when an entry is
added to it, removed or renamed; a file's when it is written; ctime also on chmod or a backdated
mtime (ctime cannot be set back). So when all of them stat the same, a walk would list the same files
with the same sizes and mtimes, and the stored fingerprint is the answer. A recorded time within 2 s
of the walk's start is racy (an edit in the same clock tick leaves it unchanged), as in git's
racy-git check: such a snapshot is never trusted, and the next full walk rewrites it.

File layout, native byte order: magic, start_ns, the lengths of root, key and fingerprint, the record
count, those three strings, the records (a 40-byte head: kind, rel length, size, mtime_ns, ctime_ns,
inode; then the rel path and a NUL), and the SHA-1 of all of that.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType

from multiagenttrainer.corpus.filters import CACHE_DIRS, VCS_DIRS
from multiagenttrainer.corpus.ignore import PathSelector

log = logging.getLogger(__name__)

MAGIC = b"MATLIST1"
WALK_RULES = 1  # bump when what the walk lists changes (matching, pruning), so old snapshots stop answering
HEADER = struct.Struct("=8sqIIII")  # magic, start_ns, root_len, key_len, fingerprint_len, record_count
RECORD = struct.Struct("=BxxxIqqqQ")  # kind, rel_len, size, mtime_ns, ctime_ns, inode; then rel + NUL
RECORD_FOLLOW_FILE = 3  # the kinds of walk.c; the walk writes the others itself
RECORD_ABSENT = 4
EXCLUDE_REL = b".git/info/exclude"


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
    rules = f"{WALK_RULES}\0{sorted(VCS_DIRS)}\0{sorted(CACHE_DIRS)}"
    text = f"{top}\0{_selector_text(selector)}\0{salt}\0{rules}"
    return hashlib.sha1(text.encode("utf-8", "surrogateescape")).digest()


def usable_cache(cache_dir: Path | None, top: str) -> Path | None:
    """The cache directory, unless it lies inside the walked tree (writing there would change the tree)."""
    if cache_dir is None:
        return None
    cache = Path(os.path.realpath(cache_dir))
    return None if cache.is_relative_to(os.path.realpath(top)) else cache


def cached_fingerprint(
    native: ModuleType, cache_dir: Path, top: str, selector: PathSelector | None, salt: str
) -> str | None:
    """The stored fingerprint when nothing the last walk saw has changed; None means walk again."""
    path = snapshot_path(cache_dir, top, selector)
    fingerprint: str | None = native.verify(str(path), top, snapshot_key(top, selector, salt))
    return fingerprint


def _exclude_record(top: str) -> bytes:
    """`.git/info/exclude` as the root's ignore rules read it (symlinks followed), or that it is absent."""
    try:
        st = os.stat(os.path.join(top, ".git", "info", "exclude"))
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        return RECORD.pack(RECORD_ABSENT, len(EXCLUDE_REL), 0, 0, 0, 0) + EXCLUDE_REL + b"\0"
    head = RECORD.pack(
        RECORD_FOLLOW_FILE, len(EXCLUDE_REL), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino
    )
    return head + EXCLUDE_REL + b"\0"


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
        self.exclude = _exclude_record(top)  # stat-ed before the walk reads the file

    def save(self, fingerprint: str, records: bytes, count: int) -> None:
        """Write the snapshot and move it into place atomically."""
        root = os.fsencode(self.top)
        fingerprint_bytes = fingerprint.encode("ascii")
        header = HEADER.pack(
            MAGIC, self.start_ns, len(root), len(self.key), len(fingerprint_bytes), count + 1
        )
        body = b"".join((header, root, self.key, fingerprint_bytes, self.exclude, records))
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


def save_snapshot(writer: SnapshotWriter, fingerprint: str, records: bytes, count: int) -> None:
    """Save, logging rather than failing when the cache directory cannot be written."""
    try:
        writer.save(fingerprint, records, count)
    except OSError as exc:
        log.debug("listing snapshot %s not written: %s", writer.path, exc)
