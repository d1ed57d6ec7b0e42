"""local_repo on a plain directory and on a git work tree: describe, fetch, fingerprint, a whole ingest."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from multiagenttrainer.config import CorpusConfig, LocalRepoSource
from multiagenttrainer.corpus import build_corpus
from multiagenttrainer.errors import SourceError
from multiagenttrainer.ingest import Ingester
from multiagenttrainer.sources import SourceContext, make_source
from multiagenttrainer.sources.local_repo import LocalRepo
from tests.corpus.conftest import git, read_jsonl, write_tree

MakeTree = Callable[..., Path]


def local(path: Path | str, **fields: object) -> LocalRepo:
    source = make_source(
        LocalRepoSource(type="local_repo", path=str(path), **fields), "local", SourceContext()
    )
    assert isinstance(source, LocalRepo)
    return source


def test_plain_directory(make_tree: MakeTree, tmp_path: Path) -> None:
    root = make_tree({"a.py": "a = 1\n", "lib/b.py": "b = 2\n"})
    source = local(root, include=["*.py"], exclude=["lib/"])
    info = source.describe()
    assert (info.name, info.type, info.location, info.branch) == ("local", "local_repo", str(root), None)
    snapshot = source.fetch(tmp_path / "staging")
    assert snapshot.source == "local" and snapshot.type == "local_repo"
    assert [(t.repo, t.kind, t.path, t.commit) for t in snapshot.trees] == [("tree", "dir", str(root), None)]
    assert (snapshot.include, snapshot.exclude) == (["*.py"], ["lib/"])
    assert snapshot.version == source.resolve()
    assert not (tmp_path / "staging").exists() or not any((tmp_path / "staging").iterdir())  # nothing copied


def test_two_copies_of_a_tree_are_two_versions(make_tree: MakeTree, tmp_path: Path) -> None:
    """The version says where the files are read, so a cached fetch never hands back the other copy."""
    root = make_tree({"a.py": "a = 1\n"})
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in root.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
        os.utime(copy / path.name, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    assert local(root).resolve() != local(copy).resolve()
    assert local(root).resolve() == local(root).resolve()


def test_git_work_tree_reports_branch_and_commit(make_tree: MakeTree, tmp_path: Path) -> None:
    root = make_tree({"a.py": "a = 1\n"})
    git(root, "init", "-q", "-b", "trunk")
    source = local(root)
    assert source.describe().branch == "trunk"
    assert source.fetch(tmp_path).trees[0].commit is None  # no commits yet
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    head = git(root, "rev-parse", "HEAD").strip()
    before = source.resolve()
    snapshot = source.fetch(tmp_path)
    assert snapshot.trees[0].commit == head
    git(root, "commit", "-q", "--allow-empty", "-m", "second")
    assert source.resolve() != before  # a new commit is a new version (records carry the commit)
    git(root, "checkout", "-q", "--detach")
    assert source.describe().branch is None


def test_fingerprint_changes_on_edit_add_and_delete_only(make_tree: MakeTree) -> None:
    root = make_tree({"a.py": "a = 1\n", "b.py": "b = 2\n", ".gitignore": "*.log\nbuild/\n", "x.log": "1\n"})
    source = local(root)
    versions = [source.resolve()]
    assert source.resolve() == versions[0]  # stable

    (root / "x.log").write_text("ignored files do not count\n")
    (root / "build").mkdir()
    (root / "build" / "out.js").write_text("neither do ignored directories\n")
    assert source.resolve() == versions[0]

    stat = (root / "a.py").stat()
    (root / "a.py").write_text("a = 9\n")  # same size, new mtime
    os.utime(root / "a.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    versions.append(source.resolve())
    (root / "c.py").write_text("c = 3\n")
    versions.append(source.resolve())
    (root / "b.py").unlink()
    versions.append(source.resolve())
    (root / "node_modules").mkdir()
    (root / "node_modules" / "dep.js").write_text("vendored code counts: skip_vendored may be off\n")
    versions.append(source.resolve())
    assert len(set(versions)) == len(versions)


def test_source_globs_narrow_the_fingerprint(make_tree: MakeTree) -> None:
    root = make_tree({"a.py": "a\n", "notes.txt": "n\n"})
    source = local(root, include=["*.py"])
    before = source.resolve()
    (root / "notes.txt").write_text("not selected, so not a change\n")
    assert source.resolve() == before


def test_a_missing_path_is_a_source_error_naming_the_fix(tmp_path: Path) -> None:
    source = local(tmp_path / "nope")
    assert source.describe().location == str(tmp_path / "nope")
    with pytest.raises(SourceError, match=r"source 'local': path .*nope.* does not exist; fix `path:`"):
        source.resolve()
    with pytest.raises(SourceError, match="does not exist"):
        source.fetch(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(SourceError, match="is not a directory"):
        local(tmp_path / "file").resolve()


def test_path_expands_home_variables_and_the_working_directory(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_tree({"a.py": "a\n"}, name="proj")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PROJ_DIR", "proj")
    assert local("~/$PROJ_DIR").describe().location == str(root)
    monkeypatch.chdir(tmp_path)
    assert local("proj").describe().location == str(root)


def test_ingest_reuses_the_corpus_until_a_file_changes(make_tree: MakeTree, tmp_path: Path) -> None:
    root = make_tree({"src/a.py": "a = 1\n", ".gitignore": "*.log\n", "debug.log": "x\n"})
    git(root, "init", "-q", "-b", "main")
    corpus = tmp_path / "corpus"

    def ingest() -> dict[str, object]:
        ingester = Ingester(
            [LocalRepoSource(type="local_repo", path=str(root), name="proj")],
            tmp_path / "staging",
            corpus=CorpusConfig(dir=str(corpus)),
        )
        assert not ingester.fetch_all().failures
        return ingester.build_corpus(corpus / "corpus.txt")

    first = ingest()
    assert (first["reused"], first["files"]) == (False, 2)
    assert ingest()["reused"] is True
    (root / "debug.log").write_text("ignored: still reused\n")
    assert ingest()["reused"] is True
    (root / "src" / "b.py").write_text("b = 2\n")
    rebuilt = ingest()
    assert (rebuilt["reused"], rebuilt["files"]) == (False, 3)
    assert [r["path"] for r in read_jsonl(corpus / "corpus.jsonl")] == [".gitignore", "src/a.py", "src/b.py"]


def test_the_build_reads_the_listing_the_version_describes(make_tree: MakeTree, tmp_path: Path) -> None:
    root = make_tree({"a.py": "a = 1\n"})
    source = local(root)
    snapshot = source.fetch(tmp_path / "staging")
    (root / "late.py").write_text("added after the fetch\n")
    stats = build_corpus([snapshot], CorpusConfig(), tmp_path / "one" / "corpus.txt")
    assert stats["files"] == 1  # the walk the fetch made (and fingerprinted) is the one read
    refetched = source.fetch(tmp_path / "staging")
    assert refetched.version != snapshot.version
    assert build_corpus([refetched], CorpusConfig(), tmp_path / "two" / "corpus.txt")["files"] == 2


def test_fingerprint_of_thousands_of_files_is_fast(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "many", {f"d{i // 100}/f{i}.py": "x\n" for i in range(5000)})
    source = local(root)
    source.resolve()
    started = time.perf_counter()
    source.resolve()
    assert time.perf_counter() - started < 1.0  # about 25 ms when the machine is idle
