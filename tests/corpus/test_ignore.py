"""The walk's .gitignore handling matches git itself; include/exclude globs behave like gitignore patterns."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dulwich.ignore import Pattern

from multiagenttrainer.corpus.ignore import IgnoreFile, PathSelector
from multiagenttrainer.corpus.walk import walk_events
from tests.corpus.conftest import git, write_tree

ROOT_GITIGNORE = "\n".join(
    [
        "# comment",
        "*.log",
        "!keep.log",
        "/anchored.txt",
        "build/",
        "docs/**/*.tmp",
        "cache/*",
        "!cache/keep/",
        "data/**",
        "!data/important.csv",
        r"\!bang.txt",
        r"\#hash.txt",
        "trailing.txt   ",
        "**/deep/secret",
        "abc?.md",
        "[xy]z.txt",
        "",
    ]
)
FILES = {
    ".gitignore": ROOT_GITIGNORE,
    ".git/info/exclude": "local-only/\n*.swp\n",
    "a.log": "",
    "keep.log": "",
    "b.txt": "",
    "anchored.txt": "",
    "x/anchored.txt": "",
    "build/out.js": "",
    "src/build/gen.c": "",
    "src/build.txt": "",
    "docs/a/b/c.tmp": "",
    "docs/c.tmp": "",
    "docs/readme.md": "",
    "other/docs/x.tmp": "",
    "cache/x.bin": "",
    "cache/keep/k.txt": "",
    "cache/drop/d.txt": "",
    "data/x.csv": "",
    "data/important.csv": "",
    "data/sub/y.csv": "",
    "!bang.txt": "",
    "#hash.txt": "",
    "trailing.txt": "",
    "a/b/deep/secret": "",
    "deep/secret": "",
    "deep/public": "",
    "abc1.md": "",
    "abc12.md": "",
    "xz.txt": "",
    "yz.txt": "",
    "zz.txt": "",
    "local-only/f.txt": "",
    "notes.swp": "",
    "sub/.gitignore": "!*.log\nignored-in-sub.txt\n/root-of-sub.txt\n",
    "sub/a.log": "",
    "sub/ignored-in-sub.txt": "",
    "sub/root-of-sub.txt": "",
    "sub/deeper/root-of-sub.txt": "",
    "sub/deeper/ignored-in-sub.txt": "",
    "sub/nested/.gitignore": "*\n!*.py\n!*/\n",
    "sub/nested/a.py": "",
    "sub/nested/b.txt": "",
    "sub/nested/inner/c.py": "",
    "sub/nested/inner/d.md": "",
    "ünï/cödé.py": "",
    "spaced name/file one.txt": "",
}


@pytest.fixture
def work_tree(tmp_path: Path) -> Path:
    root = tmp_path / "wt"
    root.mkdir()
    git(root, "init", "-q")
    write_tree(root, FILES)
    return root


def walked_files(root: Path) -> set[str]:
    return {event.rel for event in walk_events(root) if event.kind == "file"}


def git_untracked(root: Path) -> set[str]:
    """What git considers not ignored: untracked files listed with the standard excludes."""
    return {p for p in git(root, "ls-files", "-z", "--others", "--exclude-standard").split("\0") if p}


def git_ignored(root: Path, paths: list[str]) -> set[str]:
    """The paths `git check-ignore` reports as ignored (exit code 1 means none)."""
    stdin = "\0".join(paths).encode()
    out = git(root, "check-ignore", "-z", "--stdin", "--no-index", stdin=stdin, ok=(0, 1))
    return {p for p in out.split("\0") if p}


def test_walk_keeps_exactly_the_files_git_does_not_ignore(work_tree: Path) -> None:
    walked = walked_files(work_tree)
    assert walked == git_untracked(work_tree)
    # The cases the fixture is about, spelled out, so a regression says which rule broke.
    assert {"keep.log", "x/anchored.txt", "src/build.txt", "cache/keep/k.txt", "data/important.csv"} <= walked
    assert {"deep/public", "abc12.md", "zz.txt", "sub/a.log"} <= walked
    assert {"sub/deeper/root-of-sub.txt", "sub/nested/a.py", "sub/nested/inner/c.py", "ünï/cödé.py"} <= walked
    assert (
        not {"a.log", "anchored.txt", "build/out.js", "src/build/gen.c", "docs/a/b/c.tmp", "docs/c.tmp"}
        & walked
    )
    assert not {"cache/x.bin", "cache/drop/d.txt", "data/x.csv", "data/sub/y.csv", "trailing.txt"} & walked
    assert not {"a/b/deep/secret", "deep/secret", "abc1.md", "xz.txt", "yz.txt", "local-only/f.txt"} & walked
    assert not {"notes.swp", "sub/ignored-in-sub.txt", "sub/root-of-sub.txt", "sub/nested/b.txt"} & walked
    assert not {"!bang.txt", "#hash.txt"} & walked  # escaped: a literal ! and # start these names
    assert "sub/nested/inner/d.md" not in walked


def test_every_left_out_file_is_one_git_check_ignore_reports(work_tree: Path) -> None:
    all_files = [rel for rel in FILES if not rel.startswith(".git/")]
    left_out = sorted(set(all_files) - walked_files(work_tree))
    assert set(left_out) == git_ignored(work_tree, left_out)
    kept = sorted(walked_files(work_tree))
    assert git_ignored(work_tree, kept) == set()


def test_walk_order_is_sorted_path_order_and_skips_are_reported(work_tree: Path) -> None:
    events = list(walk_events(work_tree))
    files = [e.rel for e in events if e.kind == "file"]
    assert files == sorted(files, key=lambda rel: rel.encode())
    skipped_dirs = {e.rel for e in events if e.kind == "skip" and e.is_dir}
    assert {"build", "src/build", "local-only", "cache/drop"} <= skipped_dirs
    assert all(e.reason == "ignored" for e in events if e.kind == "skip")


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", {"real/a.txt": "a", "outside/b.txt": "b"})
    os.symlink(root / "outside", root / "real" / "linked-dir")
    os.symlink(root / "real" / "a.txt", root / "real" / "linked-file.txt")
    events = list(walk_events(root / "real"))
    assert [e.rel for e in events if e.kind == "file"] == ["a.txt"]
    assert sorted(e.rel for e in events if e.reason == "symlink") == ["linked-dir", "linked-file.txt"]


@pytest.mark.parametrize(
    "patterns",
    [
        ["*.log", "build/", "/anchored", "docs/**/*.tmp", "a/**", "**/deep/x", "[ab]?.txt", r"\#h"],
        ["*", "*.py"],
        ["foo/bar", "**/baz/", "x*y/z"],
    ],
)
def test_one_regex_for_files_agrees_with_pattern_by_pattern(patterns: list[str]) -> None:
    rules = IgnoreFile([p.encode() for p in patterns])
    paths = [
        "a.log",
        "x/a.log",
        "build",
        "build/x",
        "anchored",
        "x/anchored",
        "docs/c.tmp",
        "docs/a/b/c.tmp",
        "a/x",
        "a",
        "deep/x",
        "q/deep/x",
        "ab.txt",
        "a1.txt",
        "#h",
        "foo/bar",
        "foo/bar/x",
        "q/baz",
        "xqy/z",
        "z.py",
        "readme",
    ]
    for path in paths:
        by_pattern = any(
            p.matches(path.encode(), False) for p in map(Pattern, (x.encode() for x in patterns))
        )
        assert bool(rules.decide(path.encode(), False)) == by_pattern, path


def test_negation_decides_by_the_last_matching_pattern() -> None:
    rules = IgnoreFile([b"*.log", b"!keep.log", b"dir/"])
    assert rules.decide(b"a.log", False) is True
    assert rules.decide(b"keep.log", False) is False
    assert rules.decide(b"readme.md", False) is None
    assert rules.decide(b"dir", True) is True
    assert rules.decide(b"dir", False) is None  # `dir/` matches directories only


SELECTOR_FILES = [
    "README.md",
    "docs/guide.md",
    "docs/api/ref.md",
    "src/app.py",
    "src/util/io.py",
    "tests/test_app.py",
    "tests/data/x.json",
    "setup.py",
]


@pytest.mark.parametrize(
    ("includes", "excludes", "expected"),
    [
        ([["*.py"]], [], {"src/app.py", "src/util/io.py", "tests/test_app.py", "setup.py"}),
        ([["src/**"]], [], {"src/app.py", "src/util/io.py"}),
        ([["/*.py"]], [], {"setup.py"}),
        ([], [["tests/"]], set(SELECTOR_FILES) - {"tests/test_app.py", "tests/data/x.json"}),
        ([], [["*.md", "!README.md"]], set(SELECTOR_FILES) - {"docs/guide.md", "docs/api/ref.md"}),
        ([["*.py"]], [["test_*.py"]], {"src/app.py", "src/util/io.py", "setup.py"}),
        ([["*.py"], ["src/"]], [], {"src/app.py", "src/util/io.py"}),
        ([["docs/**/*.md"]], [], {"docs/guide.md", "docs/api/ref.md"}),
    ],
)
def test_include_and_exclude_globs(
    includes: list[list[str]], excludes: list[list[str]], expected: set[str]
) -> None:
    selector = PathSelector.from_lists(includes, excludes)
    assert {p for p in SELECTOR_FILES if selector.accepts(p)} == expected


def test_an_empty_selector_accepts_everything() -> None:
    selector = PathSelector.from_lists([[], []], [[]])
    assert not selector
    assert all(selector.accepts(p) for p in SELECTOR_FILES)
