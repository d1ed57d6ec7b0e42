"""Git helpers on a real repository: identity, branches, status parsing, reverting all but train.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.workspace import gitops


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repo on branch autoresearch/t with train.py, prepare.py and an ignored data/ dir, one commit."""
    root = tmp_path / "ws"
    gitops.init_repo(root, "autoresearch/t")
    (root / "train.py").write_text("LR = 1\n")
    (root / "prepare.py").write_text("FIXED = 1\n")
    (root / "docs").mkdir()
    (root / "docs" / "notes with space.md").write_text("notes\n")
    (root / ".gitignore").write_text("data/\n")
    (root / "data").mkdir()
    (root / "data" / "train.bin").write_bytes(b"\0" * 10)
    gitops.commit_paths(root, "baseline")
    return root


def test_init_commit_identity_and_branch(repo: Path) -> None:
    assert gitops.current_branch(repo) == "autoresearch/t"
    assert (
        git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%s")
        == "mat <mat@localhost>|mat <mat@localhost>|baseline\n"
    )
    assert git(repo, "config", "user.email").strip() == "mat@localhost"  # for agents that commit themselves
    assert gitops.head_sha(repo) == git(repo, "rev-parse", "HEAD").strip()
    assert not (repo / ".git" / "hooks").exists() or not any((repo / ".git" / "hooks").iterdir())


def test_commit_ignores_hooks_and_signing(repo: Path) -> None:
    hooks = repo / "hooks"
    hooks.mkdir()
    (hooks / "pre-commit").write_text("#!/bin/sh\nexit 1\n")
    (hooks / "pre-commit").chmod(0o755)
    git(repo, "config", "core.hooksPath", str(hooks))
    git(repo, "config", "commit.gpgsign", "true")
    (repo / "train.py").write_text("LR = 2\n")
    sha = gitops.commit_paths(repo, "LR 1 -> 2", ["train.py"])
    assert git(repo, "log", "-1", "--format=%H %s").strip() == f"{sha} LR 1 -> 2"


def test_changed_paths(repo: Path) -> None:
    assert gitops.changed_paths(repo) == []
    assert not gitops.train_py_changed(repo)
    (repo / "train.py").write_text("LR = 3\n")
    (repo / "docs" / "notes with space.md").unlink()
    (repo / "new dir").mkdir()
    (repo / "new dir" / "ünïcode.txt").write_text("x")
    (repo / "data" / "val.bin").write_bytes(b"1")  # ignored: not a change
    assert gitops.changed_paths(repo) == ["docs/notes with space.md", "new dir/ünïcode.txt", "train.py"]
    assert gitops.train_py_changed(repo)


def test_revert_except_keeps_train_py_and_undoes_the_rest(repo: Path) -> None:
    (repo / "train.py").write_text("LR = 5\n")
    (repo / "prepare.py").write_text("FIXED = 2\n")
    (repo / "docs" / "notes with space.md").unlink()
    (repo / "extra" / "deep").mkdir(parents=True)
    (repo / "extra" / "deep" / "a.py").write_text("print()\n")
    (repo / "staged.txt").write_text("s")
    git(repo, "add", "staged.txt", "prepare.py")
    (repo / "data" / "cache.bin").write_bytes(b"keep me")
    reverted = gitops.revert_except(repo)
    assert reverted == ["docs/notes with space.md", "extra/deep/a.py", "prepare.py", "staged.txt"]
    assert (repo / "prepare.py").read_text() == "FIXED = 1\n"
    assert (repo / "docs" / "notes with space.md").read_text() == "notes\n"
    assert not (repo / "extra").exists() and not (repo / "staged.txt").exists()
    assert (repo / "data" / "cache.bin").read_bytes() == b"keep me"
    assert (repo / "train.py").read_text() == "LR = 5\n"
    assert gitops.changed_paths(repo) == ["train.py"]
    assert gitops.revert_except(repo) == []


def test_revert_with_nothing_kept_and_reset_to_a_commit(repo: Path) -> None:
    base = gitops.head_sha(repo)
    (repo / "train.py").write_text("LR = 9\n")
    second = gitops.commit_paths(repo, "LR 9", ["train.py"])
    (repo / "train.py").write_text("LR = 10\n")
    assert gitops.revert_except(repo, keep=()) == ["train.py"]
    assert (repo / "train.py").read_text() == "LR = 9\n"
    gitops.reset_hard(repo, base)
    assert gitops.head_sha(repo) == base and (repo / "train.py").read_text() == "LR = 1\n"
    assert gitops.resolve_commit(repo, second[:7]) == second
    assert gitops.resolve_commit(repo, "0000000") is None
    assert gitops.changed_between(repo, base, second) == ["train.py"]
    assert gitops.commit_message(repo, second) == "LR 9"


def test_reset_hard_returns_to_the_run_branch(repo: Path) -> None:
    base = gitops.head_sha(repo)
    git(repo, "checkout", "-q", "-b", "elsewhere")
    (repo / "train.py").write_text("LR = 7\n")
    gitops.commit_paths(repo, "on another branch", ["train.py"])
    gitops.reset_hard(repo, base, "autoresearch/t")
    assert gitops.current_branch(repo) == "autoresearch/t"
    assert gitops.head_sha(repo) == base


def test_soft_reset_turns_an_agents_commit_into_changes(repo: Path) -> None:
    base = gitops.head_sha(repo)
    (repo / "train.py").write_text("LR = 4\n")
    (repo / "prepare.py").write_text("FIXED = 4\n")
    gitops.commit_paths(repo, "agent commit")
    gitops.reset_soft(repo, base)
    assert gitops.revert_except(repo) == ["prepare.py"]
    assert gitops.changed_paths(repo) == ["train.py"]


def test_git_failures_are_experiment_errors(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="git rev-parse"):
        gitops.head_sha(tmp_path)
    assert not gitops.is_valid_branch_name("autoresearch/bad..name")
    assert gitops.is_valid_branch_name("autoresearch/20250101-120000-ok")
