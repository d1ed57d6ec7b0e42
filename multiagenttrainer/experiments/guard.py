"""Keeping a run's workspace honest around each step that runs code mat does not trust.

The agent's turn and the training run both execute code mat does not trust (the agent, train.py). After
each, before any other git command, the loop asks its Guard to:

    secure_git          put back mat's .git/config and info/exclude, empty hooks/, remove alternates,
                        grafts, info/attributes and info/sparse-checkout (gitops.restore_control_files)
    revert              put every path but train.py back to the commit, judged by content: ignored files
                        and files hidden by index bits count too (gitops.revert_changes)
    restore_evaluator   put the evaluator's files back to their recorded bytes and remove extra files from
                        its data directories (workspace/evaluator.py)

Before each training run the Guard clears scratch (an old checkpoint, Python caches, whose .pyc files
Python would run instead of the restored sources) and fingerprints the evaluator: its files plus the
workspace modules train.py imports. After the run the fingerprint must be the same; when it is not, the
training run changed the evaluator and the experiment is a crash.

Every method returns what it undid as `Undone` items (a path as the user reads it, and how it had
changed); the loop stores them on the experiment with who made the change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from multiagenttrainer.workspace import gitops, worktree
from multiagenttrainer.workspace.evaluator import Evaluator, workspace_imports
from multiagenttrainer.workspace.scoring import CHECKPOINT_FILE
from multiagenttrainer.workspace.setup import Workspace


@dataclass(frozen=True)
class Undone:
    """A change mat undid: the path (relative to the workspace, or to the run directory outside it)."""

    path: str
    change: str  # modified, added, deleted


@dataclass
class Guard:
    """The checks and repairs of one run's workspace; see the module docstring."""

    workspace: Workspace
    evaluator: Evaluator

    @property
    def path(self) -> Path:
        return self.workspace.path

    def secure_git(self) -> list[Undone]:
        """mat's git configuration back, before any git command reads the agent's."""
        changed = gitops.restore_control_files(self.path, self.evaluator.git_copy)
        return [Undone(path, kind) for path, kind in changed]

    def revert(self, commit: str, keep: tuple[str, ...] = ()) -> list[Undone]:
        """Every path but `keep` back to `commit` by content, then the evaluator's files."""
        changes = gitops.revert_changes(self.path, keep, commit=commit, spared=self.evaluator.spared())
        return [Undone(c.path, c.kind) for c in changes] + self.restore_evaluator()

    def revert_uncommitted(self) -> list[Undone]:
        """Agent mode, where commits are judged later: every path but train.py back to HEAD, and the
        evaluator's files that git does not track (data) back to their recorded bytes."""
        changes = gitops.revert_changes(self.path, commit="HEAD", spared=self.evaluator.spared())
        tracked = frozenset(gitops.tree_entries(self.path, "HEAD"))
        return [Undone(c.path, c.kind) for c in changes] + self.restore_evaluator(leave=tracked)

    def restore_evaluator(self, leave: frozenset[str] = frozenset()) -> list[Undone]:
        """The evaluator's files (except the paths in `leave`) back to their recorded bytes."""
        return [Undone(item.label, item.kind) for item in self.evaluator.restore(leave)]

    def clean(self, commit: str) -> list[Undone]:
        """Branch on `commit`, work tree and evaluator exactly as recorded, mat's git config in place."""
        undone = self.secure_git()
        gitops.reset_hard(self.path, commit, self.workspace.branch)
        return undone + self.revert(commit)

    def clear_scratch(self) -> None:
        """Remove an old checkpoint and every Python cache from the workspace."""
        gitops.delete_path(self.path, CHECKPOINT_FILE)
        found = worktree.scan(self.path, self.evaluator.spared())
        caches = [rel for rel, entry in found.items() if entry.kind == "dir"]
        for rel in sorted(caches, key=len):
            if rel.rsplit("/", 1)[-1] in gitops.SCRATCH_DIRS:
                worktree.remove(self.path, rel)

    def fingerprint(self) -> str:
        """The evaluator's fingerprint with the workspace modules train.py imports."""
        return self.evaluator.fingerprint(workspace_imports(self.path))

    def before_training(self) -> tuple[list[Undone], str]:
        """Scratch cleared and the evaluator restored; return what was restored and the fingerprint."""
        self.clear_scratch()
        undone = self.restore_evaluator()
        return undone, self.fingerprint()

    def after_training(self, commit: str, fingerprint: str) -> tuple[list[Undone], list[str]]:
        """Undo whatever the training run changed (the checkpoint stays); return what was undone and, when
        the evaluator's fingerprint had changed, the evaluator paths it changed."""
        undone = self.secure_git()
        changed = self.fingerprint() != fingerprint
        undone += self.revert(commit)
        if not changed:
            return undone, []
        watched = {self.evaluator.label(f.location) for f in self.evaluator.files}
        watched |= {self.evaluator.label(p) for p in workspace_imports(self.path)}
        return undone, sorted({u.path for u in undone if u.path in watched}) or ["the evaluator"]
