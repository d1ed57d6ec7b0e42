"""What git itself lists in a directory: the files it does not ignore and the entries it ignores.

git is the one source of truth for .gitignore semantics here: every directory the corpus walks is
asked of the git CLI, never matched by a port of its rules. Per directory, one `git status
--porcelain=v2 -z --untracked-files=all --ignored=matching` run against a throw-away git directory
(`git init` in a temporary directory, removed afterwards) gives the untracked files git does not
ignore and the ignored entries (an ignored directory once, as `dir/`, without its contents), with
the tree's nested .gitignore files applied exactly as git applies them. A git work tree (one whose
`.git` git accepts) is read the same way, plus:

- its `info/exclude` (wherever git keeps it: `git rev-parse --git-path`) as the lowest-precedence
  rules, which is where git puts them;
- its tracked files (`git ls-files -z --cached`, which only reads the index): tracked files are
  never ignored, as in git, even below an ignored directory.

The listing of a work tree is therefore `git ls-files --cached --others --exclude-standard`, and
that of a plain directory the same with a throw-away GIT_DIR; tests compare both with git directly.
Status runs against the empty index of the throw-away directory only, so it never reads or hashes
file contents (no clean filters, whatever .gitattributes says).

The tree is untrusted input: git runs with a clean environment (no GIT_DIR, GIT_WORK_TREE or
other GIT_* variable leaks in), no system or global config, no user excludes file
(`core.excludesFile=/dev/null`: nothing outside the tree and its own git directory is read), no
fsmonitor, no hooks, no untracked cache, no optional locks (nothing is written to the repository),
case-sensitive matching whatever the repository's config says, and explicit `--git-dir` and
`--work-tree`, so a `.git/config` planted in the tree cannot run a program or point git elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from multiagenttrainer.corpus.filters import CACHE_DIRS, VCS_DIRS
from multiagenttrainer.errors import CorpusError

GIT_TIMEOUT_S = 600
NO_FILE = os.devnull
# Config that no repository, user or system file may change for these commands.
CONTROLLED_CONFIG = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.untrackedCache=false",
    "core.ignoreCase=false",
)
# Directories the walk prunes anyway: excluded in the throw-away directory too, so git does not list
# their contents (directory-only patterns: they change nothing else).
PRUNED_PATTERNS = "".join(f"{name}/\n" for name in sorted(VCS_DIRS | CACHE_DIRS))


@dataclass(frozen=True)
class GitView:
    """What git lists under one directory, as paths relative to it (bytes, `/`-separated).

    `untracked`: files git does not ignore, and nested repositories as `name/`, in git's order;
    `ignored`: ignored files, and ignored directories as `name/` (their contents not listed);
    `tracked`: the index's paths (a submodule as `name`), empty for a plain directory.
    """

    untracked: tuple[bytes, ...]
    ignored: tuple[bytes, ...]
    tracked: frozenset[bytes] = frozenset()


def git_environment(home: str) -> dict[str, str]:
    """A clean environment for git: PATH and a locale only, no system or global config."""
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "LC_ALL": "C",
        "HOME": home,
        "XDG_CONFIG_HOME": home,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": NO_FILE,
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_NO_REPLACE_OBJECTS": "1",
    }


class GitRunner:
    """Runs git commands for one walk; owns the throw-away git directory, removed by `close`."""

    def __init__(self) -> None:
        self.scratch = tempfile.mkdtemp(prefix="mat-git-")
        self.env = git_environment(os.path.join(self.scratch, "home"))
        self.git_dir = os.path.join(self.scratch, "git")
        try:
            self.run(["init", "-q", "--bare", "--template=", self.git_dir], self.scratch)
            os.mkdir(os.path.join(self.git_dir, "info"))
            with open(os.path.join(self.git_dir, "info", "exclude"), "w") as handle:
                handle.write(PRUNED_PATTERNS)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def command(self, args: Sequence[str], excludes: str = NO_FILE) -> list[str]:
        config = [arg for setting in CONTROLLED_CONFIG for arg in ("-c", setting)]
        return ["git", "--no-pager", *config, "-c", f"core.excludesFile={excludes}", *args]

    def start(self, args: Sequence[str], cwd: str, excludes: str = NO_FILE) -> subprocess.Popen[bytes]:
        """Start a git command; its stdout and stderr are read by `finish`."""
        try:
            return subprocess.Popen(
                self.command(args, excludes),
                cwd=cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except FileNotFoundError as exc:
            if exc.filename == cwd:  # the directory, not git, is missing
                raise
            raise CorpusError(
                "git is not installed: install git, which mat uses to apply .gitignore rules"
            ) from exc

    def finish(self, process: subprocess.Popen[bytes], what: str) -> bytes:
        """The output of a started command; CorpusError with git's message when it failed."""
        code, out, err = self._wait(process, what)
        if code != 0:
            raise CorpusError(f"`git {what}` failed: {_message(err)}")
        return out

    def _wait(self, process: subprocess.Popen[bytes], what: str) -> tuple[int, bytes, bytes]:
        try:
            out, err = process.communicate(timeout=GIT_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            process.communicate()
            raise CorpusError(f"`git {what}` took over {GIT_TIMEOUT_S} s") from exc
        return process.returncode, out, err

    def run(self, args: Sequence[str], cwd: str, excludes: str = NO_FILE) -> bytes:
        return self.finish(self.start(args, cwd, excludes), args[0])

    def view(self, top: str, work: tuple[str, str] | None) -> GitView:
        """What git lists under the directory `top` (absolute): a plain directory, or a work tree
        with `work`, what `work_tree` found. Status and ls-files run side by side."""
        status_args = ["status", "--porcelain=v2", "-z", "--untracked-files=all", "--ignored=matching"]
        excludes = work[0] if work else NO_FILE
        status = self.start([f"--git-dir={self.git_dir}", f"--work-tree={top}", *status_args], top, excludes)
        try:
            tracked = self._tracked(top) if work else frozenset()
        except BaseException:
            status.kill()
            status.communicate()
            raise
        untracked, ignored = _parse_status(self.finish(status, f"status in {top}"))
        return GitView(untracked, ignored, tracked)

    def _tracked(self, top: str) -> frozenset[bytes]:
        """The paths in a work tree's index (which git never ignores)."""
        args = [f"--git-dir={os.path.join(top, '.git')}", f"--work-tree={top}", "ls-files", "-z", "--cached"]
        listed = self.finish(self.start(args, top), f"ls-files in {top}")
        return frozenset(listed.split(b"\0")) - {b""}

    def work_tree(self, top: str) -> tuple[str, str] | None:
        """(exclude file, index) of a work tree, where git keeps them; None for a plain directory or
        a `.git` git does not take for a repository."""
        if not os.path.lexists(os.path.join(top, ".git")):
            return None
        # Relative names, so that the answer (one path a line) holds no part of top, whatever its name.
        args = [
            "--git-dir=.git",
            "--work-tree=.",
            "rev-parse",
            "--git-path",
            "info/exclude",
            "--git-path",
            "index",
        ]
        process = self.start(args, top)
        code, out, _ = self._wait(process, f"rev-parse in {top}")
        paths = out.splitlines()
        if code != 0 or len(paths) != 2:  # not a repository after all: read as a plain directory
            return None
        return os.path.join(top, os.fsdecode(paths[0])), os.path.join(top, os.fsdecode(paths[1]))


def _parse_status(out: bytes) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """The `?` (untracked) and `!` (ignored) entries of `git status --porcelain=v2 -z`, in its order."""
    untracked, ignored = [], []
    for entry in out.split(b"\0"):
        if entry[:2] == b"? ":
            untracked.append(entry[2:])
        elif entry[:2] == b"! ":
            ignored.append(entry[2:])
    return tuple(untracked), tuple(ignored)


def _message(stderr: bytes) -> str:
    """git's reason in one line: its first fatal or error line, else its first line."""
    lines = stderr.decode("utf-8", "replace").strip().splitlines() or ["no message"]
    return next((line for line in lines if line.startswith(("fatal:", "error:"))), lines[0])


@contextmanager
def git_runner() -> Iterator[GitRunner]:
    """A GitRunner for one walk, its throw-away directory removed afterwards."""
    runner = GitRunner()
    try:
        yield runner
    finally:
        runner.close()
