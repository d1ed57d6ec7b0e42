"""Walking a directory the way git sees it, the fingerprint local sources use as their version,
and a small cache so the corpus build reuses the walk a fetch just did.

The walk never enters VCS directories, tool caches or gitignored directories, honours every
nested .gitignore and `.git/info/exclude`, skips symlinks, and lists entries in sorted path order
(each directory's entries sorted by their bytes, with directories as `name/`, which is git's tree
order). It does enter vendored directories: whether those are read is a corpus option, so the
fingerprint covers them, and the corpus plan drops them when it goes through the listing.

The walk runs in C (`_walk`, native/walk.c) when that is built, 3-4x faster than the os.scandir
loop kept here as the fallback; both give identical events and fingerprints. With a cache
directory, the native walk also leaves a listing snapshot (listing_cache.py) that lets the next
fingerprint of an unchanged tree skip the walk.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from multiagenttrainer.corpus import accel, listing_cache
from multiagenttrainer.corpus.filters import CACHE_DIRS, VCS_DIRS
from multiagenttrainer.corpus.ignore import IgnoreFile, IgnoreStack, PathSelector, root_ignore_stack

LISTING_CACHE_SIZE = 2


class WalkEvent(NamedTuple):
    """One entry met by the walk: a file, a directory entered, or something left out and why."""

    kind: str  # "file", "dir" or "skip"
    rel: str  # relative to the walk root, `/`-separated
    path: str = ""  # absolute (files)
    size: int = 0
    mtime_ns: int = 0
    reason: str = ""  # skips: why
    is_dir: bool = False  # skips: a whole directory


def walk_events(root: Path) -> list[WalkEvent]:
    """Every entry of the tree under root as git sees it, in sorted path order."""
    native = accel.walker()
    if native is None:
        return _walk_events_python(root)
    return _walk_native(native, str(Path(root).absolute()), "", False).events


@dataclass(frozen=True)
class NativeWalk:
    """What the C walk returns: the events, the fingerprint of all their files, the snapshot records."""

    events: list[WalkEvent]
    fingerprint: str
    records: bytes | None
    record_count: int


def _walk_native(native: ModuleType, top: str, salt: str, record: bool) -> NativeWalk:
    """The C walk (with snapshot records when asked); it calls back `_ignore_rules` for every
    .gitignore it meets, so parsing stays here."""
    walked: tuple[list[WalkEvent], str, bytes | None, int] = native.walk(
        top,
        _root_rules(Path(top)),
        _ignore_rules,
        WalkEvent,
        VCS_DIRS,
        CACHE_DIRS,
        salt.encode(),
        record,
    )
    return NativeWalk(*walked)


def _root_rules(top: Path) -> list[tuple[bytes, bool, bool]] | None:
    """The patterns of `.git/info/exclude` when top is a work tree (the lowest-precedence rules)."""
    stack = root_ignore_stack(top)
    return stack.levels[0].rules.git_rules() if stack.levels else None


def _ignore_rules(path: str) -> list[tuple[bytes, bool, bool]]:
    """A .gitignore's patterns for the C matcher (malformed ones skipped with a warning, as in Python)."""
    return IgnoreFile.read(Path(path)).git_rules()


def _walk_events_python(root: Path) -> list[WalkEvent]:
    """The os.scandir walk: the reference the C walk is tested against, and the fallback without it."""
    top = Path(root).absolute()
    events: list[WalkEvent] = []
    add = events.append
    # One frame per open directory: its remaining entries, its relative path, its ignore rules.
    stack = [_open_dir(str(top), "", b"", root_ignore_stack(top))]
    while stack:
        entries, rel, rel_bytes, rules = stack[-1]
        for entry in entries:  # resumes where it left off when a subdirectory is done
            name = entry.name
            child = rel_bytes + name.encode("utf-8", "surrogateescape")
            if entry.is_dir(follow_symlinks=False):
                if name in VCS_DIRS:
                    continue
                if name in CACHE_DIRS or (rules.levels and rules.is_ignored(child, True)):
                    add(
                        WalkEvent(
                            "skip",
                            rel + name,
                            reason="cache" if name in CACHE_DIRS else "ignored",
                            is_dir=True,
                        )
                    )
                    continue
                try:
                    stack.append(_open_dir(entry.path, rel + name + "/", child + b"/", rules))
                except OSError:  # unreadable: leave it out, as git does
                    add(WalkEvent("skip", rel + name, reason="unreadable", is_dir=True))
                    continue
                add(WalkEvent("dir", rel + name))
                break  # walk the subdirectory first
            if rules.levels and rules.is_ignored(child, False):
                add(WalkEvent("skip", rel + name, reason="ignored"))
            elif entry.is_file(follow_symlinks=False):
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted since the directory was read
                    continue
                add(WalkEvent("file", rel + name, entry.path, stat.st_size, stat.st_mtime_ns))
            elif entry.is_symlink():
                add(WalkEvent("skip", rel + name, reason="symlink"))
        else:
            stack.pop()
    return events


Frame = tuple[Iterator["os.DirEntry[str]"], str, bytes, IgnoreStack]


def _open_dir(path: str, rel: str, rel_bytes: bytes, rules: IgnoreStack) -> Frame:
    """A directory's entries in git order, with its own .gitignore added to the rules."""
    with os.scandir(path) as scan:
        entries = sorted(scan, key=_sort_key)
    for entry in entries:
        if entry.name == ".gitignore" and entry.is_file(follow_symlinks=False):
            rules = rules.push(rel_bytes, IgnoreFile.read(Path(entry.path)))
    return iter(entries), rel, rel_bytes, rules


def _sort_key(entry: os.DirEntry[str]) -> bytes:
    """git's order: the name's bytes (not its code points), a directory as `name/`."""
    name = os.fsencode(entry.name)
    return name + b"/" if entry.is_dir(follow_symlinks=False) else name


@dataclass(frozen=True)
class DirListing:
    """A walk's events and the fingerprint of the files among them."""

    root: str
    events: list[WalkEvent]
    fingerprint: str


_recent: OrderedDict[tuple[str, str], DirListing] = OrderedDict()


def list_directory(
    root: Path, selector: PathSelector | None = None, salt: str = "", cache_dir: Path | None = None
) -> DirListing:
    """Walk root. The fingerprint hashes (path, size, mtime) of every selected file: any edit, add or
    delete changes it.

    The listing is remembered (a few, by root and fingerprint) for `recent_listing`. With a cache
    directory (and the native walk), a snapshot of the walk is stored there for `directory_fingerprint`.
    """
    top = str(Path(root).absolute())
    native = accel.walker()
    if native is None:
        events = _walk_events_python(Path(top))
        listing = DirListing(top, events, files_fingerprint(events, selector, salt))
    else:
        with listing_cache.snapshot_writer(cache_dir, top, selector, salt) as snapshot:
            walked = _walk_native(native, top, salt, snapshot is not None)
            fingerprint = files_fingerprint(walked.events, selector, salt) if selector else walked.fingerprint
            if snapshot is not None and walked.records is not None:
                listing_cache.save_snapshot(snapshot, fingerprint, walked.records, walked.record_count)
        listing = DirListing(top, walked.events, fingerprint)
    _recent[top, listing.fingerprint] = listing
    while len(_recent) > LISTING_CACHE_SIZE:
        _recent.popitem(last=False)
    return listing


def files_fingerprint(events: list[WalkEvent], selector: PathSelector | None, salt: str) -> str:
    """SHA-1 of the salt, then `rel NUL size NUL mtime_ns LF` per selected file, as the C walk hashes."""
    digest = hashlib.sha1(salt.encode())
    for event in events:
        if event.kind == "file" and (not selector or selector.accepts(event.rel)):
            digest.update(f"{event.rel}\0{event.size}\0{event.mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def recent_listing(root: str, fingerprint: str) -> DirListing | None:
    """The listing this process made of root with that fingerprint, if it still has it."""
    return _recent.get((str(Path(root).absolute()), fingerprint))


def directory_fingerprint(
    root: Path, selector: PathSelector | None = None, salt: str = "", cache_dir: Path | None = None
) -> str:
    """The fingerprint of list_directory; from the snapshot in cache_dir, without a walk, when nothing
    it recorded has changed."""
    top = str(Path(root).absolute())
    native = accel.walker()
    usable = listing_cache.usable_cache(cache_dir, top)
    if native is not None and usable is not None:
        cached = listing_cache.cached_fingerprint(native, usable, top, selector, salt)
        if cached is not None:
            return cached
    return list_directory(Path(top), selector, salt, cache_dir).fingerprint
