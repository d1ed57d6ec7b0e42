"""Bare git repositories built directly with dulwich: fast fixtures, no git CLI, no work tree."""

from __future__ import annotations

import time
from pathlib import Path

from dulwich.objects import Blob, Commit, Tree
from dulwich.repo import Repo

AUTHOR = b"Fixture <fixture@example.com>"


def empty_bare_repo(path: Path) -> Path:
    """A bare repository with no commits (HEAD points to an unborn main)."""
    path.mkdir(parents=True)
    Repo.init_bare(str(path)).close()
    return path


def commit_files(path: Path, files: dict[str, str], branch: str = "main", message: str = "change") -> str:
    """Commit `files` (a flat name -> text map) on `branch` of the bare repo at `path`; return the SHA."""
    if not (path / "HEAD").exists():
        empty_bare_repo(path)
    ref = f"refs/heads/{branch}".encode()
    with Repo(str(path)) as repo:
        tree = Tree()
        for name, text in sorted(files.items()):
            blob = Blob.from_string(text.encode())
            repo.object_store.add_object(blob)
            tree.add(name.encode(), 0o100644, blob.id)
        repo.object_store.add_object(tree)
        commit = Commit()
        commit.tree = tree.id
        commit.parents = [repo.refs[ref]] if ref in repo.refs else []
        commit.author = commit.committer = AUTHOR
        commit.author_time = commit.commit_time = int(time.time())
        commit.author_timezone = commit.commit_timezone = 0
        commit.message = message.encode()
        repo.object_store.add_object(commit)
        repo.refs[ref] = commit.id
        repo.refs.set_symbolic_ref(b"HEAD", ref)
        return commit.id.decode()
