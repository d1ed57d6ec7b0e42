"""local_repo: a directory on this machine, a git work tree or a plain folder, read in place.

Nothing is copied. The version is a fingerprint of (path, size, mtime) of every file the corpus
walk would read (the same .gitignore rules, include/exclude globs and pruning), plus the HEAD
commit in a work tree, so any edit, add, delete or commit changes it. With a cache directory in
the context (the Ingester gives `<staging>/listings`), an unchanged tree is fingerprinted from the
last walk's snapshot, by stat-ing what it recorded, without walking again.

The configured directory is the top of the walk, whose ignore rules are git's own (corpus/gitview.py):
.gitignore files in it and below it apply, and, when it is the top of a work tree, its
`info/exclude` and its index (tracked files are never ignored); ignore files above it do not (so
pointing a source at an ignored folder of some repository still reads that folder). A directory is
a git work tree when it has a `.git` entry that git accepts.
"""

from __future__ import annotations

from pathlib import Path

from dulwich.errors import NotGitRepository
from dulwich.refs import HEADREF
from dulwich.repo import Repo

from multiagenttrainer.config import LocalRepoSource, expand_path
from multiagenttrainer.corpus.ignore import PathSelector
from multiagenttrainer.corpus.walk import directory_fingerprint
from multiagenttrainer.errors import CorpusError, SourceError
from multiagenttrainer.sources.base import Snapshot, SourceContext, SourceInfo, Tree


def git_head(path: Path) -> tuple[str | None, str | None]:
    """(branch, commit SHA) of a work tree's HEAD; (None, None) for a plain directory.

    The branch is None for a detached HEAD, the SHA for a repository without commits.
    """
    if not (path / ".git").exists():
        return None, None
    try:
        with Repo(str(path)) as repo:
            target = repo.refs.read_ref(HEADREF) or b""
            branch = (
                target[len(b"ref: refs/heads/") :].decode()
                if target.startswith(b"ref: refs/heads/")
                else None
            )
            try:
                commit: str | None = repo.head().decode()
            except KeyError:
                commit = None
            return branch, commit
    except (NotGitRepository, OSError):
        return None, None


class LocalRepo:
    """A local directory, read in place by the corpus builder."""

    def __init__(self, cfg: LocalRepoSource, name: str, ctx: SourceContext) -> None:
        self.cfg = cfg
        self.name = name
        self.path = expand_path(cfg.path).absolute()
        self.selector = PathSelector.from_lists([cfg.include], [cfg.exclude])
        self.cache_dir = ctx.cache_dir  # listing snapshots: an unchanged tree is fingerprinted without a walk

    def describe(self) -> SourceInfo:
        """Location is the absolute path; branch is the checked-out branch of a work tree."""
        branch, _ = git_head(self.path)
        return SourceInfo(self.name, "local_repo", str(self.path), branch)

    def resolve(self) -> str:
        """The fingerprint of the directory's files (and HEAD commit); fast enough to run every time."""
        _, commit = git_head(self.path)
        return self._fingerprint(commit)

    def fetch(self, staging: Path) -> Snapshot:
        """No copy: a snapshot naming the directory itself."""
        _, commit = git_head(self.path)
        tree = Tree(repo=self.path.name or str(self.path), kind="dir", path=str(self.path), commit=commit)
        return Snapshot(
            source=self.name,
            type="local_repo",
            version=self._fingerprint(commit),
            trees=[tree],
            include=list(self.cfg.include),
            exclude=list(self.cfg.exclude),
        )

    def _fingerprint(self, commit: str | None) -> str:
        self._require_directory()
        try:
            salt = f"local_repo:{self.path}:{commit or ''}"  # two copies of a tree are two versions
            return directory_fingerprint(self.path, self.selector, salt, self.cache_dir)
        except OSError as exc:
            raise SourceError(self.name, f"cannot read {exc.filename or self.path}: {exc.strerror}") from exc
        except CorpusError as exc:  # git could not list the directory
            raise SourceError(self.name, f"cannot list {self.path}: {exc}") from exc

    def _shown_path(self) -> str:
        """The configured path, with its absolute form when that says more."""
        return self.cfg.path if self.cfg.path == str(self.path) else f"{self.cfg.path} ({self.path})"

    def _require_directory(self) -> None:
        if not self.path.is_dir():
            problem = "is not a directory" if self.path.exists() else "does not exist"
            raise SourceError(
                self.name,
                f"path {self._shown_path()} {problem}; fix `path:` of this source in the config",
            )
