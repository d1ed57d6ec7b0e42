"""Git operations on a training workspace, through the git CLI, with a configuration the agent cannot change.

A workspace is an ordinary git work tree: coding agents (claude, aider, codex) drive it with plain `git`,
so mat does too rather than going through a library with its own view of the index. But the agent can
also write `.git/config`, hooks, attributes and index bits, and git runs what its configuration names
(an fsmonitor, hooks, a pager, diff and filter drivers, credential helpers, files pulled in by include).
So every command mat runs here:

- gets a scrubbed environment: no GIT_* variable from outside, no system or global config
  (GIT_CONFIG_NOSYSTEM, GIT_CONFIG_GLOBAL=/dev/null), no replace objects, a fixed identity, no prompts;
- names the git directory and the work tree explicitly (a planted core.worktree or .git file is ignored);
- overrides, with `-c`, every setting that makes git run a program or changes what it sees
  (see _GIT_OPTIONS);
- and runs only after `restore_control_files` put back the config mat wrote at set-up and removed
  hooks, info/attributes, info/sparse-checkout, alternates and grafts: the loop calls it after every
  agent turn and training run, before any other git command.

What changed in a work tree is decided by content, not by `git status`: `revert_except` compares every
file with the commit's tree (ignored files included, skip-worktree and assume-unchanged bits ignored)
and puts back the commit's bytes, then rebuilds the index from the commit.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.workspace import worktree
from multiagenttrainer.workspace.worktree import Entry, Spared

AUTHOR_NAME = "mat"
AUTHOR_EMAIL = "mat@localhost"
GIT_TIMEOUT_S = 120
TRAIN_FILE = "train.py"
_PATHS_FROM_STDIN = ("--pathspec-from-file=-", "--pathspec-file-nul")  # no argv limit for many paths
# Settings a repository's own config (or the user's) could use to make mat's git calls run a program or
# see a different tree; each is pinned here, whatever .git/config says.
_GIT_SETTINGS = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "core.editor=true",
    "core.askPass=",
    "core.sshCommand=",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "core.sparseCheckout=false",
    "core.sparseCheckoutCone=false",
    "core.splitIndex=false",
    "core.untrackedCache=false",
    "core.bare=false",
    "diff.external=",
    "credential.helper=",
    "commit.gpgsign=false",
    "tag.gpgsign=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "protocol.allow=never",
    "submodule.recurse=false",
    "index.sparse=false",
)
_GIT_OPTIONS = (
    "--no-pager",
    "--no-replace-objects",
    "--literal-pathspecs",
    *(arg for setting in _GIT_SETTINGS for arg in ("-c", setting)),
)
# The environment variables git may keep from mat's own environment; every other one is dropped.
_ENV_KEPT = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "SYSTEMROOT")
# Files below .git that make git run programs or see other objects and paths; mat's copy of config (and of
# info/exclude) is put back, the rest is removed (hooks/ is emptied).
CONTROL_FILES = ("config", "info/exclude")
REMOVED_CONTROL_FILES = (
    "config.worktree",
    "commondir",
    "info/attributes",
    "info/sparse-checkout",
    "info/grafts",
    "objects/info/alternates",
    "objects/info/http-alternates",
)
# What a content comparison leaves alone by default: mat's own outputs in a workspace, the data directory
# (the evaluator checks it by hash) and an interpreter environment (see the README's protections).
DEFAULT_SPARED = Spared(
    files=frozenset({"run.log", "results.tsv", ".mat-description", "checkpoint.pt"}),
    dirs=frozenset({"data", ".venv"}),
)
SCRATCH_DIRS = frozenset({"__pycache__"})  # caches any Python run leaves; removed without a note

ChangeKind = Literal["modified", "added", "deleted"]


@dataclass(frozen=True)
class StatusEntry:
    """One line of `git status --porcelain`: index and work-tree codes and the path."""

    index: str
    worktree: str
    path: str

    @property
    def untracked(self) -> bool:
        return self.index == "?"


@dataclass(frozen=True)
class Change:
    """A path whose content differs from a commit's tree."""

    path: str
    kind: ChangeKind

    @property
    def scratch(self) -> bool:
        """A Python cache file: removed, but not worth a note."""
        return not SCRATCH_DIRS.isdisjoint(self.path.split("/"))


def git_env() -> dict[str, str]:
    """The environment for git: a few of mat's variables, no config but mat's, a fixed identity."""
    env = {name: os.environ[name] for name in _ENV_KEPT if name in os.environ}
    return {
        **env,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": AUTHOR_NAME,
        "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
        "GIT_COMMITTER_NAME": AUTHOR_NAME,
        "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
    }


def git_command(workspace: Path | None, *args: str) -> list[str]:
    """`git` with mat's options, the workspace's .git and work tree named explicitly, then `args`."""
    where = [] if workspace is None else [f"--git-dir={workspace / '.git'}", f"--work-tree={workspace}"]
    return ["git", *where, *_GIT_OPTIONS, *args]


DISK_FULL_SIGNS = ("No space left on device", "Out of diskspace", "Disk quota exceeded")


def run_git(workspace: Path, *args: str, stdin: bytes | None = None, check: bool = True) -> str:
    """Run `git <args>` in the workspace and return its stdout; raise ExperimentError on failure."""
    return run_git_bytes(workspace, *args, stdin=stdin, check=check).decode("utf-8", "surrogateescape")


def transfer(workspace: Path, hub: Path, git_copy: Path, *args: str) -> str:
    """`git <args>` pushing to or fetching from `hub`, another repository of the run on this machine (the
    hub of a run on several machines). The git on the hub's side reads the hub's own config and hooks, so
    mat's copy of its control files (`git_copy`) is put back there first; the file transport, refused to
    every other call, is allowed for this one."""
    restore_control_files(hub, git_copy)
    return run_git(workspace, "-c", "protocol.file.allow=always", *args)


def run_git_bytes(workspace: Path, *args: str, stdin: bytes | None = None, check: bool = True) -> bytes:
    """run_git, returning stdout as bytes (blob contents)."""
    try:
        done = subprocess.run(
            git_command(workspace, *args),
            cwd=workspace,
            env=git_env(),
            input=stdin,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
        )
    except FileNotFoundError as exc:
        raise ExperimentError("git is not installed: install git, which mat needs for workspaces") from exc
    except subprocess.TimeoutExpired as exc:
        raise ExperimentError(f"`git {args[0]}` in {workspace} took over {GIT_TIMEOUT_S} s") from exc
    if check and done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip() or f"exit code {done.returncode}"
        if any(sign in message for sign in DISK_FULL_SIGNS):  # the same failure as any other write
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(workspace))
        raise ExperimentError(f"`git {' '.join(args[:2])}` failed in {workspace}: {message}")
    return done.stdout


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
    command = git_command(None, "check-ref-format", "--branch", name)
    return subprocess.run(command, env=git_env(), cwd="/", capture_output=True).returncode == 0


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
    out = run_git(
        workspace, "diff", "--name-only", "--no-renames", "--no-ext-diff", "--no-textconv", "-z", old, new
    )
    return [path for path in out.split("\0") if path]


# ---------------------------------------------------------------- work-tree state


def status_entries(workspace: Path) -> list[StatusEntry]:
    """Every changed, staged or untracked (not ignored) path, from `git status --porcelain -z`.

    This is git's view, which index bits and ignore rules shape; decisions use `changes_against`.
    """
    out = run_git(
        workspace,
        "--no-optional-locks",
        "status",
        "--porcelain=v1",
        "-z",
        "--untracked-files=all",
        "--no-renames",
    )
    return [StatusEntry(item[0], item[1], item[3:]) for item in out.split("\0") if len(item) > 3]


def changed_paths(workspace: Path) -> list[str]:
    """Paths that differ from HEAD (staged, unstaged or untracked), sorted, as `git status` sees them."""
    return sorted(entry.path for entry in status_entries(workspace))


@dataclass(frozen=True)
class TreeEntry:
    """A file of a commit's tree: its git mode (100644, 100755, 120000) and object id."""

    mode: str
    oid: str


def tree_entries(workspace: Path, commit: str) -> dict[str, TreeEntry]:
    """Every file and symlink of `commit`'s tree by path (submodules left out)."""
    out = run_git(workspace, "ls-tree", "-r", "-z", "--full-tree", commit)
    entries: dict[str, TreeEntry] = {}
    for item in out.split("\0"):
        if not item:
            continue
        meta, _, path = item.partition("\t")
        mode, kind, oid = meta.split(" ")
        if kind == "blob":
            entries[path] = TreeEntry(mode, oid)
    return entries


def read_blobs(workspace: Path, oids: Iterable[str]) -> dict[str, bytes]:
    """The raw contents of blobs (no filter, no line-ending conversion), by object id."""
    wanted = sorted(set(oids))
    if not wanted:
        return {}
    out = run_git_bytes(workspace, "cat-file", "--batch", stdin="".join(f"{o}\n" for o in wanted).encode())
    blobs: dict[str, bytes] = {}
    position = 0
    while position < len(out):
        header_end = out.index(b"\n", position)
        oid, kind, size = out[position:header_end].decode().split(" ")
        start = header_end + 1
        blobs[oid] = out[start : start + int(size)]
        position = start + int(size) + 1
    return blobs


def hash_name(oid: str) -> str:
    """The hash behind an object id: sha256 repositories have 64-digit ids."""
    return "sha256" if len(oid) == 64 else "sha1"


def matches(workspace: Path, path: str, entry: Entry, expected: TreeEntry) -> bool:
    """Whether the work-tree entry has the tree entry's kind, executable bit and content."""
    wanted_link = expected.mode == "120000"
    if entry.kind != ("link" if wanted_link else "file"):
        return False
    if not wanted_link and entry.executable != (expected.mode == "100755"):
        return False
    return worktree.git_blob_id(workspace / path, entry, hash_name(expected.oid)) == expected.oid


def changes_against(workspace: Path, commit: str, spared: Spared = DEFAULT_SPARED) -> list[Change]:
    """Every file or link whose kind, mode or content differs from `commit`'s tree, sorted by path.

    Ignored files and files the index hides (skip-worktree, assume-unchanged) count like any other;
    paths under `spared` are left out. Directories count only through what is in them.
    """
    expected = {
        path: entry for path, entry in tree_entries(workspace, commit).items() if not spared.covers(path)
    }
    present = {path: e for path, e in worktree.scan(workspace, spared).items() if e.kind != "dir"}
    changes = [Change(path, "added") for path in present if path not in expected]
    for path, tree_entry in expected.items():
        entry = present.get(path)
        if entry is None:
            changes.append(Change(path, "deleted"))
        elif not matches(workspace, path, entry, tree_entry):
            changes.append(Change(path, "modified"))
    return sorted(changes, key=lambda change: change.path)


def file_changed(workspace: Path, path: str, commit: str = "HEAD") -> bool:
    """Whether the file at `path` differs from `commit` by kind, mode or content."""
    expected = tree_entries(workspace, commit).get(path)
    try:
        entry = worktree.entry_of((workspace / path).lstat())
    except FileNotFoundError:
        return expected is not None
    return expected is None or not matches(workspace, path, entry, expected)


def train_py_changed(workspace: Path, commit: str = "HEAD") -> bool:
    """Whether train.py differs from `commit` (HEAD by default), judged by its content."""
    return file_changed(workspace, TRAIN_FILE, commit)


def put_back(
    workspace: Path, commit: str, changes: Sequence[Change], spared: Spared = DEFAULT_SPARED
) -> None:
    """Make each changed path what it is in `commit` (its bytes and mode), or remove it when `commit` has
    no such file; then remove the directories left empty."""
    expected = tree_entries(workspace, commit)
    for change in changes:
        if change.path not in expected:
            worktree.remove(workspace, change.path)
    restored = [change for change in changes if change.path in expected]
    blobs = read_blobs(workspace, (expected[change.path].oid for change in restored))
    for change in restored:
        entry = expected[change.path]
        link, executable = entry.mode == "120000", entry.mode == "100755"
        worktree.write_file(workspace, change.path, blobs[entry.oid], executable=executable, link=link)
    remove_empty_dirs(workspace, expected, spared)


def remove_empty_dirs(workspace: Path, expected: dict[str, TreeEntry], spared: Spared) -> None:
    """Remove every empty directory (deepest first) that holds none of the commit's files."""
    directories = [p for p, e in worktree.scan(workspace, spared).items() if e.kind == "dir"]
    for directory in sorted(directories, key=lambda d: d.count("/"), reverse=True):
        if not any(path.startswith(directory + "/") for path in expected):
            try:
                (workspace / directory).rmdir()
            except OSError:
                continue


def rebuild_index(workspace: Path, commit: str) -> None:
    """Make the index `commit`'s tree afresh: no skip-worktree or assume-unchanged bit survives."""
    run_git(workspace, "read-tree", commit)
    run_git(workspace, "update-index", "-q", "--refresh", check=False)  # exit 1: some files differ


def revert_changes(
    workspace: Path,
    keep: Iterable[str] = (TRAIN_FILE,),
    *,
    commit: str = "HEAD",
    spared: Spared = DEFAULT_SPARED,
) -> list[Change]:
    """Put every path except the `keep` files back to `commit` by content; return the changes undone.

    A kept path is kept only as a regular file: a link or a directory there is reverted too. Python
    caches (__pycache__) are removed but not returned.
    """
    kept = {path for path in keep if _is_regular_file(workspace / path)}
    changes = [change for change in changes_against(workspace, commit, spared) if change.path not in kept]
    put_back(workspace, commit, changes, spared)
    rebuild_index(workspace, commit)
    return [change for change in changes if not change.scratch]


def revert_except(
    workspace: Path,
    keep: Iterable[str] = (TRAIN_FILE,),
    *,
    commit: str = "HEAD",
    spared: Spared = DEFAULT_SPARED,
) -> list[str]:
    """revert_changes, returning the reverted paths, sorted."""
    return sorted(change.path for change in revert_changes(workspace, keep, commit=commit, spared=spared))


def _is_regular_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def delete_path(workspace: Path, relative: str) -> None:
    """Remove a file, link or directory below the workspace, then any directories it leaves empty."""
    worktree.remove(workspace, relative.rstrip("/"))
    parent = (workspace / relative.rstrip("/")).parent
    while parent != workspace and workspace in parent.parents:
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent


# ---------------------------------------------------------------- .git itself


def check_git_dir(workspace: Path) -> Path:
    """The workspace's .git, which must be a real directory (not a link, nor a `gitdir:` file)."""
    git_dir = workspace / ".git"
    if git_dir.is_symlink() or not git_dir.is_dir():
        raise ExperimentError(
            f"{git_dir} is no longer a directory (something replaced it with a link or a file); "
            "the run's history cannot be trusted, so start a new run"
        )
    return git_dir


def save_control_files(workspace: Path, destination: Path) -> None:
    """Copy .git/config and .git/info/exclude as they are now (mat's own) to `destination`."""
    git_dir = check_git_dir(workspace)
    destination.mkdir(parents=True, exist_ok=True)
    for name in CONTROL_FILES:
        saved = destination / name.replace("/", "-")
        if (git_dir / name).is_file():
            shutil.copyfile(git_dir / name, saved)
        else:
            saved.unlink(missing_ok=True)


def restore_control_files(workspace: Path, saved: Path) -> list[tuple[str, ChangeKind]]:
    """Put back mat's .git/config and info/exclude from `saved`, empty hooks/ and remove the files that
    redirect git (REMOVED_CONTROL_FILES); return each `.git/...` path that was changed, and how."""
    git_dir = check_git_dir(workspace)
    changed: list[tuple[str, ChangeKind]] = []
    for name in CONTROL_FILES:
        kind = _restore_control_file(git_dir, name, saved)
        if kind is not None:
            changed.append((f".git/{name}", kind))
    return changed + [(path, "added") for path in remove_redirections(git_dir)]


def remove_redirections(git_dir: Path) -> list[str]:
    """Remove REMOVED_CONTROL_FILES and empty hooks/; return the `.git/...` paths that were there."""
    removed = []
    for name in REMOVED_CONTROL_FILES:
        if os.path.lexists(git_dir / name):
            worktree.remove(git_dir, name)
            removed.append(f".git/{name}")
    return removed + remove_hooks(git_dir)


def remove_hooks(git_dir: Path) -> list[str]:
    """Empty .git/hooks (or remove whatever stands in its place); return what was there."""
    hooks = git_dir / "hooks"
    if not os.path.lexists(hooks):
        return []
    if hooks.is_symlink() or not hooks.is_dir():
        worktree.remove(git_dir, "hooks")
        return [".git/hooks"]
    planted = sorted(entry.name for entry in worktree.list_dir(hooks))
    for name in planted:
        worktree.remove(hooks, name)
    return [f".git/hooks/{name}" for name in planted]


def _restore_control_file(git_dir: Path, name: str, saved: Path) -> ChangeKind | None:
    """Make .git/<name> mat's copy (or absent when mat had none); how it had changed, or None."""
    copy = saved / name.replace("/", "-")
    target = git_dir / name
    wanted = copy.read_bytes() if copy.is_file() else None
    present = os.path.lexists(target)
    current = target.read_bytes() if target.is_file() and not target.is_symlink() else None
    if wanted == current and (current is not None or not present):
        return None
    if wanted is None:
        worktree.remove(git_dir, name)
        return "added"
    worktree.write_file(git_dir, name, wanted)
    return "modified" if present else "deleted"
