"""Counting what went into the corpus and what did not, for stats.json.

stats.json holds: files and bytes kept (original file sizes), skipped files per reason and
directories left out whole per reason, files kept with replacement characters, secrets redacted
(total and per rule), the train/val split, per source (type, files, bytes, version, commits per
repo, skipped per reason, warnings), the output paths and sizes, the build fingerprint, time
taken and creation time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import compress
from typing import Any

from multiagenttrainer.corpus.chunks import ChunkResult
from multiagenttrainer.corpus.plan import CorpusPlan
from multiagenttrainer.snapshot import Snapshot


def _bump(counts: dict[str, int], key: str, by: int = 1) -> None:
    counts[key] = counts.get(key, 0) + by


@dataclass
class SourceCounts:
    """One source's line in stats.json."""

    type: str
    version: str
    commits: dict[str, str]
    warnings: list[str]
    files: int = 0
    bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "files": self.files,
            "bytes": self.bytes,
            "version": self.version,
            "commits": self.commits,
            "skipped": dict(sorted(self.skipped.items())),
            "warnings": self.warnings,
        }


class CorpusStats:
    """Accumulates counts from the plan and from each chunk as it is assembled."""

    def __init__(self, plan: CorpusPlan, snapshots: list[Snapshot]) -> None:
        self.tree_sources = [tree.source for tree in plan.trees]
        self.sources = {
            s.source: SourceCounts(
                s.type, s.version, {t.repo: t.commit for t in s.trees if t.commit}, list(s.warnings)
            )
            for s in snapshots
        }
        self.files = self.bytes = self.replaced_encoding = 0
        self.skipped: dict[str, int] = {}
        self.skipped_dirs: dict[str, int] = {}
        self.secrets: dict[str, int] = {}
        self.splits = {"train": {"files": 0, "bytes": 0}, "val": {"files": 0, "bytes": 0}}
        for tree, skips in enumerate(plan.skips):
            for reason, count in skips.files.items():
                self.skip(tree, reason, count)
            for reason, count in skips.dirs.items():
                _bump(self.skipped_dirs, reason, count)

    def skip(self, tree: int, reason: str, count: int = 1) -> None:
        _bump(self.skipped, reason, count)
        _bump(self.sources[self.tree_sources[tree]].skipped, reason, count)

    def add_chunk(self, result: ChunkResult, keep: list[bool]) -> None:
        """Count a chunk's records; those not kept duplicate a record of an earlier chunk.

        Column at a time: the parent counts while the workers work, so this stays cheap.
        """
        for (tree, reason), count in result.skipped.items():
            self.skip(tree, reason, count)
        self.replaced_encoding += result.replaced_encoding
        for tree in compress(result.trees, [not kept for kept in keep]):
            self.skip(tree, "duplicate")
        sizes = list(compress(result.sizes, keep))
        trees = list(compress(result.trees, keep))
        splits = list(compress(result.splits, keep))
        for tree in set(trees):
            source = self.sources[self.tree_sources[tree]]
            tree_sizes = (
                sizes
                if len(trees) == trees.count(tree)
                else [size for size, owner in zip(sizes, trees, strict=True) if owner == tree]
            )
            source.files += len(tree_sizes)
            source.bytes += sum(tree_sizes)
        for split in set(splits):
            split_sizes = [size for size, name in zip(sizes, splits, strict=True) if name == split]
            self.splits[split]["files"] += len(split_sizes)
            self.splits[split]["bytes"] += sum(split_sizes)
        self.files += len(sizes)
        self.bytes += sum(sizes)
        for position, found in result.secrets.items():
            if keep[position]:
                for rule, count in found.items():
                    _bump(self.secrets, rule, count)

    def summary(self, **extra: Any) -> dict[str, Any]:
        """The stats.json content; `extra` adds fingerprint, paths, sizes, timing."""
        return {
            "files": self.files,
            "bytes": self.bytes,
            "skipped": dict(sorted(self.skipped.items())),
            "skipped_dirs": dict(sorted(self.skipped_dirs.items())),
            "replaced_encoding": self.replaced_encoding,
            "secrets_redacted": sum(self.secrets.values()),
            "secrets_by_rule": dict(sorted(self.secrets.items())),
            "splits": self.splits,
            "sources": {name: counts.as_dict() for name, counts in self.sources.items()},
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "reused": False,
            **extra,
        }
