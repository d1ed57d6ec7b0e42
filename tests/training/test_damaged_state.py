"""State files a killed run (or anyone) left damaged: a clear error naming the file and what to do, and no
finished experiment lost or run twice. A full disk in the middle of a run: one line, and --resume works once
space is freed."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from multiagenttrainer.experiments.results import RESULTS_HEADER
from multiagenttrainer.experiments.run_state import load_run
from tests.support.disks import fill, mounted_tmpfs
from tests.training.conftest import mat, only_run_dir, results_rows, write_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def finished_run(prefect_api: str, tiny_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A completed two-experiment run, copied by each test before it damages anything."""
    directory = tmp_path_factory.mktemp("finished")
    config = write_config(directory, tiny_source, training={"max_experiments": 2})
    result = mat("train", "--config", str(config), "--name", "damaged")
    assert result.returncode == 0, result.stdout + result.stderr
    return only_run_dir(directory / "runs")


@pytest.fixture
def run_copy(finished_run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, target, symlinks=True)
    return target


def resume(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return mat("train", "--resume", run_dir.name, "--output-dir", str(run_dir.parent), *extra)


@pytest.mark.parametrize(
    "damage",
    [
        b'{"run_id": "20250101-000000-damaged", "name": "dam',  # truncated
        b'["not", "a", "run"]',  # wrong type
        b'{"run_id": 1, "max_experiments": "many", "experiments": "none"}',  # wrong field types
        b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe binary",  # binary
    ],
    ids=["truncated", "wrong-type", "wrong-fields", "binary"],
)
def test_a_damaged_run_json_is_a_clear_error(run_copy: Path, damage: bytes) -> None:
    (run_copy / "run.json").write_bytes(damage)
    before = (run_copy / "results.tsv").read_bytes()
    result = resume(run_copy)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert str(run_copy / "run.json") in result.stderr and "cannot be resumed" in result.stderr
    assert (run_copy / "results.tsv").read_bytes() == before  # nothing touched
    status = mat("status", "--output-dir", str(run_copy.parent), "--json")
    assert status.returncode == 0 and "Traceback" not in status.stderr


def test_a_binary_results_tsv_is_never_cut_and_says_how_to_recover(run_copy: Path) -> None:
    table = run_copy / "results.tsv"
    table.write_bytes(b"\x00\x01garbage without a newline" * 10)
    before = table.read_bytes()
    refused = resume(run_copy, "--max-experiments", "3")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"mv {table} {table}.damaged" in refused.stderr
    assert table.read_bytes() == before  # not truncated
    table.rename(table.with_name("results.tsv.damaged"))
    resumed = resume(run_copy, "--max-experiments", "3")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = results_rows(table)
    assert len(rows) == 3 and [row[3] for row in rows[:1]] == ["keep"]  # the two known rows came back
    assert "[3/3]" in resumed.stdout and "[1/3]" not in resumed.stdout  # only the new one ran


def test_rows_lost_from_results_tsv_are_restored_from_run_json(run_copy: Path) -> None:
    table = run_copy / "results.tsv"
    known = table.read_text().splitlines()
    table.write_text(RESULTS_HEADER + "\n" + known[1] + "\n")  # the second row is gone
    resumed = resume(run_copy, "--max-experiments", "3")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert table.read_text().splitlines()[:3] == known[:3]
    state = load_run(run_copy)
    assert state.done == 3 and "[2/3]" not in resumed.stdout


def test_a_run_json_naming_another_workspace_and_command_is_not_followed(
    run_copy: Path, tmp_path: Path
) -> None:
    """A moved run resumes in its own workspace; the workspace and training command in run.json are not
    trusted (the command is derived again), so an edited file runs nothing of its own."""
    state = json.loads((run_copy / "run.json").read_text())
    state["workspace"]["path"] = str(tmp_path / "elsewhere")
    state["workspace"]["train_command"] = ["bash", "-c", "touch pwned", "train.py"]
    (run_copy / "run.json").write_text(json.dumps(state))
    result = resume(run_copy, "--max-experiments", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "elsewhere").exists() and not list(tmp_path.rglob("pwned"))
    assert load_run(run_copy).done == 3


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MB tmpfs mounted by the test (root only)."""
    with mounted_tmpfs(tmp_path / "disk") as mount:
        yield mount


def test_a_full_disk_stops_the_run_with_one_line_and_resume_works_after(
    prefect_api: str, tiny_source: Path, tmp_path: Path, small_disk: Path
) -> None:
    config = write_config(
        tmp_path, tiny_source, training={"max_experiments": 3, "output_dir": str(small_disk)}
    )
    first = mat("train", "--config", str(config), "--name", "full", "--max-experiments", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = only_run_dir(small_disk)
    filler = fill(small_disk)
    stopped = mat(
        "train", "--resume", run_dir.name, "--output-dir", str(small_disk), "--max-experiments", "3"
    )
    assert stopped.returncode == 1
    assert "Traceback" not in stopped.stderr
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stopped.stderr
    assert "no space left" in errors[0] and "free at least" in errors[0]
    assert f"mat train --resume {run_dir.name}" in errors[0]
    assert len(results_rows(run_dir / "results.tsv")) == 1  # the finished experiment is intact
    filler.unlink()
    resumed = mat(
        "train", "--resume", run_dir.name, "--output-dir", str(small_disk), "--max-experiments", "3"
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert len(results_rows(run_dir / "results.tsv")) == 3
    assert load_run(run_dir).status == "completed"
