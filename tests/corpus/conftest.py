"""Fixtures for the corpus tests: file trees on disk, git repositories made with the git CLI, snapshots."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from multiagenttrainer.config import CorpusConfig
from multiagenttrainer.corpus import accel, build_corpus
from multiagenttrainer.sources.base import Snapshot, Tree
from tests.support.git_servers import GIT_ENV

FileSpec = Mapping[str, "str | bytes"]


def git(cwd: Path, *args: str, stdin: bytes | None = None, ok: tuple[int, ...] = (0,)) -> str:
    """Run the git CLI with an isolated config (no user or system excludes); return stdout."""
    env = {**os.environ, **GIT_ENV, "XDG_CONFIG_HOME": str(cwd / ".no-xdg"), "HOME": str(cwd / ".no-home")}
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, input=stdin, capture_output=True, timeout=60, check=False
    )
    if done.returncode not in ok:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode("utf-8", "surrogateescape")


def git_listing(root: Path, scratch: Path) -> set[str]:
    """`git ls-files --cached --others --exclude-standard` of root: in its own repository for a work
    tree, with a throw-away GIT_DIR (made in scratch) for a plain directory."""
    command = ["ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    if not (root / ".git").exists():
        git_dir = scratch / "listing-git-dir"
        if not git_dir.exists():
            git(scratch, "init", "-q", "--bare", str(git_dir))
        command = [f"--git-dir={git_dir}", f"--work-tree={root}", *command]
    return {p for p in git(root, *command).split("\0") if p}


@contextmanager
def native_code(enabled: bool) -> Iterator[None]:
    """The native accelerators on or off (MAT_CORPUS_NATIVE), as a user sets them."""
    saved = os.environ.get(accel.DISABLE_VARIABLE)
    os.environ[accel.DISABLE_VARIABLE] = "1" if enabled else "0"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[accel.DISABLE_VARIABLE]
        else:
            os.environ[accel.DISABLE_VARIABLE] = saved


def write_tree(root: Path, files: FileSpec) -> Path:
    """Create files (text or bytes) under root; returns root."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


def dir_snapshot(root: Path, source: str = "src", version: str = "v1", **fields: Any) -> Snapshot:
    """A snapshot of a directory tree, as local_repo makes it."""
    tree = Tree(repo=root.name, kind="dir", path=str(root), commit=fields.pop("commit", None))
    return Snapshot(source=source, type="local_repo", version=version, trees=[tree], **fields)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture
def make_tree(tmp_path: Path) -> Callable[..., Path]:
    """make_tree(files, name="tree") -> a directory holding those files."""

    def make(files: FileSpec, name: str = "tree") -> Path:
        return write_tree(tmp_path / name, files)

    return make


@pytest.fixture
def build(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """build(snapshots, **options) -> stats; writes tmp_path/out/corpus.txt, in-process unless workers=N."""

    def run(
        snapshots: list[Snapshot],
        out: Path | None = None,
        workers: int = 0,
        chunk_bytes: int = 4 << 20,
        **options: Any,
    ) -> dict[str, Any]:
        target = out or tmp_path / "out"
        return build_corpus(
            snapshots,
            CorpusConfig(**options),
            target / "corpus.txt",
            workers=workers,
            chunk_bytes=chunk_bytes,
        )

    return run
