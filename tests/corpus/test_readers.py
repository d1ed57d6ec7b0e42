"""The git tree reader (a bare repository made with the git CLI) and the docs reader (JSONL records)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from multiagenttrainer.errors import CorpusError
from multiagenttrainer.sources.base import Snapshot, Tree
from tests.corpus.conftest import git, read_jsonl, write_tree

Build = Callable[..., dict[str, Any]]


@pytest.fixture(scope="module")
def bare_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A bare repository whose HEAD commit has text, a duplicate, a symlink, a submodule and vendored code."""
    base = tmp_path_factory.mktemp("git-reader")
    work = base / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    write_tree(
        work,
        {
            "README.md": "# demo\n",
            "src/app.py": "print('app')\n",
            "src/copy.py": "print('app')\n",
            "src/image.png": b"\x89PNG\x00\x00",
            "node_modules/dep/index.js": "module.exports = 1\n",
            ".gitignore": "*.log\n",
            "tracked.log": "committed before it was ignored\n",
        },
    )
    (work / "link.txt").symlink_to("README.md")
    git(work, "add", "-A")
    git(work, "add", "-f", "tracked.log")
    git(
        work,
        "update-index",
        "--add",
        "--cacheinfo",
        "160000,0123456789abcdef0123456789abcdef01234567,vendored-sub",
    )
    git(work, "commit", "-q", "-m", "fixture")
    git(base, "clone", "-q", "--bare", str(work), "repo.git")
    bare = base / "repo.git"
    return bare, git(bare, "rev-parse", "HEAD").strip()


def git_snapshot(bare: Path, commit: str | None) -> Snapshot:
    return Snapshot(
        source="remote",
        type="remote_repo",
        version=commit or "head",
        trees=[Tree(repo="acme/demo", kind="git", path=str(bare), commit=commit)],
    )


def test_git_tree_is_read_from_the_object_store(
    bare_repo: tuple[Path, str], build: Build, tmp_path: Path
) -> None:
    bare, head = bare_repo
    stats = build([git_snapshot(bare, head)])
    records = read_jsonl(tmp_path / "out" / "corpus.jsonl")
    assert [r["path"] for r in records] == [".gitignore", "README.md", "src/app.py", "tracked.log"]
    for record in records:  # the blob SHA git itself stores is the record's sha
        assert record["sha"] == git(bare, "rev-parse", f"{head}:{record['path']}").strip()
        assert record["commit"] == head and record["repo"] == "acme/demo" and record["source"] == "remote"
    assert stats["skipped"] == {"binary": 1, "duplicate": 1, "submodule": 1, "symlink": 1}
    assert stats["skipped_dirs"] == {"vendored": 1}
    assert stats["sources"]["remote"]["commits"] == {"acme/demo": head}


def test_git_tree_without_a_commit_reads_head(bare_repo: tuple[Path, str], build: Build) -> None:
    bare, _ = bare_repo
    assert build([git_snapshot(bare, None)])["files"] == 4


def test_an_unknown_commit_is_a_corpus_error(bare_repo: tuple[Path, str], build: Build) -> None:
    bare, _ = bare_repo
    with pytest.raises(CorpusError, match="source 'remote'"):
        build([git_snapshot(bare, "f" * 40)])


def docs_snapshot(path: Path) -> Snapshot:
    return Snapshot(
        source="kb",
        type="bedrock_knowledge_base",
        version="q1",
        trees=[Tree(repo="KB12345678", kind="docs", path=str(path))],
    )


def test_docs_records_keep_their_provenance(tmp_path: Path, build: Build) -> None:
    docs = tmp_path / "docs.jsonl"
    records = [
        {"path": "s3://bucket/guide.md", "text": "How to deploy.\n", "score": 0.9},
        {"path": "s3://bucket/empty.md", "text": ""},
        {"path": "s3://bucket/node_modules/x.js", "text": "vendored\n"},
        {"text": "no path given"},
        {"path": "s3://bucket/again.md", "text": "How to deploy.\n"},
    ]
    docs.write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n\n")
    stats = build([docs_snapshot(docs)])
    out = read_jsonl(tmp_path / "out" / "corpus.jsonl")
    assert [(r["path"], r["text"], r["repo"]) for r in out] == [
        ("s3://bucket/guide.md", "How to deploy.\n", "KB12345678"),
        ("record-4", "no path given", "KB12345678"),
    ]
    assert stats["skipped"] == {"empty": 1, "vendored": 1, "duplicate": 1}
    txt = (tmp_path / "out" / "corpus.txt").read_text()
    assert txt.startswith(
        "--- source: kb | repo: KB12345678 | path: s3://bucket/guide.md ---\nHow to deploy.\n"
    )


def test_a_broken_docs_file_names_the_line(tmp_path: Path, build: Build) -> None:
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"path": "a", "text": "ok"}\n{broken\n')
    with pytest.raises(CorpusError, match=r"docs.jsonl:2 is not a JSON record"):
        build([docs_snapshot(docs)])
