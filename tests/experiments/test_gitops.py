"""Git helpers on a real repository: identity, branches, status parsing, reverting all but train.py."""

from __future__ import annotations

import os
import shutil
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


# ---------------------------------------------------------------- a repository the agent has written to


def marker_script(tmp_path: Path) -> tuple[Path, Path]:
    """A script that records each call (its first argument) in a marker file; returns (script, marker)."""
    marker = tmp_path / "fired"
    script = tmp_path / "trap.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {marker}\ncat\n')
    script.chmod(0o755)
    return script, marker


def test_the_callers_git_environment_is_ignored(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, marker = marker_script(tmp_path)
    evil = tmp_path / "global.cfg"
    evil.write_text(f"[core]\n\tfsmonitor = {script} global\n[user]\n\tname = evil\n")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setenv("GIT_WORK_TREE", str(tmp_path))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "index"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(evil))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor'='{script} parameters'")
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", f"{script} external")
    (repo / "train.py").write_text("LR = 2\n")
    assert gitops.changed_paths(repo) == ["train.py"]
    sha = gitops.commit_paths(repo, "LR 2", ["train.py"])
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_WORK_TREE")
    monkeypatch.delenv("GIT_INDEX_FILE")
    assert git(repo, "log", "-1", "--format=%H %an").split() == [sha, "mat"]
    assert not marker.exists()


def test_settings_planted_in_the_repo_config_run_nothing(repo: Path, tmp_path: Path) -> None:
    script, marker = marker_script(tmp_path)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for name in ("pre-commit", "post-commit", "post-checkout", "reference-transaction"):
        (hooks / name).write_text(f"#!/bin/sh\n{script} hook-{name}\n")
        (hooks / name).chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for key, value in {
        "core.fsmonitor": f"{script} fsmonitor",
        "core.hooksPath": str(hooks),
        "core.pager": f"{script} pager",
        "diff.external": f"{script} external-diff",
        "core.worktree": str(elsewhere),  # git would look at another directory
        "core.sparseCheckout": "true",
    }.items():
        git(repo, "config", key, value)
    base = gitops.head_sha(repo)
    (repo / "train.py").write_text("LR = 3\n")
    (repo / "prepare.py").write_text("FIXED = 3\n")
    assert gitops.changed_paths(repo) == ["prepare.py", "train.py"]  # this work tree, not `elsewhere`
    assert gitops.revert_except(repo) == ["prepare.py"]
    second = gitops.commit_paths(repo, "LR 3", ["train.py"])
    assert gitops.changed_between(repo, base, second) == ["train.py"]
    gitops.reset_hard(repo, base, "autoresearch/t")
    assert gitops.commit_message(repo, second) == "LR 3" and not marker.exists()


def test_changes_are_found_by_content_whatever_the_index_and_ignore_rules_say(repo: Path) -> None:
    (repo / "prepare.py").write_text("def evaluate(): return 0.123\n")
    git(repo, "update-index", "--skip-worktree", "prepare.py")
    (repo / "docs" / "notes with space.md").write_text("edited\n")
    git(repo, "update-index", "--assume-unchanged", "docs/notes with space.md")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("helpers.py\n")
    (repo / "helpers.py").write_text("def evaluate(): return 0.5\n")
    (repo / ".gitignore").write_text("data/\n*.bin\nweights/\n")  # tracked: reverted too
    (repo / "weights").mkdir()
    (repo / "weights" / "pretrained.bin").write_bytes(b"\1" * 10)
    assert gitops.changed_paths(repo) == [".gitignore"]  # what `git status` admits to
    assert gitops.revert_except(repo) == [
        ".gitignore",
        "docs/notes with space.md",
        "helpers.py",
        "prepare.py",
        "weights/pretrained.bin",
    ]
    assert (repo / "prepare.py").read_text() == "FIXED = 1\n" and not (repo / "weights").exists()
    assert (repo / "docs" / "notes with space.md").read_text() == "notes\n"
    assert {line[:2] for line in git(repo, "ls-files", "-v").splitlines()} == {"H "}  # no S, no h bits
    assert (repo / "data" / "train.bin").exists()  # data/ is the evaluator's: checked by hash elsewhere


def test_reverting_replaces_links_and_odd_files_without_writing_outside(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(repo / "docs")
    (repo / "docs").symlink_to(outside)  # writing docs/notes would land outside the workspace
    (repo / "prepare.py").unlink()
    os.mkfifo(repo / "prepare.py")  # reading it would block
    (repo / "train.py").unlink()
    (repo / "train.py").symlink_to(outside / "train.py")  # kept only as a regular file
    (repo / "locked").mkdir()
    (repo / "locked" / "x.py").write_text("x\n")
    (repo / "locked").chmod(0)
    assert gitops.revert_except(repo) == [
        "docs",
        "docs/notes with space.md",
        "locked/x.py",
        "prepare.py",
        "train.py",
    ]
    assert list(outside.iterdir()) == []
    assert (repo / "docs" / "notes with space.md").read_text() == "notes\n" and not (
        repo / "docs"
    ).is_symlink()
    assert (repo / "prepare.py").read_text() == "FIXED = 1\n" and (
        repo / "train.py"
    ).read_text() == "LR = 1\n"
    assert not (repo / "locked").exists() and gitops.changed_paths(repo) == []


def test_train_py_changed_is_decided_by_content(repo: Path) -> None:
    (repo / "train.py").write_text("LR = 8\n")
    git(repo, "update-index", "--assume-unchanged", "train.py")
    assert gitops.changed_paths(repo) == [] and gitops.train_py_changed(repo)
    (repo / "train.py").write_text("LR = 1\n")
    (repo / "train.py").chmod(0o755)
    assert gitops.train_py_changed(repo)  # the mode counts


def test_control_files_are_put_back_and_a_replaced_git_dir_is_refused(repo: Path, tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    gitops.save_control_files(repo, saved)
    config_before = (repo / ".git" / "config").read_bytes()
    git(repo, "config", "core.fsmonitor", "/bin/true")
    (repo / ".git" / "hooks").mkdir(exist_ok=True)
    (repo / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    for name in ("attributes", "sparse-checkout", "grafts"):
        (repo / ".git" / "info" / name).write_text("*\n")
    (repo / ".git" / "objects" / "info" / "alternates").write_text(str(tmp_path) + "\n")
    assert sorted(gitops.restore_control_files(repo, saved)) == [
        (".git/config", "modified"),
        (".git/hooks/post-checkout", "added"),
        (".git/info/attributes", "added"),
        (".git/info/grafts", "added"),
        (".git/info/sparse-checkout", "added"),
        (".git/objects/info/alternates", "added"),
    ]
    assert (repo / ".git" / "config").read_bytes() == config_before
    assert gitops.restore_control_files(repo, saved) == []
    moved = tmp_path / "moved-git"
    (repo / ".git").rename(moved)
    (repo / ".git").symlink_to(moved)
    with pytest.raises(ExperimentError, match=r"\.git is no longer a directory.*start a new run"):
        gitops.restore_control_files(repo, saved)


def test_a_transfer_to_the_hub_runs_nothing_planted_in_the_hub(repo: Path, tmp_path: Path) -> None:
    """With several machines, kept commits go from a machine's repository to the run's hub. The git on the
    hub's side reads the hub's own config and hooks, which an agent on the same machine can reach: mat puts
    back its copy of them first, and allows the file transport for that call only."""
    script, marker = marker_script(tmp_path)
    saved = tmp_path / "saved"
    gitops.save_control_files(repo, saved)
    machine = tmp_path / "machine"
    shutil.copytree(repo, machine, symlinks=True)
    (machine / "train.py").write_text("LR = 2\n")
    commit = gitops.commit_paths(machine, "keep", ["train.py"])
    hooks = repo / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for hook in ("pre-receive", "update", "post-receive", "post-update", "reference-transaction"):
        (hooks / hook).write_text(f"#!/bin/sh\necho {hook} >> {marker}\n")
        (hooks / hook).chmod(0o755)
    with (repo / ".git" / "config").open("a") as config:
        config.write(f"[uploadpack]\n\tpackObjectsHook = {script}\n")
    with pytest.raises(ExperimentError, match="transport 'file' not allowed"):
        gitops.run_git(machine, "push", "-q", str(repo), f"{commit}:refs/mat/kept")
    gitops.transfer(machine, repo, saved, "push", "-q", "--no-verify", str(repo), f"{commit}:refs/mat/kept")
    assert git(repo, "rev-parse", "refs/mat/kept").strip() == commit
    gitops.transfer(machine, repo, saved, "fetch", "-q", "--no-tags", str(repo), "refs/mat/kept")
    assert not marker.exists(), marker.read_text()
    assert list(hooks.iterdir()) == [] and "packObjectsHook" not in (repo / ".git" / "config").read_text()
