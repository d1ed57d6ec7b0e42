"""The walk lists what git lists, the same with and without the native stat loop; and a listing snapshot
answers "nothing changed" without a walk, and only then."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from multiagenttrainer.config import LocalRepoSource
from multiagenttrainer.corpus import listing_cache, walk
from multiagenttrainer.corpus.ignore import PathSelector
from multiagenttrainer.corpus.listing_cache import STAT
from multiagenttrainer.corpus.walk import WalkEvent
from multiagenttrainer.ingest import Ingester
from tests.corpus.conftest import git, git_listing, native_code, write_tree
from tests.corpus.test_ignore import FILES as IGNORE_FIXTURE

try:
    from multiagenttrainer.corpus import _statfields  # type: ignore[attr-defined]
except ImportError:
    pytest.fail(
        "the native stat loop (multiagenttrainer.corpus._statfields) is not built: run `make native`",
        pytrace=False,
    )


def assert_same_walk(root: Path, salt: str = "s") -> list[WalkEvent]:
    """The walk with and without the native code gives the same events and fingerprints; returns them."""
    with native_code(True):
        native = walk.list_directory(root, None, salt)
    with native_code(False):
        python = walk.list_directory(root, None, salt)
    assert native.events == python.events
    assert len({event.rel for event in python.events}) == len(python.events)  # each entry once
    assert native.fingerprint == python.fingerprint == walk.files_fingerprint(python.events, None, salt)
    return python.events


def files_of(events: list[WalkEvent]) -> set[str]:
    return {event.rel for event in events if event.kind == "file"}


def make_file(root: Path, rel: bytes, data: bytes = b"x") -> None:
    """A file whose path is raw bytes (names git and os.scandir may not decode)."""
    path = os.fsencode(root) + b"/" + rel
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)


# ------------------------------------------------------------------------- git's listing, every path


def test_the_gitignore_fixture_in_a_work_tree_with_an_exclude_file(tmp_path: Path) -> None:
    root = tmp_path / "wt"
    root.mkdir()
    git(root, "init", "-q")
    write_tree(root, IGNORE_FIXTURE)
    events = assert_same_walk(root)
    assert "local-only" in {e.rel for e in events if e.reason == "ignored"}  # from .git/info/exclude
    assert files_of(events) == git_listing(root, tmp_path)
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
    names += [b"sp ace/x", b"\xe2\x82\xac/\xe2\x82\xac", b"back\\slash", b"-leading", b"#h", b"!b", b'"q"']
    for rel in names:
        make_file(root, rel)
    write_tree(root, {".gitignore": "*.txt\n!bad*\n"})
    events = assert_same_walk(root)
    assert {os.fsencode(e.path) for e in events if e.kind == "file"} >= {os.fsencode(root) + b"/bad\xff.txt"}
    assert "new\nline.txt" in {e.rel for e in events if e.reason == "ignored"}
    assert {os.fsencode(rel) for rel in files_of(events)} == {
        os.fsencode(rel) for rel in git_listing(root, tmp_path)
    }


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


def test_directories_past_the_path_length_limit_are_unreadable(tmp_path: Path) -> None:
    """Made relative to an open directory: they cannot be opened by name, by git or by the walk."""
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
from multiagenttrainer.corpus import walk
root = Path(sys.argv[1])
os.environ["MAT_CORPUS_NATIVE"] = "0"
expected = walk.walk_events(root)
os.environ["MAT_CORPUS_NATIVE"] = "1"
events = walk.walk_events(root)
assert events == expected, (events, expected)
skips = [(e.rel, e.reason) for e in events if e.kind == "skip"]
print(skips, sorted(e.rel for e in events if e.kind == "file"))
"""


def test_permission_denied_directories_are_skipped_and_the_walk_goes_on(tmp_path: Path) -> None:
    """Run in a child process: as root (no permission applies) it drops that privilege first."""
    root = write_tree(
        tmp_path / "t",
        {"a.txt": "a", "locked/secret.txt": "s", "z/after.txt": "z", "guarded/.gitignore": "*.key\n"},
    )
    write_tree(root, {"guarded/private.key": "k", "guarded/sub/public.txt": "p"})
    os.chmod(root / "locked", 0)
    os.chmod(root / "guarded" / ".gitignore", 0)  # its rules cannot be read: nothing below is
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
        os.chmod(root / "guarded" / ".gitignore", 0o644)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip()
        == "[('guarded', 'unreadable'), ('locked', 'unreadable')] ['a.txt', 'z/after.txt']"
    )


UNREADABLE_TOP = """
import ctypes, os, sys
from pathlib import Path
if os.geteuid() == 0 and ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
    sys.exit("unshare(CLONE_NEWUSER) failed: " + os.strerror(ctypes.get_errno()))
from multiagenttrainer.corpus import walk
try:
    walk.walk_events(Path(sys.argv[1]))
except PermissionError as exc:
    print("PermissionError", exc.filename)
"""


def test_an_unreadable_gitignore_at_the_top_is_an_error(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", {".gitignore": "*.key\n", "a.key": "k"})
    os.chmod(root / ".gitignore", 0)
    try:
        done = subprocess.run(
            [sys.executable, "-c", UNREADABLE_TOP, str(root)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
            check=False,
        )
    finally:
        os.chmod(root / ".gitignore", 0o644)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"PermissionError {root}/.gitignore"


def test_a_tracked_file_missing_from_the_work_tree_is_left_out(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "wt", {"sub/gone.txt": "g", "sub/kept.txt": "k"})
    git(root, "init", "-q")
    git(root, "add", "-A")
    (root / "sub" / "gone.txt").unlink()
    assert [e.rel for e in assert_same_walk(root)] == ["sub", "sub/kept.txt"]


def test_with_a_selector_the_fingerprint_is_computed_over_the_selected_files(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", {"a.py": "a", "b.md": "b", "lib/c.py": "c", "lib/d.txt": "d"})
    selector = PathSelector.from_lists([["*.py"]], [["lib/"]])
    with native_code(True):
        with_native = walk.list_directory(root, selector, "salt").fingerprint
    with native_code(False):
        assert walk.list_directory(root, selector, "salt").fingerprint == with_native
        unselected = walk.list_directory(root, None, "salt")
    assert unselected.fingerprint == walk.files_fingerprint(unselected.events, None, "salt") != with_native


@pytest.mark.parametrize(
    ("gitignore", "files", "git_keeps"),
    [
        # dir.c compares a pattern's literal head first; a "**" right after it then spans directories.
        ("a**/x\n", ["a/b/x", "ab/x", "abc/d/x", "b/x"], {"b/x"}),
        # "***" as a whole component is "**" in wildmatch (dulwich read it as "*").
        ("***/x\n", ["x", "a/x", "a/b/x", "y"], {"y"}),
        # A trailing backslash escapes nothing: the pattern never matches (dulwich matched `foo\`).
        ("foo\\\n", ["foo\\", "foo"], {"foo\\", "foo"}),
        # git drops one trailing slash: "a/" is a path pattern no entry matches (dulwich dropped both).
        ("a//\n", ["a/x", "b/a/y"], {"a/x", "b/a/y"}),
    ],
)
def test_where_dulwich_and_git_disagreed_every_path_follows_git(
    gitignore: str, files: list[str], git_keeps: set[str], tmp_path: Path
) -> None:
    root = write_tree(tmp_path / "t", {".gitignore": gitignore, **{rel: "x" for rel in files}})
    kept = files_of(assert_same_walk(root)) - {".gitignore"}
    assert kept == git_keeps == git_listing(root, tmp_path) - {".gitignore"}


def test_the_native_fingerprint_text_is_pythons_for_any_numbers_and_names() -> None:
    events = [
        WalkEvent("file", "a.py", "/t/a.py", 5, -1_000_000_007),  # a file from before 1970
        WalkEvent("dir", "d"),
        WalkEvent("file", "d/caf\udcc3.py", "/t/d/caf\udcc3.py", 0, 2**63 - 1),  # undecodable byte
        WalkEvent("skip", "x.log", reason="ignored"),
        WalkEvent("".join(["fi", "le"]), "d/\u20ac.py", "/t/d/\u20ac.py", 1, 2),  # equal to "file", not it
    ]
    huge = [*events, WalkEvent("file", "h", "/t/h", 2**70, 0)]  # beyond 64 bits: the Python loop's answer
    for listed in (events, huge):
        with native_code(True):
            native = walk.files_fingerprint(listed, None, "salt")
        with native_code(False):
            assert native == walk.files_fingerprint(listed, None, "salt")
    assert _statfields.fingerprint_lines(huge) is None
    assert _statfields.fingerprint_lines(events).count(b"\n") == 3


def test_the_native_and_python_stat_loops_give_the_same_bytes(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", {"a.txt": "abc", "d/b.txt": "", ".gitignore": "x\n"})
    os.symlink(root / "a.txt", root / "link")
    os.symlink(root / "d", root / "dir-link")
    os.mkfifo(root / "fifo")
    paths = [b"", b"a.txt", b"d", b"d/b.txt", b"link", b"link", b"dir-link", b"fifo", b"missing", b"a.txt/x"]
    paths += [os.fsencode(root / "a.txt"), b"/nonexistent", b"../t/a.txt", b"d/../a.txt"]
    modes = bytes([0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0])
    top = os.fsencode(root)
    fields = _statfields.stat_fields(top, modes, paths)
    assert fields == listing_cache.stat_fields_python(top, modes, paths)
    types = [row[0] for row in STAT.iter_unpack(fields)]
    assert types == [1, 2, 1, 2, 3, 2, 1, 4, 0, 0, 2, 0, 2, 2]
    missing_top = os.fsencode(tmp_path / "gone")
    assert _statfields.stat_fields(missing_top, modes, paths) == listing_cache.stat_fields_python(
        missing_top, modes, paths
    )
    assert STAT.size == _statfields.FIELDS_BYTES
    for bad in ([b"a\0b"], ["a.txt"]):
        with pytest.raises((ValueError, TypeError)):
            _statfields.stat_fields(top, b"\0", bad)
        with pytest.raises((ValueError, TypeError)):
            listing_cache.stat_fields_python(top, b"\0", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _statfields.stat_fields(top, b"", [b"a.txt"])


# ------------------------------------------------------------------------------- listing snapshots

CHANGES: dict[str, Callable[[Path], object]] = {
    "edit, same size": lambda root: (root / "d" / "b.txt").write_text("B"),
    "touch": lambda root: os.utime(root / "a.txt"),
    "add a file": lambda root: (root / "d" / "new.txt").write_text("n"),
    "add a file in an empty directory": lambda root: (root / "d" / "empty" / "new.txt").write_text("n"),
    "chmod an empty directory": lambda root: os.chmod(root / "d" / "empty", 0o700),
    "delete a file": lambda root: (root / "d" / "e" / "c.txt").unlink(),
    "rename a file": lambda root: (root / "d" / "b.txt").rename(root / "d" / "b2.txt"),
    "add a .gitignore": lambda root: (root / "d" / ".gitignore").write_text("*.txt\n"),
    "edit the .gitignore, same size": lambda root: (root / ".gitignore").write_text("*.lob\n.gitignore\n"),
    "mkdir in a subdirectory": lambda root: (root / "d" / "e" / "new").mkdir(),
    "chmod a directory": lambda root: os.chmod(root / "d", 0o700),
    "chmod a file": lambda root: os.chmod(root / "a.txt", 0o600),
    "create .git/info/exclude": lambda root: (root / ".git" / "info" / "exclude").write_text("*.txt\n"),
    "track an ignored file": lambda root: git(root, "add", "-f", "x.log"),
    "replace a file by a directory": lambda root: ((root / "a.txt").unlink(), (root / "a.txt").mkdir()),
}
AGED = ["unchanged", "unchanged with selector", "ingest", "corrupt", "other salt", *CHANGES]
TREE = {"a.txt": "a", "d/b.txt": "b", "d/e/c.txt": "c", ".gitignore": "*.log\n.gitignore\n", "x.log": "l"}
NATIVE = pytest.mark.parametrize("native", [True, False], ids=["native", "python"])


@pytest.fixture(scope="module")
def aged_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Path]:
    """One work tree per case and stat loop, all made more than 2 s ago, so their times are not racy
    (one wait for all). Each has an empty directory, which git lists nothing in."""
    base = tmp_path_factory.mktemp("aged")
    roots = {}
    for index, case in enumerate((case, native) for case in AGED for native in (True, False)):
        root = roots[case] = write_tree(base / f"tree{index}", TREE)
        git(root, "init", "-q", "--template=")
        (root / ".git" / "info").mkdir()
        (root / "d" / "empty").mkdir()
    time.sleep(listing_cache.RACY_NS / 1e9 + 0.2)
    return roots


def snapshot_of(root: Path, cache: Path, selector: PathSelector | None = None, salt: str = "s") -> str:
    """Walk root (writing its snapshot); the fingerprint."""
    return walk.list_directory(root, selector, salt, cache).fingerprint


def verify(root: Path, cache: Path, selector: PathSelector | None = None, salt: str = "s") -> str | None:
    return listing_cache.cached_fingerprint(cache, str(root), selector, salt)


@NATIVE
def test_unchanged_gives_the_stored_fingerprint_without_walking(
    native: bool, aged_roots: dict[tuple[str, bool], Path], tmp_path: Path
) -> None:
    root, cache = aged_roots["unchanged", native], tmp_path / "cache"
    with native_code(native):
        fingerprint = snapshot_of(root, cache)
        snapshot = listing_cache.snapshot_path(cache, str(root), None)
        written = snapshot.stat().st_mtime_ns
        assert verify(root, cache) == fingerprint
        assert walk.directory_fingerprint(root, None, "s", cache) == fingerprint
    assert snapshot.stat().st_mtime_ns == written  # not walked again: the snapshot was not rewritten
    assert [p.name for p in cache.iterdir()] == [snapshot.name]  # no temporary file left behind
    with native_code(not native):  # the other stat loop reads the same snapshot the same way
        assert verify(root, cache) == fingerprint


@NATIVE
def test_a_selector_is_part_of_the_snapshot(
    native: bool, aged_roots: dict[tuple[str, bool], Path], tmp_path: Path
) -> None:
    root, cache = aged_roots["unchanged with selector", native], tmp_path / "cache"
    selector = PathSelector.from_lists([["*.txt"]], [["d/e/"]])
    with native_code(native):
        fingerprint = snapshot_of(root, cache, selector)
        assert fingerprint == walk.files_fingerprint(walk.walk_events(root), selector, "s")
        assert verify(root, cache, selector) == fingerprint
        assert verify(root, cache, None) is None  # another selector: another snapshot, none yet


def test_another_salt_is_not_answered_from_the_snapshot(
    aged_roots: dict[tuple[str, bool], Path], tmp_path: Path
) -> None:
    root, cache = aged_roots["other salt", True], tmp_path / "cache"
    snapshot_of(root, cache, salt="local_repo:commit1")
    assert verify(root, cache, salt="local_repo:commit2") is None


@NATIVE
@pytest.mark.parametrize("change", list(CHANGES))
def test_any_change_means_walk_again(
    change: str, native: bool, aged_roots: dict[tuple[str, bool], Path], tmp_path: Path
) -> None:
    root, cache = aged_roots[change, native], tmp_path / "cache"
    with native_code(native):
        fingerprint = snapshot_of(root, cache)
        assert verify(root, cache) == fingerprint
        CHANGES[change](root)
        assert verify(root, cache) is None


def test_a_snapshot_taken_right_after_an_edit_is_racy(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", TREE)
    snapshot_of(root, tmp_path / "cache")
    assert verify(root, tmp_path / "cache") is None
    assert not listing_cache.snapshot_path(tmp_path / "cache", str(root), None).exists()


@NATIVE
@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1] + bytes([data[-1] ^ 1]),  # checksum
        lambda data: data[:40] + bytes([data[40] ^ 1]) + data[41:],  # body
        lambda data: data[: len(data) // 2],
        lambda data: b"",
        lambda data: b"MATLIST2" + b"\xff" * 200,
        lambda data: os.urandom(len(data)),
    ],
)
def test_a_corrupt_snapshot_is_a_miss_not_a_crash(
    damage: Callable[[bytes], bytes], native: bool, aged_roots: dict[tuple[str, bool], Path], tmp_path: Path
) -> None:
    root, cache = aged_roots["corrupt", native], tmp_path / "cache"
    with native_code(native):
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


def test_local_repo_through_the_ingester(aged_roots: dict[tuple[str, bool], Path], tmp_path: Path) -> None:
    root, staging = aged_roots["ingest", True], tmp_path / "staging"
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


def test_walks_leave_no_open_files_processes_or_growing_memory(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", {f"d{i % 7}/f{i}.txt": "x" for i in range(300)})
    (root / "d1" / ".gitignore").write_text("f1*\n")
    paths = [os.fsencode(f"d{i % 7}/f{i}.txt") for i in range(300)]
    fds, children = len(os.listdir("/proc/self/fd")), child_processes()
    for _ in range(5):
        walk.list_directory(root, None, "s", tmp_path / "cache")
    assert len(os.listdir("/proc/self/fd")) == fds
    assert child_processes() <= children  # every git run has ended (other tests' servers may be running)
    sizes = []
    for _ in range(3):
        for _ in range(300):
            _statfields.stat_fields(os.fsencode(root), bytes(len(paths)), paths)
        sizes.append(resident_kib())
    assert sizes[-1] - sizes[0] < 1024  # KiB; a leak of one path per call would be about 4 MB


def child_processes() -> set[str]:
    return {pid for task in Path("/proc/self/task").glob("*/children") for pid in task.read_text().split()}


def resident_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_a_deep_tree(tmp_path: Path) -> None:
    """600 levels; removed here, bottom up, because shutil.rmtree (pytest's cleanup) recurses per level."""
    levels = [str(tmp_path / "deep")]
    for _ in range(600):  # one level at a time: Path.mkdir(parents=True) recurses as deep
        levels.append(levels[-1] + "/d")
    try:
        for level in levels:
            os.mkdir(level)
        Path(levels[-1], "leaf.txt").write_text("x")
        events = assert_same_walk(Path(levels[0]))
        assert events[-1].rel.endswith("/leaf.txt") and len(events) == 601
    finally:
        Path(levels[-1], "leaf.txt").unlink(missing_ok=True)
        for level in reversed(levels):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(level)
