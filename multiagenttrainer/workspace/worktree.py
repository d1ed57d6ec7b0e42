"""The files of a work tree, read and written without trusting what an agent left there.

An agent may leave anything in a workspace: a symlink where a file was (or where a directory was, so that
writing "into" it lands outside the workspace), directories without permissions, a FIFO that blocks
whoever reads it, files that git is told to ignore or not to look at. This module looks at a tree with
lstat only, never follows a link, and writes by replacing whatever is in the way:

    scan(root, spared)                 every file, link, directory and odd entry below root (not .git/)
    git_blob_id(path, entry, hash)     the name git gives the entry's content (what `ls-tree` lists)
    write_file(root, rel, data, ...)   put a regular file (or a symlink) at rel, replacing what is there
    remove(root, rel)                  delete a file, link or directory tree, fixing permissions on the way
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

EntryKind = Literal["file", "link", "dir", "other"]
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Spared:
    """Paths a scan leaves out: mat's own outputs, and inputs that are checked another way."""

    files: frozenset[str] = frozenset()
    dirs: frozenset[str] = frozenset()  # whole trees, by path relative to the root

    def covers(self, rel: str) -> bool:
        """Whether `rel` is one of the files or lies in one of the trees."""
        return rel in self.files or any(rel == d or rel.startswith(d + "/") for d in self.dirs)


@dataclass(frozen=True)
class Entry:
    """What lstat says is at a path: its kind, the executable bit of a file, its size."""

    kind: EntryKind
    executable: bool = False
    size: int = 0


def entry_of(st: os.stat_result) -> Entry:
    """The Entry for an lstat result."""
    if stat.S_ISREG(st.st_mode):
        return Entry("file", bool(st.st_mode & 0o100), st.st_size)
    if stat.S_ISLNK(st.st_mode):
        return Entry("link")
    return Entry("dir") if stat.S_ISDIR(st.st_mode) else Entry("other")


def list_dir(directory: Path) -> list[os.DirEntry[str]]:
    """The entries of a directory; one the agent made unreadable is made readable first."""
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except PermissionError:
        os.chmod(directory, 0o700)
        with os.scandir(directory) as entries:
            return list(entries)


def scan(root: Path, spared: Spared = Spared()) -> dict[str, Entry]:
    """Every entry below `root` by relative path, directories included; `.git` at the top is left out."""
    found: dict[str, Entry] = {}
    pending = [""]
    while pending:
        prefix = pending.pop()
        for item in list_dir(root / prefix):
            rel = f"{prefix}/{item.name}" if prefix else item.name
            if rel == ".git" or spared.covers(rel):
                continue
            found[rel] = entry_of(item.stat(follow_symlinks=False))
            if found[rel].kind == "dir":
                pending.append(rel)
    return found


def git_blob_id(path: Path, entry: Entry, hash_name: str = "sha1") -> str | None:
    """The object id git gives this file's content or this link's target; None for other entries."""
    if entry.kind == "link":
        data = os.fsencode(os.readlink(path))
        return hashlib.new(hash_name, b"blob %d\0" % len(data) + data).hexdigest()
    if entry.kind != "file":
        return None
    digest = hashlib.new(hash_name, b"blob %d\0" % entry.size)
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(READ_CHUNK):
                digest.update(chunk)
    except PermissionError:
        return None  # unreadable: counts as changed, and is replaced
    return digest.hexdigest()


def remove(root: Path, rel: str) -> None:
    """Delete whatever is at `rel` (a link itself, never its target); a no-op when nothing is there."""
    target = root / rel
    try:
        st = target.lstat()
    except FileNotFoundError:
        return
    if not os.access(target.parent, os.W_OK | os.X_OK):
        os.chmod(target.parent, 0o700)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(target, onerror=_open_up_and_retry)
    else:
        target.unlink(missing_ok=True)


def _open_up_and_retry(function: object, path: str, excinfo: object) -> None:
    """rmtree's error hook: give the directories in the way full permissions, then delete again."""
    for directory in (os.path.dirname(path), path):
        if os.path.isdir(directory) and not os.path.islink(directory):
            os.chmod(directory, 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def real_directory(root: Path, rel_dir: str) -> Path:
    """Make every component of `rel_dir` below `root` a real, writable directory; return its path.

    A link or a file where a directory should be is replaced by an empty directory.
    """
    current = root
    for part in [p for p in rel_dir.split("/") if p]:
        current = current / part
        try:
            st = current.lstat()
        except FileNotFoundError:
            current.mkdir()
            continue
        if not stat.S_ISDIR(st.st_mode):
            remove(root, str(current.relative_to(root)))
            current.mkdir()
        elif not os.access(current, os.W_OK | os.X_OK):
            os.chmod(current, 0o755)
    return current


def replace_at(root: Path, rel: str, fill: Callable[[Path], None]) -> None:
    """Let `fill` create a new entry at a temporary name beside `rel`, then rename it over whatever is there.

    No link on the way is followed, so nothing is ever written outside `root`.
    """
    parent_rel, _, name = rel.rpartition("/")
    parent = real_directory(root, parent_rel)
    target = parent / name
    if target.is_dir() and not target.is_symlink():
        remove(root, rel)
    tmp = parent / f".{name}.mat-{secrets.token_hex(6)}"
    try:
        fill(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_file(root: Path, rel: str, data: bytes, *, executable: bool = False, link: bool = False) -> None:
    """Put `data` at `rel` as a regular file (or, with `link`, as a symlink whose target is `data`)."""

    def fill(tmp: Path) -> None:
        if link:
            os.symlink(os.fsdecode(data), tmp)
            return
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o755 if executable else 0o644)

    replace_at(root, rel, fill)


def copy_file(source: Path, root: Path, rel: str, mode: int = 0o644) -> None:
    """Copy the file `source` to `rel` below `root`, replacing what is there (see replace_at)."""

    def fill(tmp: Path) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out, source.open("rb") as src:
            shutil.copyfileobj(src, out, READ_CHUNK)
        os.chmod(tmp, mode)

    replace_at(root, rel, fill)
