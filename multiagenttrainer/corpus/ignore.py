"""Include/exclude globs with gitignore semantics, matched against whole relative paths (pathspec).

.gitignore files themselves are not matched here: which files a directory walk keeps is git's
own answer (gitview.py, walk.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pathspec import GitIgnoreSpec


class GlobSet:
    """Include or exclude globs with gitignore semantics, matched against whole relative paths.

    A pattern without a slash matches at any depth (`*.md` is every Markdown file), a leading
    slash anchors to the tree root, `**` crosses directories, `dir/` covers everything below
    `dir`, and a later `!pattern` takes an earlier match back.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = [p for p in patterns if p.strip()]
        self._spec = GitIgnoreSpec.from_lines(self.patterns)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def matches(self, path: str) -> bool:
        """Whether `path` (relative, `/`-separated) is selected by these globs."""
        return bool(self._spec.match_file(path))


@dataclass(frozen=True)
class PathSelector:
    """Include/exclude glob lists combined: every include list must select a file, no exclude list may.

    An include list means "only these"; options-wide and per-source lists both apply, and an
    exclude wins over any include.
    """

    includes: tuple[GlobSet, ...] = ()
    excludes: tuple[GlobSet, ...] = ()

    @classmethod
    def from_lists(cls, includes: Iterable[Sequence[str]], excludes: Iterable[Sequence[str]]) -> PathSelector:
        """A selector from several include lists and several exclude lists (empty lists are dropped)."""
        return cls(
            tuple(g for g in map(GlobSet, includes) if g), tuple(g for g in map(GlobSet, excludes) if g)
        )

    def __bool__(self) -> bool:
        return bool(self.includes or self.excludes)

    def accepts(self, path: str) -> bool:
        """Whether a file at `path` is selected."""
        if any(glob.matches(path) for glob in self.excludes):
            return False
        return all(glob.matches(path) for glob in self.includes)
