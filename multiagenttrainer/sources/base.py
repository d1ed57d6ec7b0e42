"""What every source type provides.

A source is resolved (a cheap look-up of what it would fetch, e.g. a remote HEAD SHA), then
fetched into the staging directory. Fetching returns a `Snapshot` (multiagenttrainer/snapshot.py):
plain data naming the file trees to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from multiagenttrainer.snapshot import Snapshot, SourceContext, Tree, TreeKind

__all__ = ["Snapshot", "Source", "SourceContext", "SourceInfo", "Tree", "TreeKind"]


@dataclass(frozen=True)
class SourceInfo:
    """One row of `mat sources`."""

    name: str
    type: str
    location: str
    branch: str | None = None


class Source(Protocol):
    """One configured data source."""

    name: str

    def describe(self) -> SourceInfo:
        """Name, type, location and branch, without touching the network."""
        ...

    def resolve(self) -> str | None:
        """A cheap key for what `fetch` would produce (commit SHAs), or None when unknowable."""
        ...

    def fetch(self, staging: Path) -> Snapshot:
        """Fetch into `staging` (a directory owned by this source) and describe the result."""
        ...
