"""build_corpus end to end: output formats, stats, split, dedupe across sources, determinism, reuse."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import orjson
import pytest

from multiagenttrainer.config import CorpusConfig
from multiagenttrainer.corpus import accel, build_corpus
from multiagenttrainer.corpus.assemble import Assembly, CorpusPaths, lock_directory
from multiagenttrainer.errors import CorpusError, DiskFullError
from multiagenttrainer.processes import pid_alive
from multiagenttrainer.progress import NullProgress
from tests.corpus.conftest import dir_snapshot, native_code, read_jsonl
from tests.support.disks import mounted_tmpfs
from tests.support.experiments import REPO_ROOT, wait_for

Build = Callable[..., dict[str, Any]]
MakeTree = Callable[..., Path]


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class RecordingProgress(NullProgress):
    """Records the corpus events it receives."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def corpus_started(self, total_files: int | None) -> None:
        self.events.append(("started", total_files))

    def corpus_advanced(self, files: int, nbytes: int) -> None:
        self.events.append(("advanced", files, nbytes))

    def corpus_finished(self, reused: bool) -> None:
        self.events.append(("finished", reused))


def test_jsonl_records_have_exactly_the_provenance_fields(
    make_tree: MakeTree, build: Build, tmp_path: Path
) -> None:
    root = make_tree({"b.py": "print(1)\n", "a/x.md": "# no newline at the end"})
    build([dir_snapshot(root, source="mine", commit="c0ffee")])
    records = read_jsonl(tmp_path / "out" / "corpus.jsonl")
    assert [list(r) for r in records] == [
        ["source", "repo", "commit", "path", "bytes", "sha", "split", "text"]
    ] * 2
    first = records[0]
    assert first == {
        "source": "mine",
        "repo": "tree",
        "commit": "c0ffee",
        "path": "a/x.md",
        "bytes": 23,
        "sha": git_blob_sha(b"# no newline at the end"),
        "split": first["split"],
        "text": "# no newline at the end",
    }
    assert first["split"] in ("train", "val")


def test_corpus_txt_has_a_header_line_before_each_file(
    make_tree: MakeTree, build: Build, tmp_path: Path
) -> None:
    root = make_tree({"b.py": "print(1)\n", "a/x.md": "# no newline at the end"})
    build([dir_snapshot(root, source="mine")])
    assert (tmp_path / "out" / "corpus.txt").read_text() == (
        "--- source: mine | repo: tree | path: a/x.md ---\n# no newline at the end\n"
        "--- source: mine | repo: tree | path: b.py ---\nprint(1)\n"
    )


def test_stats_describe_the_build(make_tree: MakeTree, build: Build, tmp_path: Path) -> None:
    root = make_tree({"a.py": "a = 1\n", "b.py": "b = 22\n", "c.bin": b"\0\1"})
    snapshot = dir_snapshot(root, source="mine", version="v7", commit="abc", warnings=["a warning"])
    stats = build([snapshot])
    out = tmp_path / "out"
    assert stats == orjson.loads((out / "stats.json").read_bytes())
    assert stats["files"] == 2 and stats["bytes"] == 13
    assert stats["skipped"] == {"binary": 1}
    assert stats["splits"]["train"]["files"] + stats["splits"]["val"]["files"] == 2
    assert stats["splits"]["train"]["bytes"] + stats["splits"]["val"]["bytes"] == 13
    assert stats["sources"] == {
        "mine": {
            "type": "local_repo",
            "files": 2,
            "bytes": 13,
            "version": "v7",
            "commits": {"tree": "abc"},
            "skipped": {"binary": 1},
            "warnings": ["a warning"],
        },
    }
    assert stats["paths"] == {
        "txt": str(out / "corpus.txt"),
        "jsonl": str(out / "corpus.jsonl"),
        "stats": str(out / "stats.json"),
    }
    assert stats["output_bytes"] == {
        "txt": (out / "corpus.txt").stat().st_size,
        "jsonl": (out / "corpus.jsonl").stat().st_size,
    }
    assert stats["secrets_redacted"] == 0 and stats["secrets_by_rule"] == {}
    assert stats["reused"] is False and stats["build_seconds"] >= 0 and stats["created_at"]
    assert stats["workers"] == 0  # too small to be worth worker processes
    assert len(stats["fingerprint"]) == 32
    assert sorted(os.listdir(out)) == ["corpus.jsonl", "corpus.txt", "stats.json"]  # no temporary files left


def test_split_is_deterministic_by_path_and_respects_the_fraction(
    make_tree: MakeTree, build: Build, tmp_path: Path
) -> None:
    root = make_tree({f"pkg/m{i:03d}.py": f"x = {i}\n" for i in range(400)})
    stats = build([dir_snapshot(root)], val_fraction=0.25)
    splits = {r["path"]: r["split"] for r in read_jsonl(tmp_path / "out" / "corpus.jsonl")}
    assert 60 <= stats["splits"]["val"]["files"] <= 140
    build([dir_snapshot(root)], out=tmp_path / "again", val_fraction=0.25)
    assert {r["path"]: r["split"] for r in read_jsonl(tmp_path / "again" / "corpus.jsonl")} == splits
    none_val = build([dir_snapshot(root)], out=tmp_path / "noval", val_fraction=0.0)
    assert none_val["splits"]["val"]["files"] == 0


def test_duplicates_across_sources_keep_the_first_in_config_order(
    make_tree: MakeTree, build: Build, tmp_path: Path
) -> None:
    first = make_tree({"shared.py": "same = True\n", "only_first.py": "a\n"}, name="first")
    second = make_tree({"copy/shared.py": "same = True\n", "only_second.py": "b\n"}, name="second")
    stats = build([dir_snapshot(first, source="one"), dir_snapshot(second, source="two")])
    records = read_jsonl(tmp_path / "out" / "corpus.jsonl")
    assert [(r["source"], r["path"]) for r in records] == [
        ("one", "only_first.py"),
        ("one", "shared.py"),
        ("two", "only_second.py"),
    ]
    assert stats["skipped"] == {"duplicate": 1}
    assert stats["sources"]["two"]["skipped"] == {"duplicate": 1}
    reversed_stats = build(
        [dir_snapshot(second, source="two"), dir_snapshot(first, source="one")], out=tmp_path / "r"
    )
    assert reversed_stats["sources"]["one"]["skipped"] == {"duplicate": 1}


def test_same_inputs_give_byte_identical_corpora_with_or_without_workers(
    make_tree: MakeTree, build: Build, tmp_path: Path
) -> None:
    files = {
        f"d{i % 7}/f{i:03d}.txt": f"line {i % 40}\n" * (1 + i % 5) for i in range(150)
    }  # many duplicates
    files["leak.env"] = "API_TOKEN=f00dfeed12345678\n"
    root = make_tree(files)
    serial = build([dir_snapshot(root)], out=tmp_path / "serial")
    parallel = build([dir_snapshot(root)], out=tmp_path / "parallel", workers=2, chunk_bytes=1)
    again = build([dir_snapshot(root)], out=tmp_path / "again", workers=3, chunk_bytes=300)
    for name in ("corpus.txt", "corpus.jsonl"):
        reference = (tmp_path / "serial" / name).read_bytes()
        assert (tmp_path / "parallel" / name).read_bytes() == reference
        assert (tmp_path / "again" / name).read_bytes() == reference
    assert serial["skipped"] == parallel["skipped"] == again["skipped"]
    assert serial["skipped"]["duplicate"] > 50
    assert parallel["workers"] == 2 and serial["workers"] == 0
    assert serial["secrets_by_rule"] == parallel["secrets_by_rule"] == {"secret-assignment": 1}


@pytest.mark.parametrize("skip_vendored", [True, False])
def test_directory_trees_planned_in_spans_give_the_same_corpus_however_they_are_cut(
    make_tree: MakeTree, build: Build, tmp_path: Path, skip_vendored: bool
) -> None:
    """Spans of a directory listing are planned where their chunks run; vendored subtrees, skipped
    entries and name rules must count once, wherever the cuts fall."""
    files: dict[str, str | bytes] = {f"src/m{i:02d}.py": f"x = {i}\n" for i in range(30)}
    files |= {f"src/vendor/lib{i}/v{j}.py": f"v = {i}{j}\n" for i in range(3) for j in range(4)}
    files |= {f"web/node_modules/p{i}/index.js": f"n({i})\n" for i in range(5)}
    files |= {"web/app.min.js": "a()\n", "web/yarn.lock": "x\n", "web/empty.js": "", "web/z.js": "z()\n"}
    files |= {".gitignore": "*.log\nbuild/\n", "debug.log": "log\n", "build/out.js": "o()\n"}
    files |= {"zz.py": "zz = 1\n"}
    root = make_tree(files)
    os.symlink("src/m00.py", root / "link.py")
    options = {"skip_vendored": skip_vendored}
    whole = build([dir_snapshot(root)], out=tmp_path / "whole", chunk_bytes=1 << 20, **options)
    cut = build([dir_snapshot(root)], out=tmp_path / "cut", chunk_bytes=1, **options)
    parallel = build([dir_snapshot(root)], out=tmp_path / "parallel", workers=2, chunk_bytes=7, **options)
    for name in ("corpus.txt", "corpus.jsonl"):
        reference = (tmp_path / "whole" / name).read_bytes()
        assert (tmp_path / "cut" / name).read_bytes() == reference
        assert (tmp_path / "parallel" / name).read_bytes() == reference
    for stats in (cut, parallel):
        assert stats["skipped"] == whole["skipped"] and stats["skipped_dirs"] == whole["skipped_dirs"]
        assert stats["files"] == whole["files"] and stats["splits"] == whole["splits"]
    assert whole["skipped"] == {"empty": 1, "ignored": 1, "lock_file": 1, "minified": 1, "symlink": 1}
    if skip_vendored:
        assert whole["skipped_dirs"] == {"ignored": 1, "vendored": 2}
        assert whole["files"] == 33  # .gitignore is a file of the tree too
    else:
        assert whole["skipped_dirs"] == {"ignored": 1} and whole["files"] == 33 + 12 + 5


def test_a_second_build_with_the_same_inputs_reuses_the_corpus(make_tree: MakeTree, tmp_path: Path) -> None:
    root = make_tree({"a.py": "a = 1\n"})
    target = tmp_path / "corpus" / "corpus.txt"
    first = build_corpus([dir_snapshot(root)], CorpusConfig(), target)
    mtime = target.stat().st_mtime_ns
    progress = RecordingProgress()
    second = build_corpus([dir_snapshot(root)], CorpusConfig(), target, progress)
    assert second["reused"] is True and first["reused"] is False
    assert {k: v for k, v in second.items() if k != "reused"} == {
        k: v for k, v in first.items() if k != "reused"
    }
    assert target.stat().st_mtime_ns == mtime
    assert progress.events == [("started", 1), ("finished", True)]


@pytest.mark.parametrize(
    "change",
    ["version", "options", "jsonl_removed", "txt_truncated", "stats_corrupt"],
)
def test_the_corpus_is_rebuilt_when_anything_it_depends_on_changes(
    make_tree: MakeTree, tmp_path: Path, change: str
) -> None:
    root = make_tree({"a.py": "a = 1\n"})
    target = tmp_path / "corpus" / "corpus.txt"
    build_corpus([dir_snapshot(root)], CorpusConfig(), target)
    snapshot, options = dir_snapshot(root), CorpusConfig()
    if change == "version":
        snapshot = dir_snapshot(root, version="v2")
    elif change == "options":
        options = CorpusConfig(val_fraction=0.5)
    elif change == "jsonl_removed":
        (target.parent / "corpus.jsonl").unlink()
    elif change == "txt_truncated":
        target.write_text("")
    else:
        (target.parent / "stats.json").write_text("{not json")
    stats = build_corpus([snapshot], options, target)
    assert stats["reused"] is False
    assert target.read_text().startswith("--- source: src")


def test_progress_is_reported_per_chunk(make_tree: MakeTree, tmp_path: Path) -> None:
    root = make_tree({f"f{i}.py": f"x = {i}\n" for i in range(10)} | {"bin.dat": b"\0"})
    progress = RecordingProgress()
    build_corpus(
        [dir_snapshot(root)], CorpusConfig(), tmp_path / "c" / "corpus.txt", progress, chunk_bytes=20
    )
    assert progress.events[0] == ("started", 11)
    assert progress.events[-1] == ("finished", False)
    advanced = [e for e in progress.events if e[0] == "advanced"]
    assert 1 < len(advanced) < 11  # batched, not per file
    assert sum(e[1] for e in advanced) == 11


def test_a_missing_tree_fails_with_the_source_name_and_keeps_the_old_corpus(
    make_tree: MakeTree, tmp_path: Path
) -> None:
    root = make_tree({"a.py": "a = 1\n"})
    target = tmp_path / "corpus" / "corpus.txt"
    build_corpus([dir_snapshot(root)], CorpusConfig(), target)
    before = target.read_bytes()
    with pytest.raises(CorpusError, match=r"source 'gone'.*mat ingest"):
        build_corpus([dir_snapshot(tmp_path / "nowhere", source="gone")], CorpusConfig(), target)
    assert target.read_bytes() == before
    assert sorted(os.listdir(target.parent)) == ["corpus.jsonl", "corpus.txt", "stats.json"]


def test_an_unwritable_corpus_dir_is_a_corpus_error(make_tree: MakeTree, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CorpusError, match="choose another corpus.dir"):
        build_corpus([dir_snapshot(make_tree({"a.py": "1\n"}))], CorpusConfig(), blocker / "corpus.txt")


def test_an_empty_build_writes_empty_files(tmp_path: Path) -> None:
    stats = build_corpus([], CorpusConfig(), tmp_path / "c" / "corpus.txt")
    assert stats["files"] == 0
    assert (tmp_path / "c" / "corpus.txt").read_bytes() == b""
    assert (tmp_path / "c" / "corpus.jsonl").read_bytes() == b""


def allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_disk_blocks_reserved_for_the_outputs_are_given_back_and_change_nothing(
    make_tree: MakeTree, build: Build, tmp_path: Path
) -> None:
    """The build reserves blocks for its expected output sizes (native code); the corpus is the same
    as without, and the files hold no more blocks than their sizes need."""
    root = make_tree({f"d{i % 5}/f{i:03d}.py": f"x = {i}\n" * (50 + i) for i in range(120)})
    with native_code(True):
        assert accel.encoder() is not None
        build([dir_snapshot(root)], out=tmp_path / "native", workers=2, chunk_bytes=4096)
    with native_code(False):
        build([dir_snapshot(root)], out=tmp_path / "python")
    for name in ("corpus.txt", "corpus.jsonl"):
        written = tmp_path / "native" / name
        assert written.read_bytes() == (tmp_path / "python" / name).read_bytes()
        assert allocated_bytes(written) < written.stat().st_size + (64 << 10)


def test_reserved_blocks_leave_the_sizes_alone_and_go_with_an_unfinished_build(tmp_path: Path) -> None:
    paths = CorpusPaths.beside(tmp_path / "c" / "corpus.txt")
    with native_code(True), Assembly(paths, dedupe=True) as assembly:
        reserved = assembly.reserve(4 << 20, 4 << 20)
        work = Path(assembly.txt_path).parent
        for name in ("corpus.txt", "corpus.jsonl"):
            assert (work / name).stat().st_size == 0
            assert (allocated_bytes(work / name) >= 4 << 20) is reserved
    assert not work.exists()  # not committed: the work directory and its blocks are gone
    with native_code(False), Assembly(paths, dedupe=True) as assembly:
        assert assembly.reserve(4 << 20, 4 << 20) is False  # without the native code: never


def test_work_directories_of_killed_builds_are_removed_by_the_next_build(
    make_tree: MakeTree, build: Build, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    abandoned, running, young = (out / f".corpus-build-{name}" for name in ("killed", "running", "young"))
    for work in (abandoned, running, young):
        work.mkdir()
        (work / "corpus.jsonl").write_bytes(b"x" * 1000)
    for work in (abandoned, running):
        os.utime(work, (time.time() - 3600, time.time() - 3600))
    held = lock_directory(running, blocking=True)  # a build still at work holds its directory's lock
    try:
        build([dir_snapshot(make_tree({"a.py": "a = 1\n"}))], out=out)
        assert not abandoned.exists()
        assert running.exists() and young.exists()  # in use, or too new to tell
    finally:
        os.close(held)
    assert sorted(path.name for path in out.iterdir()) == sorted(
        ["corpus.jsonl", "corpus.txt", "stats.json", running.name, young.name]
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_a_full_disk_is_one_error_naming_the_corpus_dir_and_the_old_corpus_stays(
    make_tree: MakeTree, build: Build, tmp_path: Path, workers: int
) -> None:
    root = make_tree({f"d{i % 4}/f{i:03d}.py": f"v = {i}  # {'x' * 60}\n" * 300 for i in range(200)})
    small = make_tree({"a.py": "a = 1\n"}, name="small")
    with mounted_tmpfs(tmp_path / "disk", size="4m") as disk:
        out = disk / "corpus"
        build([dir_snapshot(small)], out=out)
        before = {name: (out / name).read_bytes() for name in ("corpus.txt", "corpus.jsonl", "stats.json")}
        with pytest.raises(DiskFullError) as raised:
            build([dir_snapshot(root)], out=out, workers=workers, chunk_bytes=64 << 10)
        message = str(raised.value)
        assert f"no space left on the device of {out} " in message and "free at least" in message
        assert {name: (out / name).read_bytes() for name in before} == before
        assert not list(out.glob(".corpus-build-*"))  # the unfinished build and its blocks are gone


BUILD_THEN_HANG = """
import sys, time
from pathlib import Path
from multiagenttrainer.config import CorpusConfig
from multiagenttrainer.corpus import build_corpus
from multiagenttrainer.progress import NullProgress
from tests.corpus.conftest import dir_snapshot

class HangOnFirstChunk(NullProgress):  # the build stops between chunks, its workers waiting on it
    def corpus_advanced(self, files, nbytes):
        print("building", flush=True)
        time.sleep(600)

root, out = Path(sys.argv[1]), Path(sys.argv[2])
build_corpus([dir_snapshot(root)], CorpusConfig(), out / "corpus.txt", HangOnFirstChunk(),
             workers=2, chunk_bytes=4096)
"""


def test_killing_the_build_with_sigkill_leaves_no_worker_behind(make_tree: MakeTree, tmp_path: Path) -> None:
    root = make_tree({f"d{i % 4}/f{i:03d}.py": f"v = {i}  # {'x' * 60}\n" * 40 for i in range(200)})
    builder = subprocess.Popen(
        [sys.executable, "-c", BUILD_THEN_HANG, str(root), str(tmp_path / "out")],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    workers: list[int] = []
    try:
        assert builder.stdout is not None and builder.stdout.readline().strip() == "building"
        workers = children_of(builder.pid)
        assert len(workers) == 2
        builder.kill()
        builder.wait()
        wait_for(lambda: not any(pid_alive(pid) for pid in workers), 10, "the workers to die with the build")
    finally:
        for pid in [builder.pid, *workers]:  # nothing left behind, even when the test fails
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        builder.wait()


def children_of(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]
