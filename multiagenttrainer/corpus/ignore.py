""".gitignore rules as git applies them during a walk, and include/exclude globs.

Git decides each entry of a directory with the ignore files of that directory and its parents:
the deepest file that has a matching pattern decides, and within one file the last matching
pattern wins; `.git/info/exclude` is consulted after every .gitignore. A directory that is
ignored is not entered, so nothing below it can be re-included. `IgnoreStack` implements
exactly that for a walk that checks every directory before entering it; the pattern semantics
(anchoring, `**`, directory-only patterns, `dir/**`) come from dulwich's `Pattern`.

Paths here are bytes relative to the walk root, with `/` separators and no trailing slash.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dulwich.ignore import Pattern, read_ignore_patterns, translate
from dulwich.wildmatch import MalformedPattern
from pathspec import GitIgnoreSpec

log = logging.getLogger(__name__)


class IgnoreFile:
    """The patterns of one ignore file, matched against paths relative to its directory."""

    def __init__(self, lines: Iterable[bytes], origin: str = "<patterns>") -> None:
        self.patterns: list[Pattern] = []
        for line in lines:
            try:
                self.patterns.append(Pattern(line))
            except MalformedPattern:
                log.warning("%s: ignoring malformed pattern %r", origin, line.decode(errors="replace"))
        self._file_regex = _any_file_regex(self.patterns)

    @classmethod
    def read(cls, path: Path) -> IgnoreFile:
        """Parse an ignore file (comments, blank lines and escaped spaces as git reads them)."""
        with open(path, "rb") as handle:
            return cls(list(read_ignore_patterns(handle)), str(path))

    def git_rules(self) -> list[tuple[bytes, bool, bool]]:
        """The patterns as git's matcher takes them: (body, negated, dir_only), for the native walk.

        The body is the line without its `!` and without one trailing `/` (a leading `\\!` or `\\#`
        stays: the matcher reads the backslash as an escape, as git does). Patterns that can never
        match (`!`, `/`) are left out.
        """
        rules = []
        for pattern in self.patterns:
            if pattern.is_empty:
                continue
            body = pattern.pattern[1:] if not pattern.is_exclude else pattern.pattern
            dir_only = body.endswith(b"/")
            rules.append((body[:-1] if dir_only else body, not pattern.is_exclude, dir_only))
        return rules

    def decide(self, rel: bytes, is_dir: bool) -> bool | None:
        """True: the last matching pattern ignores `rel`; False: it re-includes it; None: none matches."""
        if not is_dir and self._file_regex is not None:
            return True if self._file_regex.match(rel) else None
        for pattern in reversed(self.patterns):
            if pattern.matches(rel, is_dir):
                return pattern.is_exclude
        return None


def _any_file_regex(patterns: Sequence[Pattern]) -> re.Pattern[bytes] | None:
    """One regex for "does any pattern ignore this file", valid only when no pattern negates."""
    live = [p for p in patterns if not p.is_empty]
    if any(not p.is_exclude for p in live):
        return None
    names = [_pattern_text(p).rstrip(b"/") for p in live if not p.is_directory_only]
    if not names:
        return re.compile(b"(?!)")  # matches nothing: only directory patterns
    # translate() starts every regex with the same inline flags; hoist them to the front.
    bodies = [translate(name).removeprefix(b"(?ms)") for name in names]
    return re.compile(b"(?ms)(?:" + b")|(?:".join(bodies) + b")")


def _pattern_text(pattern: Pattern) -> bytes:
    """The pattern as dulwich matches it: without the escape of a leading `!` or `#`."""
    text = pattern.pattern
    if text[:1] == b"\\" and text[1:2] in (b"!", b"#"):
        return text[1:]
    return text


@dataclass(frozen=True)
class IgnoreLevel:
    """An ignore file and the directory (relative, with a trailing slash, or empty) it applies below."""

    prefix: bytes
    rules: IgnoreFile


class IgnoreStack:
    """The ignore files in force in one directory of a walk, shallowest first."""

    def __init__(self, levels: tuple[IgnoreLevel, ...] = ()) -> None:
        self.levels = levels

    def push(self, prefix: bytes, rules: IgnoreFile) -> IgnoreStack:
        """The stack for a subdirectory that has its own .gitignore."""
        return IgnoreStack((*self.levels, IgnoreLevel(prefix, rules)))

    def is_ignored(self, rel: bytes, is_dir: bool) -> bool:
        """Whether git ignores the entry `rel` (its parent directories are known not to be ignored)."""
        for level in reversed(self.levels):
            decision = level.rules.decide(rel[len(level.prefix) :], is_dir)
            if decision is not None:
                return decision
        return False


def root_ignore_stack(root: Path) -> IgnoreStack:
    """The rules in force at the top of a walk: `.git/info/exclude` when root is a work tree."""
    exclude = root / ".git" / "info" / "exclude"
    if exclude.is_file():
        return IgnoreStack((IgnoreLevel(b"", IgnoreFile.read(exclude)),))
    return IgnoreStack()


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
