"""What a source hands to the corpus builder: the file trees it fetched, and the context sources run in.

These types sit below both `sources/` (which produces snapshots) and `corpus/` (which reads them), so
neither package imports the other for them. A Snapshot is plain data naming the trees to read, so it can
cross process boundaries (Prefect tasks pass it as JSON).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from multiagenttrainer.config import GithubConfig

TreeKind = Literal["dir", "git", "docs"]


@dataclass(frozen=True)
class Tree:
    """A set of files produced by a fetch.

    kind "dir":  `path` is a directory on disk (a work tree or a plain folder).
    kind "git":  `path` is a bare git repository; files are read from `commit`'s tree.
    kind "docs": `path` is a JSONL file of {"path": provenance, "text": ...} records.
    """

    repo: str
    kind: TreeKind
    path: str
    commit: str | None = None


@dataclass
class Snapshot:
    """The result of fetching one source; JSON-serialisable.

    `warnings` are notes (an empty repository skipped); `failures` name the parts the source should
    have fetched and could not (`owner/repo: reason`): the snapshot is then incomplete, which makes
    the ingest fail (exit 1) while the corpus keeps everything that was fetched.
    """

    source: str
    type: str
    version: str
    trees: list[Tree] = field(default_factory=list)
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        values = dict(data)
        values["trees"] = [Tree(**tree) for tree in values.get("trees", [])]
        return cls(**values)

    def failure_summary(self) -> str | None:
        """`2 repositories not fetched (3 were): a/x: reason; a/y: reason`, or None when complete."""
        if not self.failures:
            return None
        count = f"{len(self.failures)} repositor{'y' if len(self.failures) == 1 else 'ies'}"
        return f"{count} not fetched ({len(self.trees)} were): " + "; ".join(self.failures)

    def is_present(self) -> bool:
        """Whether every tree this snapshot names still exists on disk."""
        return all(Path(tree.path).exists() for tree in self.trees)


@dataclass(frozen=True)
class SourceContext:
    """Settings every source may need; secrets are read from `env`, never from the config file."""

    github: GithubConfig = field(default_factory=GithubConfig)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    timeout_s: float = 30.0
    # Where sources may keep what lets the next run skip work (local_repo's listing snapshots); None: nowhere.
    cache_dir: Path | None = None

    def secret(self, variable: str | None) -> str | None:
        """The value of an environment variable holding a token, or None when unset or empty."""
        if not variable:
            return None
        return self.env.get(variable) or None
