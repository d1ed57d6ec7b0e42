"""The C walk (_walk) lists exactly what the Python walk lists, git is the judge of both, and a listing
snapshot answers "nothing changed" without a walk, and only then."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from multiagenttrainer.config import LocalRepoSource
from multiagenttrainer.corpus import listing_cache, walk
from multiagenttrainer.corpus.filters import CACHE_DIRS, VCS_DIRS
from multiagenttrainer.corpus.ignore import PathSelector
from multiagenttrainer.corpus.walk import WalkEvent
from multiagenttrainer.ingest import Ingester
from tests.corpus.conftest import git, write_tree
from tests.corpus.test_ignore import FILES as IGNORE_FIXTURE

try:
    from multiagenttrainer.corpus import _walk  # type: ignore[attr-defined]
except ImportError:
    pytest.fail(
        "the native walk (multiagenttrainer.corpus._walk) is not built: run `make native`", pytrace=False
    )

Rules = list[tuple[bytes, bool, bool]]


def native(root: Path, salt: str = "") -> walk.NativeWalk:
    return walk._walk_native(_walk, str(root.absolute()), salt, False)


def python_events(root: Path) -> list[WalkEvent]:
    return walk._walk_events_python(root)


def assert_same_walk(root: Path, salt: str = "s") -> list[WalkEvent]:
    """Native and Python walks agree on every event and on the fingerprint; returns the events."""
    expected = python_events(root)
    walked = native(root, salt)
    assert walked.events == expected
    assert all(type(event) is WalkEvent for event in walked.events)
    assert walked.fingerprint == walk.files_fingerprint(expected, None, salt)
    return expected


def git_untracked(root: Path, tmp: Path) -> set[str]:
    """The files git does not ignore, in a `git init` of a copy of root."""
    copy = tmp / "git-copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy, symlinks=True)
    git(copy, "init", "-q")
    return {p for p in git(copy, "ls-files", "-z", "--others", "--exclude-standard").split("\0") if p}


def files_of(events: list[WalkEvent]) -> set[str]:
    return {event.rel for event in events if event.kind == "file"}


def make_file(root: Path, rel: bytes, data: bytes = b"x") -> None:
    """A file whose path is raw bytes (names git and os.scandir may not decode)."""
    path = os.fsencode(root) + b"/" + rel
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)


# ---------------------------------------------------------------------------------- identical walks


def test_the_gitignore_fixture_in_a_work_tree_with_an_exclude_file(tmp_path: Path) -> None:
    root = tmp_path / "wt"
    root.mkdir()
    git(root, "init", "-q")
    write_tree(root, IGNORE_FIXTURE)
    events = assert_same_walk(root)
    assert "local-only" in {e.rel for e in events if e.reason == "ignored"}  # from .git/info/exclude
    assert files_of(events) == git_untracked(root, tmp_path)
    assert not any(e.rel == ".git" or e.rel.startswith(".git/") for e in events)


def test_exclude_file_rules_are_the_lowest_precedence(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "wt", {".gitignore": "!keep.tmp\n", "keep.tmp": "", "drop.tmp": ""})
    git(root, "init", "-q")
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "exclude").write_text("*.tmp\n")
    assert files_of(assert_same_walk(root)) == {".gitignore", "keep.tmp"}


def test_names_are_sorted_by_their_bytes_with_directories_as_name_slash(tmp_path: Path) -> None:
    root = tmp_path / "t"
    for rel in [b"a/x", b"a-b", b"a0", b"a.txt", b"\xf0\x9f\x98\x80.txt", b"\xf5.txt", b"Z", b"_"]:
        make_file(root, rel)
    events = assert_same_walk(root)
    order = [os.fsencode(e.rel) for e in events]
    assert order == [b"Z", b"_", b"a-b", b"a.txt", b"a", b"a/x", b"a0", b"\xf0\x9f\x98\x80.txt", b"\xf5.txt"]


def test_undecodable_and_odd_names_decode_as_os_scandir_gives_them(tmp_path: Path) -> None:
    root = tmp_path / "t"
    names = [b"caf\xc3\xa9.py", b"bad\xff.txt", b"new\nline.txt", b"tab\there", b"dir\xfe/inner\x80.py"]
    names += [b"sp ace/x", b"\xe2\x82\xac/\xe2\x82\xac", b"back\\slash", b"-leading", b"#h", b"!b"]
    for rel in names:
        make_file(root, rel)
    write_tree(root, {".gitignore": "*.txt\n!bad*\n"})
    events = assert_same_walk(root)
    assert {os.fsencode(e.path) for e in events if e.kind == "file"} >= {os.fsencode(root) + b"/bad\xff.txt"}
    assert "new\nline.txt" in {e.rel for e in events if e.reason == "ignored"}


def test_symlinks_caches_vcs_and_vendored_directories(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path / "t",
        {
            "src/a.py": "a",
            "src/__pycache__/a.pyc": "b",
            ".mypy_cache/x": "",
            ".git/HEAD": "ref",
            "sub/.hg/store": "",
            "node_modules/pkg/index.js": "",
            "vendor/lib.go": "",
            "outside/o.txt": "",
            ".gitignore": "ignored-link\n",
        },
    )
    os.symlink(root / "outside", root / "src" / "dir-link")
    os.symlink(root / "src" / "a.py", root / "src" / "file-link")
    os.symlink(root / "nowhere", root / "dangling")
    os.symlink(root / "src", root / "ignored-link")
    os.mkfifo(root / "src" / "fifo")
    events = assert_same_walk(root)
    reasons = {e.rel: e.reason for e in events if e.kind == "skip"}
    assert reasons["src/__pycache__"] == reasons[".mypy_cache"] == "cache"
    assert reasons["src/dir-link"] == reasons["src/file-link"] == reasons["dangling"] == "symlink"
    assert reasons["ignored-link"] == "ignored"
    assert {"node_modules/pkg/index.js", "vendor/lib.go"} <= files_of(events)
    assert not any(e.rel in (".git", "sub/.hg") or e.rel.startswith((".git/", "sub/.hg/")) for e in events)
    assert "src/fifo" not in {e.rel for e in events}  # neither a file nor a symlink: dropped


def test_empty_directories_and_an_empty_root(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert assert_same_walk(tmp_path / "empty") == []
    root = tmp_path / "t"
    for rel in ["a", "a/b", "a/b/c", "d"]:
        (root / rel).mkdir(parents=True)
    assert [e.rel for e in assert_same_walk(root)] == ["a", "a/b", "a/b/c", "d"]


def test_a_tree_250_levels_deep(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    rel = ""
    for level in range(250):
        rel += "d/"
        write_tree(root, {f"{rel}f{level}.txt": str(level)})
    write_tree(root, {".gitignore": "f1*.txt\n!f100.txt\n"})
    kept = {name for name in (f"f{level}.txt" for level in range(250)) if not name.startswith("f1")}
    assert {rel.rpartition("/")[2] for rel in files_of(assert_same_walk(root))} == kept | {
        "f100.txt",
        ".gitignore",
    }


def test_directories_past_the_path_length_limit_are_unreadable_in_both(tmp_path: Path) -> None:
    """Made relative to an open directory: os.scandir cannot open them by name, so neither walk does."""
    root = tmp_path / "long"
    root.mkdir()
    name = "n" * 200
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(25):
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    events = assert_same_walk(root)
    assert events[-1].kind == "skip" and events[-1].reason == "unreadable" and events[-1].is_dir


PERMISSION_CHECK = """
import ctypes, os, sys
from pathlib import Path
if os.geteuid() == 0:  # a user namespace without a uid mapping: root keeps owner access but not DAC override
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
        sys.exit("unshare(CLONE_NEWUSER) failed: " + os.strerror(ctypes.get_errno()))
from multiagenttrainer.corpus import _walk, walk
root = Path(sys.argv[1])
expected = walk._walk_events_python(root)
events = walk._walk_native(_walk, str(root), "", False).events
assert events == expected, (events, expected)
print([(e.rel, e.reason) for e in events if e.kind == "skip"])
"""


def test_permission_denied_directories_are_skipped_and_the_walk_goes_on(tmp_path: Path) -> None:
    """Run in a child process: as root (no permission applies) it drops that privilege first."""
    root = write_tree(tmp_path / "t", {"a.txt": "a", "locked/secret.txt": "s", "z/after.txt": "z"})
    os.chmod(root / "locked", 0)
    try:
        done = subprocess.run(
            [sys.executable, "-c", PERMISSION_CHECK, str(root)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
            check=False,
        )
    finally:
        os.chmod(root / "locked", 0o755)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('locked', 'unreadable')]"


def test_a_file_deleted_during_the_walk_is_left_out(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", {"sub/.gitignore": "", "sub/gone.txt": "g", "sub/kept.txt": "k"})

    def load_ignore(path: str) -> Rules:  # runs after sub/ was read and before its files are stat-ed
        (root / "sub" / "gone.txt").unlink(missing_ok=True)
        return []

    events, _, _, _ = _walk.walk(str(root), None, load_ignore, WalkEvent, VCS_DIRS, CACHE_DIRS)
    assert [e.rel for e in events] == ["sub", "sub/.gitignore", "sub/kept.txt"]


def test_an_unreadable_gitignore_leaves_its_directory_out_and_other_errors_propagate(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", {"a/.gitignore": "", "a/x": "", "b/y": "", ".gitignore": ""})

    def unreadable_in_a(path: str) -> Rules:
        if path.endswith("a/.gitignore"):
            raise PermissionError(13, "Permission denied", path)
        return []

    events, _, _, _ = _walk.walk(str(root), None, unreadable_in_a, WalkEvent, VCS_DIRS, CACHE_DIRS)
    assert [(e.rel, e.reason) for e in events] == [
        (".gitignore", ""),
        ("a", "unreadable"),
        ("b", ""),
        ("b/y", ""),
    ]

    def unreadable_at_top(path: str) -> Rules:
        raise PermissionError(13, "Permission denied", path)

    with pytest.raises(PermissionError):  # the top of the walk is an error, as os.scandir's
        _walk.walk(str(root), None, unreadable_at_top, WalkEvent, VCS_DIRS, CACHE_DIRS)

    def broken(path: str) -> Rules:
        raise ValueError("parser bug")

    with pytest.raises(ValueError, match="parser bug"):
        _walk.walk(str(root), None, broken, WalkEvent, VCS_DIRS, CACHE_DIRS)
    with pytest.raises(FileNotFoundError):
        _walk.walk(str(tmp_path / "missing"), None, broken, WalkEvent, VCS_DIRS, CACHE_DIRS)


def test_with_a_selector_the_fingerprint_is_recomputed_over_the_selected_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_tree(tmp_path / "t", {"a.py": "a", "b.md": "b", "lib/c.py": "c", "lib/d.txt": "d"})
    selector = PathSelector.from_lists([["*.py"]], [["lib/"]])
    with_native = walk.list_directory(root, selector, "salt").fingerprint
    monkeypatch.setenv("MAT_CORPUS_NATIVE", "0")
    assert walk.list_directory(root, selector, "salt").fingerprint == with_native
    assert (
        walk.list_directory(root, None, "salt").fingerprint == native(root, "salt").fingerprint != with_native
    )


# ------------------------------------------------------------------- random trees, git as the judge

NAMES = ["a", "b", "ab", "ba", "aa", "a.py", "b.txt", "x1", "c.md", "d.log", "x.tmp", "*", "?", "[a]"]
NAMES += ["!n", "#h", "a b", "ü", "q\\r"]
# Pattern pieces. Left out: the four constructs where dulwich (the Python walk) and git disagree,
# checked on their own below.
ATOMS = ["a", "b", "ab", "x1", "ü", ".py", "*", "?", "*.py", "*.log", "a*", "*b", "[ab]?", "[a-c]"]
ATOMS += ["[!a]", "[^a]", "[[:alpha:]]", "[[:digit:]]", "\\*", "\\?", "\\[a]", "\\!n", "\\#h", "a\\ b"]


def random_pattern(rng: random.Random) -> str:
    segments = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        if rng.random() < 0.15:
            segments.append("**")
        else:
            segments.append("".join(rng.choice(ATOMS) for _ in range(rng.choice([1, 1, 2]))))
    pattern = "/".join(segments)
    if rng.random() < 0.2:
        pattern = "/" + pattern
    if rng.random() < 0.2:
        pattern += "/"
    if rng.random() < 0.25:
        pattern = "!" + pattern
    return pattern


def random_tree(rng: random.Random, root: Path) -> None:
    files: dict[str, str] = {}

    def fill(prefix: str, depth: int) -> None:
        for name in rng.sample(NAMES, rng.randint(1, 5)):
            if depth < 3 and rng.random() < 0.35:
                fill(prefix + name + "/", depth + 1)
            else:
                files[prefix + name] = name

    fill("", 0)
    for directory in sorted({""} | {rel.rpartition("/")[0] + "/" for rel in files if "/" in rel}):
        if rng.random() < (0.9 if directory == "" else 0.3):
            lines = [random_pattern(rng) for _ in range(rng.randint(1, 6))]
            files[directory + ".gitignore"] = "\n".join(lines) + "\n"
    write_tree(root, files)


@pytest.mark.parametrize("seed", range(40))
def test_random_trees_and_patterns(seed: int, tmp_path: Path) -> None:
    root = tmp_path / "t"
    random_tree(random.Random(seed), root)
    events = assert_same_walk(root)
    assert files_of(events) == git_untracked(root, tmp_path)


@pytest.mark.parametrize(
    ("gitignore", "files", "git_keeps"),
    [
        # dir.c compares a pattern's literal head first; a "**" right after it then spans directories.
        ("a**/x\n", ["a/b/x", "ab/x", "abc/d/x", "b/x"], {"b/x"}),
        # "***" as a whole component is "**" in wildmatch (dulwich reads it as "*").
        ("***/x\n", ["x", "a/x", "a/b/x", "y"], {"y"}),
        # A trailing backslash escapes nothing: the pattern never matches (dulwich matches `foo\`).
        ("foo\\\n", ["foo\\", "foo"], {"foo\\", "foo"}),
        # git drops one trailing slash: "a/" is a path pattern no entry matches (dulwich drops both).
        ("a//\n", ["a/x", "b/a/y"], {"a/x", "b/a/y"}),
    ],
)
def test_where_dulwich_and_git_disagree_the_native_walk_follows_git(
    gitignore: str, files: list[str], git_keeps: set[str], tmp_path: Path
) -> None:
    root = write_tree(tmp_path / "t", {".gitignore": gitignore, **{rel: "x" for rel in files}})
    kept = files_of(native(root).events) - {".gitignore"}
    assert kept == git_keeps == git_untracked(root, tmp_path) - {".gitignore"}


# ------------------------------------------------------------------------------- listing snapshots

CHANGES: dict[str, Callable[[Path], None]] = {
    "edit, same size": lambda root: (root / "d" / "b.txt").write_text("B"),
    "touch": lambda root: os.utime(root / "a.txt"),
    "add a file": lambda root: (root / "d" / "new.txt").write_text("n"),
    "delete a file": lambda root: (root / "d" / "e" / "c.txt").unlink(),
    "rename a file": lambda root: (root / "d" / "b.txt").rename(root / "d" / "b2.txt"),
    "add a .gitignore": lambda root: (root / "d" / ".gitignore").write_text("*.txt\n"),
    "edit the .gitignore, same size": lambda root: (root / ".gitignore").write_text("*.lob\n.gitignore\n"),
    "mkdir in a subdirectory": lambda root: (root / "d" / "e" / "new").mkdir(),
    "chmod a directory": lambda root: os.chmod(root / "d", 0o700),
    "chmod a file": lambda root: os.chmod(root / "a.txt", 0o600),
    "create .git/info/exclude": lambda root: (root / ".git" / "info" / "exclude").write_text("*.txt\n"),
    "replace a file by a directory": lambda root: ((root / "a.txt").unlink(), (root / "a.txt").mkdir()),
}
AGED = ["unchanged", "unchanged with selector", "ingest", "corrupt", "other salt", *CHANGES]
TREE = {"a.txt": "a", "d/b.txt": "b", "d/e/c.txt": "c", ".gitignore": "*.log\n.gitignore\n", "x.log": "l"}


@pytest.fixture(scope="module")
def aged_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tree per case, all made more than 2 s ago, so their times are not racy (one wait for all)."""
    base = tmp_path_factory.mktemp("aged")
    roots = {}
    for index, case in enumerate(AGED):
        roots[case] = write_tree(base / f"tree{index}", TREE)
        (roots[case] / ".git" / "info").mkdir(parents=True)
    time.sleep(listing_cache_racy_seconds() + 0.2)
    return roots


def listing_cache_racy_seconds() -> float:
    return float(_walk.RACY_NS) / 1e9


def snapshot_of(root: Path, cache: Path, selector: PathSelector | None = None, salt: str = "s") -> str:
    """Walk root (writing its snapshot); the fingerprint."""
    return walk.list_directory(root, selector, salt, cache).fingerprint


def verify(root: Path, cache: Path, selector: PathSelector | None = None, salt: str = "s") -> str | None:
    return listing_cache.cached_fingerprint(_walk, cache, str(root), selector, salt)


def test_unchanged_gives_the_stored_fingerprint_without_walking(
    aged_roots: dict[str, Path], tmp_path: Path
) -> None:
    root, cache = aged_roots["unchanged"], tmp_path / "cache"
    fingerprint = snapshot_of(root, cache)
    snapshot = listing_cache.snapshot_path(cache, str(root), None)
    written = snapshot.stat().st_mtime_ns
    assert verify(root, cache) == fingerprint
    assert walk.directory_fingerprint(root, None, "s", cache) == fingerprint
    assert snapshot.stat().st_mtime_ns == written  # not walked again: the snapshot was not rewritten
    assert [p.name for p in cache.iterdir()] == [snapshot.name]  # no temporary file left behind


def test_a_selector_is_part_of_the_snapshot(aged_roots: dict[str, Path], tmp_path: Path) -> None:
    root, cache = aged_roots["unchanged with selector"], tmp_path / "cache"
    selector = PathSelector.from_lists([["*.txt"]], [["d/e/"]])
    fingerprint = snapshot_of(root, cache, selector)
    assert fingerprint == walk.files_fingerprint(python_events(root), selector, "s")
    assert verify(root, cache, selector) == fingerprint
    assert verify(root, cache, None) is None  # another selector: another snapshot, none yet


def test_another_salt_is_not_answered_from_the_snapshot(aged_roots: dict[str, Path], tmp_path: Path) -> None:
    root, cache = aged_roots["other salt"], tmp_path / "cache"
    snapshot_of(root, cache, salt="local_repo:commit1")
    assert verify(root, cache, salt="local_repo:commit2") is None


@pytest.mark.parametrize("change", list(CHANGES))
def test_any_change_means_walk_again(change: str, aged_roots: dict[str, Path], tmp_path: Path) -> None:
    root, cache = aged_roots[change], tmp_path / "cache"
    fingerprint = snapshot_of(root, cache)
    assert verify(root, cache) == fingerprint
    CHANGES[change](root)
    assert verify(root, cache) is None


def test_a_snapshot_taken_right_after_an_edit_is_racy(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", TREE)
    snapshot_of(root, tmp_path / "cache")
    assert verify(root, tmp_path / "cache") is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1] + bytes([data[-1] ^ 1]),  # checksum
        lambda data: data[:40] + bytes([data[40] ^ 1]) + data[41:],  # body
        lambda data: data[: len(data) // 2],
        lambda data: b"",
        lambda data: b"MATLIST1" + b"\xff" * 200,
        lambda data: os.urandom(len(data)),
    ],
)
def test_a_corrupt_snapshot_is_a_miss_not_a_crash(
    damage: Callable[[bytes], bytes], aged_roots: dict[str, Path], tmp_path: Path
) -> None:
    root, cache = aged_roots["corrupt"], tmp_path / "cache"
    fingerprint = snapshot_of(root, cache)
    path = listing_cache.snapshot_path(cache, str(root), None)
    path.write_bytes(damage(path.read_bytes()))
    assert verify(root, cache) is None
    assert walk.directory_fingerprint(root, None, "s", cache) == fingerprint  # walks and rewrites it
    assert verify(root, cache) == fingerprint
    path.unlink()
    path.mkdir()
    assert verify(root, cache) is None


def test_a_cache_directory_inside_the_tree_is_not_used(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", TREE)
    walk.list_directory(root, None, "s", root / ".cache")
    assert not (root / ".cache").exists()


def test_local_repo_through_the_ingester(aged_roots: dict[str, Path], tmp_path: Path) -> None:
    root, staging = aged_roots["ingest"], tmp_path / "staging"
    source = LocalRepoSource(type="local_repo", path=str(root), name="proj")

    def fetch() -> str:
        result = Ingester([source], staging).fetch_all()
        assert not result.failures
        return result.snapshots[0].version

    first = fetch()
    (snapshot,) = (staging / ".listings").glob("*.listing")
    written = snapshot.stat().st_mtime_ns
    assert fetch() == first
    assert snapshot.stat().st_mtime_ns == written  # the second fetch did not walk
    (root / "d" / "b.txt").write_text("changed")
    assert fetch() != first


def test_walks_leave_no_open_files_or_growing_memory(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", {f"d{i % 7}/f{i}.txt": "x" for i in range(300)})
    (root / "d1" / ".gitignore").write_text("f1*\n")
    fds = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").is_dir() else None
    for _ in range(5):
        native(root)
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) == fds
    sizes = []
    for _ in range(3):
        for _ in range(200):
            walked = native(root)
            _walk.walk(str(root), None, walk._ignore_rules, WalkEvent, VCS_DIRS, CACHE_DIRS, b"", True)
        sizes.append(resident_kib())
        del walked
    assert sizes[-1] - sizes[0] < 1024  # KiB; a leak of one object per event would be about 6 MB


def resident_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_a_deep_tree_does_not_grow_the_c_stack(tmp_path: Path) -> None:
    """600 levels; removed here, bottom up, because shutil.rmtree (pytest's cleanup) recurses per level."""
    levels = [str(tmp_path / "deep")]
    for _ in range(600):  # one level at a time: Path.mkdir(parents=True) recurses as deep
        levels.append(levels[-1] + "/d")
    try:
        for level in levels:
            os.mkdir(level)
        Path(levels[-1], "leaf.txt").write_text("x")
        walked = native(Path(levels[0]))
        assert walked.events == python_events(Path(levels[0]))
        assert walked.events[-1].rel.endswith("/leaf.txt") and len(walked.events) == 601
    finally:
        Path(levels[-1], "leaf.txt").unlink(missing_ok=True)
        for level in reversed(levels):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(level)


def test_the_snapshot_writer_and_the_c_reader_agree_on_record_kinds() -> None:
    assert (_walk.RECORD_FOLLOW_FILE, _walk.RECORD_ABSENT) == (
        listing_cache.RECORD_FOLLOW_FILE,
        listing_cache.RECORD_ABSENT,
    )
