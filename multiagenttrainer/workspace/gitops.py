"""Git operations on a training workspace, through the git CLI.

A workspace is an ordinary git work tree: coding agents (claude, aider, codex) drive it with plain `git`,
so mat does too rather than going through a library with its own view of the index. Every command runs
with a fixed identity ("mat <mat@localhost>"), without hooks or signing, and with literal pathspecs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from multiagenttrainer.errors import ExperimentError

AUTHOR_NAME = "mat"
AUTHOR_EMAIL = "mat@localhost"
GIT_TIMEOUT_S = 120
TRAIN_FILE = "train.py"
_PATHS_FROM_STDIN = ("--pathspec-from-file=-", "--pathspec-file-nul")  # no argv limit for many paths
# Options for every command: the user's global hooks and signing settings must not apply here.
_GIT_OPTIONS = ("-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", "--literal-pathspecs")


@dataclass(frozen=True)
class StatusEntry:
    """One line of `git status --porcelain`: index and work-tree codes and the path."""

    index: str
    worktree: str
    path: str

    @property
    def untracked(self) -> bool:
        return self.index == "?"


def git_env() -> dict[str, str]:
    """The environment for git: the fixed author and committer, no prompts."""
    identity = {
        "GIT_AUTHOR_NAME": AUTHOR_NAME,
        "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
        "GIT_COMMITTER_NAME": AUTHOR_NAME,
        "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
    }
    return {**os.environ, **identity, "GIT_TERMINAL_PROMPT": "0"}


def run_git(workspace: Path, *args: str, stdin: bytes | None = None, check: bool = True) -> str:
    """Run `git <args>` in the workspace and return its stdout; raise ExperimentError on failure."""
    command = ["git", *_GIT_OPTIONS, *args]
    try:
        done = subprocess.run(
            command, cwd=workspace, env=git_env(), input=stdin, capture_output=True, timeout=GIT_TIMEOUT_S
        )
    except FileNotFoundError as exc:
        raise ExperimentError("git is not installed: install git, which mat needs for workspaces") from exc
    except subprocess.TimeoutExpired as exc:
        raise ExperimentError(f"`git {args[0]}` in {workspace} took over {GIT_TIMEOUT_S} s") from exc
    if check and done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip() or f"exit code {done.returncode}"
        raise ExperimentError(f"`git {' '.join(args[:2])}` failed in {workspace}: {message}")
    return done.stdout.decode("utf-8", "surrogateescape")


# ---------------------------------------------------------------- repository set-up


def configure_repo(workspace: Path) -> None:
    """Store mat's identity in the repo config, so agents that run `git commit` themselves can commit."""
    run_git(workspace, "config", "user.name", AUTHOR_NAME)
    run_git(workspace, "config", "user.email", AUTHOR_EMAIL)
    run_git(workspace, "config", "commit.gpgsign", "false")


def init_repo(workspace: Path, branch: str) -> None:
    """`git init` with `branch` as the initial branch and mat's identity in the config."""
    workspace.mkdir(parents=True, exist_ok=True)
    run_git(workspace, "init", "-q", "--template=", f"--initial-branch={branch}")
    configure_repo(workspace)


def create_branch(workspace: Path, branch: str) -> None:
    """Create `branch` at HEAD and check it out (fails if it exists, as autoresearch's protocol wants)."""
    run_git(workspace, "checkout", "-q", "-b", branch)


def current_branch(workspace: Path) -> str | None:
    """The checked-out branch, or None on a detached HEAD."""
    name = run_git(workspace, "symbolic-ref", "-q", "--short", "HEAD", check=False).strip()
    return name or None


def is_valid_branch_name(name: str) -> bool:
    """Whether git accepts `name` as a branch name."""
    return subprocess.run(["git", "check-ref-format", "--branch", name], capture_output=True).returncode == 0


# ---------------------------------------------------------------- commits


def commit_paths(
    workspace: Path, message: str, paths: Sequence[str] | None = None, *, allow_empty: bool = False
) -> str:
    """Stage `paths` (everything when None) and commit them; return the new commit's full SHA."""
    if paths is None:
        run_git(workspace, "add", "-A")
    else:
        run_git(workspace, "add", "-A", "--", *paths)
    extra = ["--allow-empty"] if allow_empty else []
    run_git(workspace, "commit", "-q", "--no-verify", "--allow-empty-message", *extra, "-m", message)
    return head_sha(workspace)


def head_sha(workspace: Path) -> str:
    """The full SHA of HEAD."""
    return run_git(workspace, "rev-parse", "--verify", "HEAD").strip()


def resolve_commit(workspace: Path, ref: str) -> str | None:
    """The full SHA for a ref or abbreviated hash, or None when it names no commit here."""
    if not ref or ref.startswith("-"):
        return None
    sha = run_git(workspace, "rev-parse", "-q", "--verify", f"{ref}^{{commit}}", check=False).strip()
    return sha or None


def commit_message(workspace: Path, commit: str) -> str:
    """The full message of a commit."""
    return run_git(workspace, "log", "-1", "--format=%B", commit).strip()


def reset_hard(workspace: Path, commit: str, branch: str | None = None) -> None:
    """Point the branch at `commit` and make the work tree match it (tracked files only).

    With `branch`, that branch is checked out first, even if an agent switched to another one.
    """
    if branch is not None and current_branch(workspace) != branch:
        run_git(workspace, "checkout", "-q", "-f", "-B", branch, commit)
    else:
        run_git(workspace, "reset", "-q", "--hard", commit)


def attach_head(workspace: Path, branch: str) -> None:
    """Make `branch` the checked-out branch without touching the index or the work tree."""
    run_git(workspace, "symbolic-ref", "HEAD", f"refs/heads/{branch}")


def reset_soft(workspace: Path, commit: str) -> None:
    """Move the branch to `commit`, keeping every change since as staged changes."""
    run_git(workspace, "reset", "-q", "--soft", commit)


def changed_between(workspace: Path, old: str, new: str) -> list[str]:
    """Paths that differ between two commits."""
    out = run_git(workspace, "diff", "--name-only", "--no-renames", "-z", old, new)
    return [path for path in out.split("\0") if path]


# ---------------------------------------------------------------- work-tree state


def status_entries(workspace: Path) -> list[StatusEntry]:
    """Every changed, staged or untracked (not ignored) path, from `git status --porcelain -z`."""
    out = run_git(workspace, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames")
    return [StatusEntry(item[0], item[1], item[3:]) for item in out.split("\0") if len(item) > 3]


def changed_paths(workspace: Path) -> list[str]:
    """Paths that differ from HEAD (staged, unstaged or untracked), sorted."""
    return sorted(entry.path for entry in status_entries(workspace))


def train_py_changed(workspace: Path) -> bool:
    """Whether train.py differs from HEAD in the work tree or the index."""
    return TRAIN_FILE in changed_paths(workspace)


def revert_except(workspace: Path, keep: Iterable[str] = (TRAIN_FILE,)) -> list[str]:
    """Undo every change except to the `keep` paths; return the reverted paths, sorted.

    Tracked files are restored from HEAD (index and work tree); untracked and newly staged files that
    are not ignored are deleted. Ignored files (data/, run.log, results.tsv) are left alone.
    """
    kept = set(keep)
    entries = [entry for entry in status_entries(workspace) if entry.path not in kept]
    if not entries:
        return []
    paths = [entry.path for entry in entries]
    in_head = tracked_in_head(workspace, paths)
    restore = [p for p in paths if p in in_head]
    remove = [p for p in paths if p not in in_head]
    if restore:
        run_git(workspace, "checkout", "-q", "HEAD", *_PATHS_FROM_STDIN, stdin=nul_joined(restore))
    staged_new = [e.path for e in entries if e.path in remove and not e.untracked]
    if staged_new:
        run_git(
            workspace,
            "rm",
            "-q",
            "--cached",
            "--ignore-unmatch",
            *_PATHS_FROM_STDIN,
            stdin=nul_joined(staged_new),
        )
    for path in remove:
        delete_path(workspace, path)
    return sorted(paths)


def tracked_in_head(workspace: Path, paths: Sequence[str]) -> set[str]:
    """The subset of `paths` that exist as files in HEAD."""
    out = run_git(workspace, "ls-tree", "-r", "-z", "--name-only", "HEAD")
    wanted = set(paths)
    return {p for p in out.split("\0") if p in wanted}


def nul_joined(paths: Sequence[str]) -> bytes:
    """Paths as git's NUL-separated pathspec input."""
    return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)


def delete_path(workspace: Path, relative: str) -> None:
    """Remove a file or directory below the workspace, then any directories it leaves empty."""
    target = workspace / relative.rstrip("/")
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target, ignore_errors=True)
    else:
        target.unlink(missing_ok=True)
    parent = target.parent
    while parent != workspace and workspace in parent.parents:
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent
