"""Listing what the corpus will read: every tree of every snapshot, with the path rules applied.

Files come in corpus order: sources in config order, trees in snapshot order, paths sorted within
a tree (docs: in record order). Files are not read here; path rules (ignore files, globs, vendored
and cache directories, lock files, generated and minified names, sizes known from the walk) decide
what is left out early. A lister per tree kind (a registry) lists git and docs trees file by file;
a directory tree is listed by its walk and cut into spans whose files are planned where the chunk
runs, in a worker (plan_files), so a large tree's plan is not on the critical path.
"""

from __future__ import annotations

import stat
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate, groupby
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

import orjson
from dulwich.errors import NotGitRepository
from dulwich.object_store import BaseObjectStore
from dulwich.objects import Commit, ObjectID, Tree
from dulwich.repo import Repo

from multiagenttrainer.config import CorpusConfig
from multiagenttrainer.corpus import accel
from multiagenttrainer.corpus.filters import (
    LOCK_FILES,
    NAME_HINTS,
    VENDORED_DIRS,
    name_skip_reason,
    path_skip_reason,
    pruned_dir_reason,
)
from multiagenttrainer.corpus.ignore import PathSelector
from multiagenttrainer.corpus.walk import DirListing, WalkEvent, list_directory, recent_listing
from multiagenttrainer.errors import CorpusError
from multiagenttrainer.snapshot import Snapshot
from multiagenttrainer.snapshot import Tree as SourceTree

UNKNOWN_SIZE = -1
CHUNK_BYTES = 1 << 20  # work is handed to worker processes in chunks of about this many bytes
CHUNK_FILES = 1000  # also bounds the size of the messages to and from workers
GIT_BLOB_ESTIMATE = 16 << 10  # git trees list no sizes; assume this for chunking


@dataclass(frozen=True)
class TreeInfo:
    """What the corpus needs to know about one fetched tree (picklable, for worker processes)."""

    source: str
    repo: str
    kind: str
    path: str
    commit: str | None


class Item(NamedTuple):
    """One file to read: dir -> absolute path, git -> blob SHA (hex), docs -> the text as UTF-8."""

    tree: int
    path: str
    ref: str | bytes
    size: int


Listed = tuple[str, "str | bytes", int]  # path, ref, size
SkipHook = Callable[[str, bool], None]


@dataclass
class Skips:
    """Skip counts for one tree: files by reason, and directories left out whole."""

    files: dict[str, int] = field(default_factory=dict)
    dirs: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str, is_dir: bool = False) -> None:
        counts = self.dirs if is_dir else self.files
        counts[reason] = counts.get(reason, 0) + 1


@dataclass(frozen=True)
class FileSpan:
    """A stretch of a directory tree's listing, events[start:stop], whose files are planned where the
    chunk is processed (by a worker, in parallel) rather than up front."""

    tree: int
    events: list[WalkEvent]
    start: int
    stop: int
    pruned: tuple[tuple[int, int], ...]  # vendored subtrees (event ranges) to leave out
    options: ListOptions
    selector: PathSelector

    def items(self, on_skip: SkipHook) -> tuple[list[Item], int]:
        """The span's files to read, and how many files it has (skipped ones included)."""
        return plan_files(self, on_skip)


@dataclass
class DirFiles:
    """The files of one directory tree, before their name and size rules, to be cut into spans."""

    tree: int
    events: list[WalkEvent]
    ends: list[int]  # ends[i]: bytes of the files in events[0..i] that can be read
    pruned: list[tuple[int, int]]
    files: int
    options: ListOptions
    selector: PathSelector

    def spans(self, max_bytes: int, max_events: int) -> Iterator[FileSpan]:
        """Consecutive stretches of about max_bytes of files each, never starting inside a pruned subtree."""
        ends, start, base = self.ends, 0, 0
        while start < len(ends):
            stop = min(bisect_left(ends, base + max_bytes, lo=start) + 1, start + max_events, len(ends))
            for low, high in self.pruned:  # a pruned subtree is never cut in two
                if low < stop < high:
                    stop = high
            inside = tuple(interval for interval in self.pruned if interval[0] < stop and interval[1] > start)
            yield FileSpan(self.tree, self.events, start, stop, inside, self.options, self.selector)
            start, base = stop, ends[stop - 1]


@dataclass
class CorpusPlan:
    """Every tree, every file to read in corpus order, and what the path rules left out.

    Directory trees are listed by their walk and planned file by file only when their chunks are
    processed (`dir_files`); git and docs trees are planned here, into `items`.
    """

    trees: list[TreeInfo] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    skips: list[Skips] = field(default_factory=list)  # per tree
    dir_files: dict[int, DirFiles] = field(default_factory=dict)  # tree index -> its files

    def files(self) -> int:
        """Files the build will look at: progress counts these."""
        return len(self.items) + sum(d.files for d in self.dir_files.values())

    def planned_bytes(self) -> int:
        items = sum(GIT_BLOB_ESTIMATE if size < 0 else size for size in map(itemgetter(3), self.items))
        return items + sum(d.ends[-1] for d in self.dir_files.values() if d.ends)

    def chunks(
        self, max_bytes: int = CHUNK_BYTES, max_files: int = CHUNK_FILES
    ) -> Iterator[list[Item] | FileSpan]:
        """The work in corpus order: runs of items of about max_bytes each (a run ends with the item
        that reaches it), and spans of directory trees of about as many bytes."""
        by_tree = {tree: list(group) for tree, group in groupby(self.items, key=itemgetter(0))}
        for tree in range(len(self.trees)):
            if tree in self.dir_files:
                yield from self.dir_files[tree].spans(max_bytes, max_files)
            else:
                yield from _item_runs(by_tree.get(tree, []), max_bytes, max_files)


def _item_runs(items: list[Item], max_bytes: int, max_files: int) -> Iterator[list[Item]]:
    sizes = [GIT_BLOB_ESTIMATE if size < 0 else size for size in map(itemgetter(3), items)]
    ends = list(accumulate(sizes))  # ends[i]: bytes of items[0..i]
    start, base = 0, 0
    while start < len(items):
        stop = min(bisect_left(ends, base + max_bytes, lo=start) + 1, start + max_files, len(items))
        yield items[start:stop]
        start, base = stop, ends[stop - 1]


@dataclass(frozen=True)
class ListOptions:
    """The corpus options a lister needs."""

    skip_vendored: bool
    skip_generated: bool
    max_file_bytes: int


def display_path(path: str) -> str:
    """A path safe for JSON and one-line headers: undecodable bytes as U+FFFD, no line breaks."""
    if not path.isascii():
        path = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return path.replace("\n", " ").replace("\r", " ")


def dir_listing(tree: SourceTree, version: str) -> DirListing:
    """The git-aware walk of a directory tree: the fetch's, if this process just made it."""
    return recent_listing(tree.path, version) or list_directory(Path(tree.path))


def _plan_dir_tree(
    plan: CorpusPlan,
    index: int,
    tree: SourceTree,
    version: str,
    options: ListOptions,
    selector: PathSelector,
    skips: Skips,
) -> None:
    """A directory tree: its skipped entries are counted and its vendored subtrees found here; its
    files are planned per span (plan_files), where the chunks are processed."""
    events = dir_listing(tree, version).events
    kinds = list(map(itemgetter(0), events))
    readable = [
        size if kind == "file" and size <= options.max_file_bytes else 0
        for kind, size in zip(kinds, map(itemgetter(3), events), strict=True)
    ]
    pruned: list[tuple[int, int]] = []
    resume = 0
    for position in [i for i, kind in enumerate(kinds) if kind != "file"]:
        if position < resume:
            continue  # inside a vendored subtree: left out whole, nothing in it counted
        event = events[position]
        if event.kind == "skip":
            skips.add(event.reason, event.is_dir)
        elif options.skip_vendored and event.rel.rpartition("/")[2] in VENDORED_DIRS:
            skips.add("vendored", True)
            resume = _subtree_end(events, position)
            pruned.append((position + 1, resume))
            readable[position + 1 : resume] = [0] * (resume - position - 1)
    files = kinds.count("file") - sum(kinds[low:high].count("file") for low, high in pruned)
    plan.dir_files[index] = DirFiles(
        index, events, list(accumulate(readable)), pruned, files, options, selector
    )


def _subtree_end(events: list[WalkEvent], position: int) -> int:
    """The index after the last event below the directory at events[position] (they are contiguous)."""
    prefix = events[position].rel + "/"
    end = position + 1
    while end < len(events) and events[end].rel.startswith(prefix):
        end += 1
    return end


def plan_files(span: FileSpan, on_skip: SkipHook) -> tuple[list[Item], int]:
    """The files of a span to read, applying the name, size and include/exclude rules; and how many
    files the span has. Natively where the encoder is built (the same answer: tests compare them)."""
    native = accel.encoder()
    limit = span.options.max_file_bytes
    if native is None or not -(2**63) <= limit < 2**63:
        return plan_files_python(span, on_skip)
    items, files = native.plan_span(
        events=span.events,
        start=span.start,
        stop=span.stop,
        pruned=tuple(span.pruned),
        tree=span.tree,
        limit=limit,
        skip_generated=span.options.skip_generated,
        accepts=span.selector.accepts if span.selector else None,
        lock_files=LOCK_FILES,
        hints=NAME_HINTS,
        name_rule=name_skip_reason,
        display_path=display_path,
        item_type=Item,
        on_skip=on_skip,
    )
    return items, files


def plan_files_python(span: FileSpan, on_skip: SkipHook) -> tuple[list[Item], int]:
    """plan_files in Python, the reference: one tight loop, for every file of a large tree."""
    new_tuple = tuple.__new__
    items: list[Item] = []
    append = items.append
    options, selector, events, index = span.options, span.selector, span.events, span.tree
    limit, skip_generated, selecting = options.max_file_bytes, options.skip_generated, bool(selector)
    pruned = iter(span.pruned)
    low, high = next(pruned, (span.stop, span.stop))
    files = 0
    position = span.start
    while position < span.stop:
        if position == low:  # a vendored subtree: left out whole
            position = high
            low, high = next(pruned, (span.stop, span.stop))
            continue
        kind, rel, ref, size = events[position][:4]
        position += 1
        if kind != "file":
            continue
        files += 1
        reason = name_skip_reason(rel[rel.rfind("/") + 1 :], skip_generated)
        if reason is None and (size == 0 or size > limit):
            reason = "empty" if size == 0 else "too_large"
        if reason is None and selecting and not selector.accepts(rel):
            reason = "excluded"
        if reason is None:
            plain = rel.isascii() and "\n" not in rel and "\r" not in rel
            append(new_tuple(Item, (index, rel if plain else display_path(rel), ref, size)))
        else:
            on_skip(reason, False)
    return items, files


def list_git(tree: SourceTree, version: str, options: ListOptions, on_skip: SkipHook) -> Iterator[Listed]:
    """A bare repository: the commit's tree, read from the object store without a checkout."""
    with Repo(tree.path) as repo:
        commit = repo[tree.commit.encode()] if tree.commit else repo[repo.head()]
        if not isinstance(commit, Commit):
            raise CorpusError(f"{tree.commit} in {tree.path} is not a commit")
        yield from _walk_git_tree(repo.object_store, commit.tree, "", options, on_skip)


def _walk_git_tree(
    store: BaseObjectStore, tree_id: ObjectID, prefix: str, options: ListOptions, on_skip: SkipHook
) -> Iterator[Listed]:
    tree = store[tree_id]
    if not isinstance(tree, Tree):
        raise CorpusError(f"object {tree_id.decode()} at {prefix or '/'} is not a tree")
    for entry in tree.iteritems():  # git order: directories sort as `name/`
        name = entry.path.decode("utf-8", "surrogateescape")
        if stat.S_ISDIR(entry.mode):
            reason = pruned_dir_reason(name, options.skip_vendored)
            if reason:
                on_skip(reason, True)
            else:
                yield from _walk_git_tree(store, entry.sha, prefix + name + "/", options, on_skip)
        elif stat.S_ISREG(entry.mode):
            reason = name_skip_reason(name, options.skip_generated)
            if reason:
                on_skip(reason, False)
            else:
                yield prefix + name, entry.sha.decode(), UNKNOWN_SIZE
        else:  # a submodule (gitlink) or a symlink: nothing to read in this repository
            on_skip("submodule" if entry.mode == 0o160000 else "symlink", False)


def list_docs(tree: SourceTree, version: str, options: ListOptions, on_skip: SkipHook) -> Iterator[Listed]:
    """A JSONL file of {"path": provenance, "text": ...} records, in file order."""
    with open(tree.path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            path, text = _doc_record(line, number, tree.path)
            reason = (
                path_skip_reason(path, options.skip_vendored, options.skip_generated) if text else "empty"
            )
            if reason:
                on_skip(reason, False)
            else:
                data = text.encode("utf-8", "replace")
                yield path, data, len(data)


def _doc_record(line: bytes, number: int, origin: str) -> tuple[str, str]:
    """(path, text) of one docs record; a record without a path is named after its line."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise CorpusError(f"{origin}:{number} is not a JSON record ({exc})") from None
    if not isinstance(record, dict):
        raise CorpusError(f"{origin}:{number} is not a JSON object")
    text = record.get("text")
    return str(record.get("path") or f"record-{number}"), text if isinstance(text, str) else ""


# Trees whose files are listed here, one by one; directory trees are planned in spans (_plan_dir_tree).
LISTERS: dict[str, Callable[[SourceTree, str, ListOptions, SkipHook], Iterator[Listed]]] = {
    "git": list_git,
    "docs": list_docs,
}
KINDS = ("dir", *LISTERS)


def plan_corpus(snapshots: list[Snapshot], options: CorpusConfig) -> CorpusPlan:
    """List every file of every snapshot's trees, minus what the path rules leave out."""
    plan = CorpusPlan()
    list_options = ListOptions(options.skip_vendored, options.skip_generated, options.max_file_bytes)
    for snapshot in snapshots:
        selector = PathSelector.from_lists(
            [options.include, snapshot.include], [options.exclude, snapshot.exclude]
        )
        for tree in snapshot.trees:
            plan_tree(plan, snapshot, tree, selector, list_options)
    return plan


def plan_tree(
    plan: CorpusPlan, snapshot: Snapshot, tree: SourceTree, selector: PathSelector, options: ListOptions
) -> None:
    """Append one tree's files to the plan."""
    index = len(plan.trees)
    plan.trees.append(TreeInfo(snapshot.source, display_path(tree.repo), tree.kind, tree.path, tree.commit))
    skips = Skips()
    plan.skips.append(skips)
    if tree.kind not in KINDS:
        raise CorpusError(
            f"source {snapshot.source!r}: unknown tree kind {tree.kind!r}; valid: {', '.join(KINDS)}"
        )
    try:
        if tree.kind == "dir":
            _plan_dir_tree(plan, index, tree, snapshot.version, options, selector, skips)
            return
        for path, ref, size in LISTERS[tree.kind](tree, snapshot.version, options, skips.add):
            if selector and not selector.accepts(path):
                skips.add("excluded")
            else:
                plan.items.append(Item(index, display_path(path), ref, size))
    except (OSError, NotGitRepository, KeyError) as exc:
        raise CorpusError(
            f"source {snapshot.source!r}: cannot read {tree.kind} tree {tree.path} ({exc}); "
            "run `mat ingest` again to fetch it"
        ) from exc
    except CorpusError as exc:
        raise CorpusError(f"source {snapshot.source!r}: {exc}") from exc
