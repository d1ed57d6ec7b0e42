"""Walking a directory the way git sees it, the fingerprint local sources use as their version,
and a small cache so the corpus build reuses the walk a fetch just did.

The walk uses os.scandir, never enters VCS directories, tool caches or gitignored directories,
honours every nested .gitignore and `.git/info/exclude`, skips symlinks, and lists entries in
sorted path order (each directory's entries sorted with directories as `name/`, which is git's
tree order). It does enter vendored directories: whether those are read is a corpus option, so
the fingerprint covers them, and the corpus build drops them when it replays the listing.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import xxhash

from multiagenttrainer.corpus.filters import CACHE_DIRS, VCS_DIRS, VENDORED_DIRS
from multiagenttrainer.corpus.ignore import IgnoreFile, IgnoreStack, PathSelector, root_ignore_stack

SkipHook = Callable[[str, bool], None]  # (reason, is_dir)
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
                stat = entry.stat(follow_symlinks=False)
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


def _sort_key(entry: os.DirEntry[str]) -> str:
    return entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name


def replay_files(events: list[WalkEvent], skip_vendored: bool, on_skip: SkipHook) -> Iterator[WalkEvent]:
    """The files of a listing, reporting skips; vendored directories are dropped whole when asked."""
    pruned = None  # the vendored directory (with a trailing slash) whose events are being dropped
    for event in events:
        if pruned is not None:
            if event.rel.startswith(pruned):
                continue
            pruned = None
        if event.kind == "file":
            yield event
        elif event.kind == "skip":
            on_skip(event.reason, event.is_dir)
        elif skip_vendored and event.rel.rpartition("/")[2] in VENDORED_DIRS:
            on_skip("vendored", True)
            pruned = event.rel + "/"


@dataclass(frozen=True)
class DirListing:
    """A walk's events and the fingerprint of the files among them."""

    root: str
    events: list[WalkEvent]
    fingerprint: str


_recent: OrderedDict[tuple[str, str], DirListing] = OrderedDict()


def list_directory(root: Path, selector: PathSelector | None = None, salt: str = "") -> DirListing:
    """Walk root. The fingerprint hashes (path, size, mtime) of every selected file: any edit, add or
    delete changes it.

    The listing is remembered (a few, by root and fingerprint) for `recent_listing`.
    """
    top = str(Path(root).absolute())
    events = walk_events(Path(top))
    digest = xxhash.xxh3_128(salt.encode())
    for event in events:
        if event.kind == "file" and (not selector or selector.accepts(event.rel)):
            digest.update(f"{event.rel}\0{event.size}\0{event.mtime_ns}\n".encode("utf-8", "surrogateescape"))
    listing = DirListing(top, events, digest.hexdigest())
    _recent[top, listing.fingerprint] = listing
    while len(_recent) > LISTING_CACHE_SIZE:
        _recent.popitem(last=False)
    return listing


def recent_listing(root: str, fingerprint: str) -> DirListing | None:
    """The listing this process made of root with that fingerprint, if it still has it."""
    return _recent.get((str(Path(root).absolute()), fingerprint))


def directory_fingerprint(root: Path, selector: PathSelector | None = None, salt: str = "") -> str:
    """The fingerprint of list_directory."""
    return list_directory(root, selector, salt).fingerprint
