"""Walking a directory the way git sees it, the fingerprint local sources use as their version,
and a small cache so the corpus build reuses the walk a fetch just did.

Which files are kept is git's answer, asked of git itself (gitview.py): the walk lists what git
lists, so it is the same whichever code runs and the same as `git ls-files --cached --others
--exclude-standard` (with a throw-away GIT_DIR for a plain directory). The walk adds the stat data
of each file (one stat call per file: listing_cache.stat_fields, in C when built), reads the
directories git passed over in silence, and puts everything in git's tree order (each directory's
entries sorted by their bytes, a directory as `name/`). The cases git leaves open are decided here:

- an ignored directory is one "skip" event, not entered; unless tracked files lie below it, which
  git never ignores: then it is entered for those alone;
- VCS directories (`.git`, `.hg`, ...) are never entered or reported, tool caches (`__pycache__`,
  ...) are reported as "cache" skips and never read, even when tracked: neither is source;
- a nested repository (a directory git reports as one: a checked-out submodule too) is listed as
  git lists it from inside: its own .gitignore files, `info/exclude` and index, not the outer
  tree's rules (unless those ignore it whole, as git does); a submodule not checked out is an
  empty directory;
- symlinks are never followed: one git lists is a "symlink" skip; FIFOs, sockets and devices are
  left out silently (git does not list them);
- a directory git passed over with nothing listed is still reported: as a "dir" event when it is
  empty (or holds only what git does not list), as an "unreadable" skip when it cannot be read;
- a directory whose .gitignore cannot be read is an "unreadable" skip, nothing in it listed (git
  would warn and list it without those rules, and so what they keep out); at the root, an error;
- vendored directories are entered: whether those are read is a corpus option, so the
  fingerprint covers them, and the corpus plan drops them when it goes through the listing.

With a cache directory, the walk also leaves a listing snapshot (listing_cache.py) that lets the
next fingerprint of an unchanged tree skip the walk.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import sys
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import NamedTuple

from multiagenttrainer.corpus import accel, listing_cache
from multiagenttrainer.corpus.collector import garbage_collection_paused
from multiagenttrainer.corpus.filters import CACHE_DIRS, VCS_DIRS
from multiagenttrainer.corpus.gitview import GitRunner, GitView, git_runner
from multiagenttrainer.corpus.ignore import PathSelector
from multiagenttrainer.corpus.listing_cache import (
    FOLLOW,
    TYPE_FILE,
    TYPE_SYMLINK,
    Records,
)

LISTING_CACHE_SIZE = 2
ENCODING, ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
VCS_NAMES = frozenset(map(os.fsencode, VCS_DIRS))
CACHE_NAMES = frozenset(map(os.fsencode, CACHE_DIRS))
PRUNED_NAMES = VCS_NAMES | CACHE_NAMES

# What an entry of the listing is. A directory's key ends with "/"; sorting the keys gives git's order.
FILE, SYMLINK, IGNORED, IGNORED_DIR, CACHE_DIR, DIR, UNREADABLE = range(7)
DIR_REASONS = {IGNORED_DIR: "ignored", CACHE_DIR: "cache", UNREADABLE: "unreadable"}
Entry = tuple[bytes, int, int, int]  # key (path relative to the walk root), kind, size, mtime_ns


class WalkEvent(NamedTuple):
    """One entry met by the walk: a file, a directory entered, or something left out and why."""

    kind: str  # "file", "dir" or "skip"
    rel: str  # relative to the walk root, `/`-separated
    path: str = ""  # absolute (files)
    size: int = 0
    mtime_ns: int = 0
    reason: str = ""  # skips: why
    is_dir: bool = False  # skips: a whole directory


def walk_root(root: Path | str) -> str:
    """The absolute, symlink-free path a walk starts from: every path it lists then has no symbolic link
    in it, which is what lets the reader refuse any link met while it opens a file (chunks.open_beneath)."""
    return os.path.realpath(os.path.abspath(root))


def walk_events(root: Path) -> list[WalkEvent]:
    """Every entry of the tree under root as git sees it, in sorted path order."""
    with git_runner() as git:
        return _walk(walk_root(root), git, None)


def _walk(top: str, git: GitRunner, records: Records | None) -> list[WalkEvent]:
    """git's listing of top and the repositories nested in it, with the silent directories, as events."""
    if not stat.S_ISDIR(os.stat(top).st_mode):  # OSError for a missing root, as os.scandir would raise
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), top)
    listing = _Listing(top, git, records)
    listing.add_view(b"")
    git.close_soon()  # git is done: its throw-away directory goes while the listing is put together
    events, entered = listing.events()
    if listing.add_silent_dirs(entered):  # empty or unreadable directories: rare, so sorted again
        events, _ = listing.events()
    return events


def _parent(key: bytes) -> bytes:
    """The directory key (ending with "/", or b"" for the root) an entry's key lies in."""
    return key[: key.rfind(b"/", 0, len(key) - 1) + 1]


class _Listing:
    """The entries of one walk, gathered view by view, and the stat records of its snapshot."""

    def __init__(self, top: str, git: GitRunner, records: Records | None) -> None:
        self.top = top
        self.top_bytes = os.fsencode(top)
        self.git = git
        self.records = records
        self.entries: list[Entry] = []
        self.known_dirs: set[bytes] = set()  # directories with an entry of their own (not silent)
        self.ignored_dirs: set[bytes] = set()
        self.inputs: list[str] = [_git_binary()]
        self.read_ahead: dict[bytes, list[tuple[bytes, bool]] | None] = {}  # _read_dir's, while git ran

    def add_view(self, prefix: bytes) -> None:
        """What git lists in the directory `prefix` (b"" for the root) and in the repositories in it."""
        directory = os.path.join(self.top, os.fsdecode(prefix[:-1])) if prefix else self.top
        work = self.git.work_tree(directory)
        self.inputs.extend(work or ())
        view = self.git.view(directory, work, lambda answered: self._read_ahead(prefix, answered))
        self._add_ignored(prefix, view)
        for nested in self._add_kept(prefix, view):
            self.known_dirs.add(nested)
            self.entries.append((nested, DIR, 0, 0))
            self.add_view(nested)

    def _add_ignored(self, prefix: bytes, view: GitView) -> None:
        for path in view.ignored:
            if path[-1:] != b"/":
                if path not in view.tracked:
                    self.entries.append((prefix + path, IGNORED, 0, 0))
                continue
            key, name = prefix + path, path[:-1].rpartition(b"/")[2]
            self.known_dirs.add(key)
            if name in CACHE_NAMES:
                self.entries.append((key, CACHE_DIR, 0, 0))
            elif name not in VCS_NAMES:
                self.ignored_dirs.add(key)
                self.entries.append((key, IGNORED_DIR, 0, 0))

    def _add_kept(self, prefix: bytes, view: GitView) -> list[bytes]:
        """Add the files git keeps, stat-ed; returns the nested repositories (keys) to list."""
        nested = [prefix + path for path in view.untracked if path[-1:] == b"/"]
        files = [path for path in view.untracked if path[-1:] != b"/"] if nested else list(view.untracked)
        if view.tracked:  # tracked files in a nested repository are its business, as in git from inside
            files = sorted(view.tracked.union(files))
            if nested:
                files = [path for path in files if not (prefix + path).startswith(tuple(nested))]
        keys = [prefix + path for path in files] if prefix else files
        fields = listing_cache.stat_fields(self.top_bytes, bytes(len(keys)), keys)
        if self.records is not None:
            self.records.add(bytes(len(keys)), keys, fields)
        numbers = array("q", fields)
        kinds, sizes, mtimes = numbers[0::5], numbers[1::5], numbers[2::5]
        if kinds.count(TYPE_FILE) == len(kinds):  # the usual case: all regular files, added in one go
            self.entries.extend(zip(keys, repeat(FILE), sizes, mtimes))
            return nested
        for key, kind, size, mtime_ns in zip(keys, kinds, sizes, mtimes, strict=True):
            if kind == TYPE_FILE:
                self.entries.append((key, FILE, size, mtime_ns))
            elif kind == TYPE_SYMLINK:
                self.entries.append((key, SYMLINK, 0, 0))
            # else gone, or a directory: a submodule (git reports it as a nested repository when it is
            # checked out) or a tracked file replaced by a directory (its files are listed as untracked)
        return nested

    def add_silent_dirs(self, entered: set[bytes]) -> bool:
        """Read the directories git entered (`entered`: the root and every directory with an entry)
        for the subdirectories it listed nothing in, and record the directories and the .gitignore
        files git read; whether entries were added."""
        count = len(self.entries)
        gitignores: list[bytes] = []
        silent: list[bytes] = []
        pending = [(directory, True) for directory in entered]
        while pending:
            directory, was_entered = pending.pop()
            found = (
                self.read_ahead.pop(directory) if directory in self.read_ahead else self._read_dir(directory)
            )
            if not was_entered:
                silent.append(directory)
                self.entries.append((directory, DIR if found is not None else UNREADABLE, 0, 0))
            inside_ignored = bool(self.ignored_dirs) and self._inside_ignored(directory)
            for name, is_dir in found or ():
                key = directory + name + b"/"
                if not is_dir:
                    gitignores.append(directory + name)
                elif not (key in entered or key in self.known_dirs or name in VCS_NAMES):
                    if name in CACHE_NAMES or inside_ignored:
                        self.entries.append((key, CACHE_DIR if name in CACHE_NAMES else IGNORED_DIR, 0, 0))
                    else:
                        pending.append((key, False))
        if self.records is not None:
            self._record(entered, silent, gitignores)
        return self._leave_out_unreadable_rules(gitignores) or len(self.entries) != count

    def _leave_out_unreadable_rules(self, gitignores: list[bytes]) -> bool:
        """Leave out, as unreadable, each directory whose .gitignore cannot be read (git would list it
        without those rules, and so what they keep out); whether any was. The root's is an error."""
        left_out = False
        for path in sorted(gitignores):
            try:
                where = os.path.join(self.top, os.fsdecode(path))
                os.close(os.open(where, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW))
            except PermissionError:
                directory = path[: -len(b".gitignore")]
                if not directory:
                    raise
                self.entries = [entry for entry in self.entries if not entry[0].startswith(directory)]
                self.entries.append((directory, UNREADABLE, 0, 0))
                left_out = True
            except OSError:  # gone since, or a symlink (git does not follow those either)
                continue
        return left_out

    def _inside_ignored(self, directory: bytes) -> bool:
        while directory:
            if directory in self.ignored_dirs:
                return True
            directory = _parent(directory)
        return False

    def _read_ahead(self, prefix: bytes, answered: Callable[[], bool]) -> None:
        """While git reads the tree below prefix, read its directories as add_silent_dirs will (most
        of them, it turns out): top down, VCS and cache directories left out, until git answers."""
        pending = deque([prefix])
        while pending and not answered():
            directory = pending.popleft()
            found = self.read_ahead[directory] = self._read_dir(directory)
            pending.extend(
                directory + name + b"/" for name, is_dir in found or () if is_dir and name not in PRUNED_NAMES
            )

    def _read_dir(self, directory: bytes) -> list[tuple[bytes, bool]] | None:
        """The subdirectories (True) and .gitignore files (False) of a directory; None if unreadable."""
        path = self.top_bytes + b"/" + directory if directory else self.top_bytes
        try:
            with os.scandir(path) as scan:
                return [
                    (entry.name, is_dir)
                    for entry in scan
                    if (is_dir := entry.is_dir(follow_symlinks=False)) or entry.name == b".gitignore"
                ]
        except OSError:
            return None

    def _record(self, entered: set[bytes], silent: list[bytes], gitignores: list[bytes]) -> None:
        assert self.records is not None
        dirs = [key[:-1] for key in (*sorted(entered), *silent)]
        modes = bytes([FOLLOW]) + bytes(len(dirs) - 1 + len(gitignores))  # the root ("") is followed
        self.records.add_unstated(self.top_bytes, modes, [*dirs, *gitignores])
        inputs = list(map(os.fsencode, self.inputs))
        self.records.add_unstated(self.top_bytes, bytes([FOLLOW]) * len(inputs), inputs)

    def events(self) -> tuple[list[WalkEvent], set[bytes]]:
        """The entries as walk events, in git's order, with a "dir" event before each directory's
        entries; and the directories entered (keys, with the root b"")."""
        entries = sorted(self.entries)
        events: list[WalkEvent] = []
        add = events.append
        new = tuple.__new__
        opened = [b""]  # the directories the current entry lies in, outermost first
        entered = {b""}
        pruned = b"\0"  # the VCS or cache directory being passed over (a key no entry starts with)
        top = os.path.join(self.top, "")
        current = b""  # opened[-1]
        native = accel.stat_module()
        index = 0
        while index < len(entries):
            if native is not None:  # the files of the open directory, natively
                index = native.file_events(entries, index, current, top, WalkEvent, events)
                if index == len(entries):
                    break
            key, kind, size, mtime_ns = entries[index]
            index += 1
            if kind == FILE and key.startswith(current) and key.find(b"/", len(current)) < 0:
                rel = key.decode(ENCODING, ERRORS)  # a file in the open directory: the usual case
                add(new(WalkEvent, ("file", rel, top + rel, size, mtime_ns, "", False)))
                continue
            if key.startswith(pruned):
                continue
            if kind == IGNORED_DIR and index < len(entries) and entries[index][0].startswith(key):
                kind = DIR  # ignored, but with tracked files below: entered for those
            end = len(key) - 1 if kind >= IGNORED_DIR else len(key)  # a directory's key ends with "/"
            parent = key[: key.rfind(b"/", 0, end) + 1]
            if parent != opened[-1]:
                pruned = self._open_dirs(parent, opened, entered, add) or pruned
                current = opened[-1]
                if key.startswith(pruned):
                    continue
            rel = key[:end].decode(ENCODING, ERRORS)
            if kind == FILE:
                add(new(WalkEvent, ("file", rel, top + rel, size, mtime_ns, "", False)))
            elif kind == DIR and key[len(parent) : end] not in PRUNED_NAMES:
                add(new(WalkEvent, ("dir", rel, "", 0, 0, "", False)))
                opened.append(key)
                entered.add(key)
                current = key
            elif kind == DIR:  # a repository nested as a cache or VCS directory: passed over too
                pruned = self._prune(key, add)
            else:
                pruned = key if kind == CACHE_DIR else pruned  # tracked files in a cache: not read either
                reason = DIR_REASONS.get(kind) or ("symlink" if kind == SYMLINK else "ignored")
                add(new(WalkEvent, ("skip", rel, "", 0, 0, reason, kind in DIR_REASONS)))
        return events, entered

    def _open_dirs(
        self, parent: bytes, opened: list[bytes], entered: set[bytes], add: Callable[[WalkEvent], None]
    ) -> bytes | None:
        """Close the directories `parent` is not in, then open (with a "dir" event) those it is in;
        the first VCS or cache directory among them is not opened but returned (passed over)."""
        while not parent.startswith(opened[-1]):
            opened.pop()
        at = len(opened[-1])
        while at < len(parent):
            start, at = at, parent.index(b"/", at) + 1
            if parent[start : at - 1] in PRUNED_NAMES:
                return self._prune(parent[:at], add)
            opened.append(parent[:at])
            entered.add(parent[:at])
            add(WalkEvent("dir", parent[: at - 1].decode(ENCODING, ERRORS)))
        return None

    def _prune(self, key: bytes, add: Callable[[WalkEvent], None]) -> bytes:
        """Pass over the VCS or cache directory `key` (git listed something in it): a cache is one skip."""
        self.known_dirs.add(key)
        if key[key.rfind(b"/", 0, len(key) - 1) + 1 : -1] in CACHE_NAMES:
            add(WalkEvent("skip", key[:-1].decode(ENCODING, ERRORS), reason="cache", is_dir=True))
        return key


def _git_binary() -> str:
    """The git executable (its stat changes when git is upgraded, and its rules may with it)."""
    found = shutil.which("git")
    return os.path.realpath(found) if found else "git"


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
    directory, a snapshot of the walk is stored there for `directory_fingerprint`.
    """
    top = walk_root(root)
    with (
        garbage_collection_paused(),
        listing_cache.snapshot_writer(cache_dir, top, selector, salt) as snapshot,
        git_runner() as git,
    ):
        records = Records() if snapshot is not None else None
        events = _walk(top, git, records)
        listing = DirListing(top, events, files_fingerprint(events, selector, salt))
        if snapshot is not None and records is not None:
            listing_cache.save_snapshot(snapshot, listing.fingerprint, records)
    _recent[top, listing.fingerprint] = listing
    while len(_recent) > LISTING_CACHE_SIZE:
        _recent.popitem(last=False)
    return listing


def files_fingerprint(events: list[WalkEvent], selector: PathSelector | None, salt: str) -> str:
    """SHA-1 of the salt, then `rel NUL size NUL mtime_ns LF` per selected file."""
    digest = hashlib.sha1(salt.encode())
    native = accel.stat_module()
    text = native.fingerprint_lines(events) if native is not None and not selector else None
    if text is not None:
        digest.update(text)
        return digest.hexdigest()
    lines = (
        f"{event.rel}\0{event.size}\0{event.mtime_ns}\n"
        for event in events
        if event.kind == "file" and (not selector or selector.accepts(event.rel))
    )
    digest.update("".join(lines).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def recent_listing(root: str, fingerprint: str) -> DirListing | None:
    """The listing this process made of root with that fingerprint, if it still has it."""
    return _recent.get((walk_root(root), fingerprint))


def directory_fingerprint(
    root: Path, selector: PathSelector | None = None, salt: str = "", cache_dir: Path | None = None
) -> str:
    """The fingerprint of list_directory; from the snapshot in cache_dir, without a walk, when nothing
    it recorded has changed."""
    top = walk_root(root)
    usable = listing_cache.usable_cache(cache_dir, top)
    if usable is not None:
        cached = listing_cache.cached_fingerprint(usable, top, selector, salt)
        if cached is not None:
            return cached
    return list_directory(Path(top), selector, salt, cache_dir).fingerprint
