"""The walk's .gitignore handling is git's own, with and without the native code, on a fixture and on
random trees and ignore files (corpora compared byte for byte, and with `git ls-files`); include/exclude
globs behave like gitignore patterns."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multiagenttrainer.config import CorpusConfig
from multiagenttrainer.corpus import accel, build_corpus
from multiagenttrainer.corpus.ignore import PathSelector
from multiagenttrainer.corpus.walk import walk_events
from tests.corpus.conftest import dir_snapshot, git, git_listing, native_code, read_jsonl, write_tree

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


def test_the_last_matching_pattern_decides_and_directory_patterns_match_directories_only(
    tmp_path: Path,
) -> None:
    root = write_tree(
        tmp_path / "t",
        {".gitignore": "*.log\n!keep.log\ndir/\n", "a.log": "", "keep.log": "", "readme.md": "", "dir/x": ""},
    )
    (root / "sub").mkdir()
    (root / "sub" / "dir").write_text("a file named dir")
    assert walked_files(root) == {".gitignore", "keep.log", "readme.md", "sub/dir"}


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


# --------------------------------------------- random trees and ignore files: git is the judge of every path

NAMES = ["a", "b", "ab", "ba", "x", "a.py", "b.txt", "x1", "c.md", "d.log", "x.tmp", "*", "?", "[a]"]
NAMES += ["!n", "#h", "a b", "ü", "q\\r", "foo\\", "foo"]
ATOMS = ["a", "b", "ab", "x", "x1", "ü", ".py", "*", "?", "*.py", "*.log", "a*", "*b", "[ab]?", "[a-c]"]
ATOMS += ["[!a]", "[^a]", "[[:alpha:]]", "[[:digit:]]", "\\*", "\\?", "\\[a]", "\\!n", "\\#h", "a\\ b", "foo"]
# The forms where dulwich (behind the old Python walk) and git disagreed, and their relatives.
DIVERGENT = ["a**/x", "a**", "***/x", "***", "x/***", "foo\\", "x\\", "a//", "b//", "a/**/", "**/x//"]
SHAPES = ["a/x", "ab/x", "a/b/x", "abc/d/x", "b/x", "foo\\", "x", "b/a/y", "x/y/z"]


@st.composite
def patterns(draw: st.DrawFn) -> str:
    """One .gitignore line: path segments of atoms and `**`, anchored or not, directory-only or not,
    negated or not; or one of the divergent forms."""
    if draw(st.integers(0, 3)) == 0:
        pattern = draw(st.sampled_from(DIVERGENT))
    else:
        segments = draw(
            st.lists(
                st.one_of(
                    st.just("**"), st.lists(st.sampled_from(ATOMS), min_size=1, max_size=2).map("".join)
                ),
                min_size=1,
                max_size=3,
            )
        )
        pattern = "/".join(segments)
        pattern = draw(st.sampled_from(["", "/"])) + pattern + draw(st.sampled_from(["", "", "/"]))
    return draw(st.sampled_from(["", "", "!"])) + pattern


@st.composite
def trees(draw: st.DrawFn) -> tuple[dict[str, str], list[str], list[str] | None]:
    """(files with unique contents and .gitignore files, the files to track, info/exclude lines);
    no tracking and no exclude file means a plain directory."""
    paths = draw(
        st.sets(
            st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map("/".join), min_size=1, max_size=14
        )
    )
    paths |= draw(st.sets(st.sampled_from(SHAPES), max_size=4))  # where the divergent forms matter
    dirs = {p.rsplit("/", 1)[0] for p in paths if "/" in p}
    paths = {p for p in paths if p not in dirs and not any(d.startswith(p + "/") for d in dirs)}
    files = {path: f"file {path}\n" for path in paths}
    for directory in sorted({""} | {d + "/" for d in dirs}):
        if draw(st.integers(0, 3)) > (0 if directory == "" else 1):
            lines = draw(st.lists(patterns(), min_size=1, max_size=6))
            files[directory + ".gitignore"] = f"# ignore rules of /{directory}\n" + "\n".join(lines) + "\n"
    if not draw(st.booleans()):
        return files, [], None
    tracked = draw(st.lists(st.sampled_from(sorted(files)), max_size=4, unique=True))
    return files, tracked, draw(st.lists(patterns(), max_size=3))


def make_random_tree(
    root: Path, files: dict[str, str], tracked: list[str], exclude: list[str] | None
) -> None:
    write_tree(root, files)
    if exclude is None:
        return
    git(root, "init", "-q")
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "exclude").write_text("\n".join(exclude) + "\n")
    if tracked:
        git(root, "--literal-pathspecs", "add", "-f", "--", *tracked)


def build_with(root: Path, out: Path, native: bool) -> dict[str, object]:
    with native_code(native):
        assert (accel.stat_module() is not None) is native and (accel.encoder() is not None) is native
        return build_corpus([dir_snapshot(root)], CorpusConfig(), out / "corpus.txt", workers=0)


@given(trees())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_trees_give_git_listing_with_and_without_native_code(
    tmp_path: Path, tree: tuple[dict[str, str], list[str], list[str] | None]
) -> None:
    scratch = Path(tempfile.mkdtemp(dir=tmp_path))
    root = scratch / "tree"
    make_random_tree(root, *tree)
    build_with(root, scratch / "native", True)
    build_with(root, scratch / "python", False)
    for name in ("corpus.txt", "corpus.jsonl"):
        assert (scratch / "native" / name).read_bytes() == (scratch / "python" / name).read_bytes(), name
    corpus = {record["path"] for record in read_jsonl(scratch / "native" / "corpus.jsonl")}
    assert corpus == git_listing(root, scratch)
    for native in (True, False):  # the walk itself, beyond what the corpus keeps
        with native_code(native):
            events = walk_events(root)
        assert {e.rel for e in events if e.kind == "file"} == corpus
        assert len({e.rel for e in events}) == len(events)  # each entry once
