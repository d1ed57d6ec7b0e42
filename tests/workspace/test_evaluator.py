"""The evaluator's record: files hashed and copied at set-up, put back and fingerprinted later, and the
workspace modules train.py imports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.evaluator import (
    Evaluator,
    load_evaluator,
    record_evaluator,
    workspace_imports,
)


@pytest.fixture
def recorded(tmp_path: Path) -> Evaluator:
    """A run with a git workspace (prepare.py, data/train.bin, data/val.bin) and a held-out file."""
    run_dir = tmp_path / "run"
    workspace = run_dir / "workspace"
    gitops.init_repo(workspace, "autoresearch/t")
    (workspace / "prepare.py").write_text("FIXED = 1\n")
    (workspace / "data").mkdir()
    (workspace / "data" / "train.bin").write_bytes(b"t" * 5000)
    (workspace / "data" / "val.bin").write_bytes(b"v" * 3000)
    holdout = run_dir / "evaluator" / "holdout" / "val.bin"
    holdout.parent.mkdir(parents=True)
    holdout.write_bytes(b"h" * 2000)
    gitops.commit_paths(workspace, "baseline", ["prepare.py"])
    files = [
        workspace / "prepare.py",
        workspace / "data" / "train.bin",
        workspace / "data" / "val.bin",
        holdout,
    ]
    return record_evaluator(run_dir, workspace, files, [workspace / "data"])


def test_a_recorded_evaluator_is_unchanged_until_something_changes(recorded: Evaluator) -> None:
    assert recorded.differences() == [] and recorded.restore() == []
    assert recorded.fingerprint() == recorded.recorded_fingerprint() == recorded.summary()["hash"]
    assert set(recorded.summary()["files"]) == {
        "prepare.py",
        "data/train.bin",
        "data/val.bin",
        "evaluator/holdout/val.bin",
    }
    again = load_evaluator(recorded.run_dir)
    assert again.files == recorded.files and again.recorded_fingerprint() == recorded.recorded_fingerprint()


def test_an_edit_that_keeps_size_and_mtime_is_still_seen_and_undone(recorded: Evaluator) -> None:
    val = recorded.workspace / "data" / "val.bin"
    assert recorded.fingerprint() == recorded.recorded_fingerprint()  # hashed once: the stat is now cached
    before = val.stat()
    with val.open("r+b") as handle:
        handle.write(b"V")  # same size
    os.utime(val, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the old mtime: only ctime moved
    assert recorded.fingerprint() != recorded.recorded_fingerprint()
    assert [(r.label, r.kind) for r in recorded.restore()] == [("data/val.bin", "modified")]
    assert val.read_bytes() == b"v" * 3000 and recorded.fingerprint() == recorded.recorded_fingerprint()


def test_missing_extra_and_replaced_files_are_put_right(recorded: Evaluator, tmp_path: Path) -> None:
    workspace = recorded.workspace
    (workspace / "data" / "train.bin").unlink()
    (workspace / "data" / "pretrained.pt").write_bytes(b"weights")
    holdout = recorded.run_dir / "evaluator" / "holdout" / "val.bin"
    holdout.write_bytes(b"easy")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "val.bin").write_bytes(b"x")
    (workspace / "data" / "val.bin").unlink()
    (workspace / "data" / "val.bin").symlink_to(outside / "val.bin")
    undone = sorted((r.label, r.kind) for r in recorded.restore())
    assert undone == [
        ("data/pretrained.pt", "added"),
        ("data/train.bin", "deleted"),
        ("data/val.bin", "modified"),
        ("evaluator/holdout/val.bin", "modified"),
    ]
    assert (outside / "val.bin").read_bytes() == b"x"  # the link was replaced, not written through
    assert not (workspace / "data" / "val.bin").is_symlink() and holdout.read_bytes() == b"h" * 2000
    assert holdout.stat().st_mode & 0o777 == 0o644 and recorded.restore() == []


def test_a_data_directory_replaced_by_a_link_becomes_a_directory_again(
    recorded: Evaluator, tmp_path: Path
) -> None:
    workspace = recorded.workspace
    elsewhere = tmp_path / "elsewhere"
    (workspace / "data").rename(elsewhere)
    (workspace / "data").symlink_to(elsewhere)
    recorded.restore()
    assert (workspace / "data").is_dir() and not (workspace / "data").is_symlink()
    assert recorded.fingerprint() == recorded.recorded_fingerprint()


def test_changed_copies_and_a_missing_record_are_refused(recorded: Evaluator, tmp_path: Path) -> None:
    recorded.check_copies()
    (recorded.workspace / "prepare.py").write_text("FIXED = 2\n")
    prepare = next(f for f in recorded.files if f.path == "prepare.py")
    recorded.object_path(prepare.sha256).write_text("FIXED = 2\n")
    with pytest.raises(ExperimentError, match=r"copy of prepare\.py .* was changed"):
        recorded.check_copies()
    with pytest.raises(ExperimentError, match="cannot be restored"):
        recorded.restore()
    with pytest.raises(ExperimentError, match=r"manifest\.json is missing .* start a new run"):
        load_evaluator(tmp_path / "no-such-run")


def test_workspace_imports_follow_train_py_into_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "import math\nimport torch\nfrom prepare import evaluate_bpb\nimport lib.models as models\n"
        "from train import x\n"
    )
    (tmp_path / "prepare.py").write_text("import numpy\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "models.py").write_text("from helpers import layer\n")
    (tmp_path / "helpers.py").write_text("import os\n")
    (tmp_path / "unused.py").write_text("")
    found = [str(p.relative_to(tmp_path)) for p in workspace_imports(tmp_path)]
    assert found == ["helpers.py", "lib/__init__.py", "lib/models.py", "prepare.py"]
    (tmp_path / "train.py").write_text("def broken(:\n")
    assert workspace_imports(tmp_path) == []


def test_a_machines_copy_of_the_workspace_is_checked_and_restored_in_that_copy(recorded: Evaluator) -> None:
    """With several machines each has its own work tree: the evaluator applies to that tree, while the
    files outside the workspace (the held-out split) stay where they are."""
    import shutil

    copy = recorded.run_dir / "workspace-gpu1"
    shutil.copytree(recorded.workspace, copy, symlinks=True)
    machine = recorded.for_workspace(copy)
    assert machine.recorded_fingerprint() == recorded.recorded_fingerprint() == machine.fingerprint()
    (copy / "prepare.py").write_text("FIXED = 0\n")
    (copy / "data" / "extra.bin").write_bytes(b"x")
    assert {(item.label, item.kind) for item in machine.restore()} == {
        ("prepare.py", "modified"),
        ("data/extra.bin", "added"),
    }
    assert (copy / "prepare.py").read_text() == "FIXED = 1\n" and not (copy / "data" / "extra.bin").exists()
    assert recorded.differences() == [] and machine.spared() == recorded.spared()
    holdout = recorded.run_dir / "evaluator" / "holdout" / "val.bin"
    assert holdout in {f.location for f in machine.files}
