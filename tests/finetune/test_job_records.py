"""Broken job records through the real `mat finetune list|status`: skipped with a warning naming the file,
other jobs unaffected, the broken job's own status a clear error; nothing crashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiagenttrainer.finetune.base import JobRecord, JobStore
from tests.finetune.conftest import mat, write_config

GOOD = {"id": "good-1", "backend": "opensource", "target": "default", "model": "tiny", "status": "completed"}
BROKEN = {
    "null-status": json.dumps({**GOOD, "id": "null-status", "status": None}).encode(),
    "null-progress": json.dumps({**GOOD, "id": "null-progress", "progress": None}).encode(),
    "wrong-type": json.dumps({**GOOD, "id": "wrong-type", "created_at": 12}).encode(),
    "huge-pid": json.dumps({**GOOD, "id": "huge-pid", "status": "running", "pid": 10**30}).encode(),
    "missing-fields": json.dumps({"id": "missing-fields"}).encode(),
    "a-list": b"[1, 2, 3]",
    "truncated": json.dumps(GOOD)[:40].encode(),
    "binary": b"\xff\xfe\x00\x01" * 8,
    "deep": b"[" * 200_000,
}


@pytest.fixture
def jobs(tmp_path: Path) -> Path:
    """A config whose jobs folder holds one good record, one with markup-like text, and every broken kind."""
    config = write_config(tmp_path, {})
    store = JobStore(tmp_path / "jobs")
    store.save(JobRecord(**GOOD))  # type: ignore[arg-type]
    store.save(JobRecord(**{**GOOD, "id": "odd-1", "model": "[/bold]org/model[red]"}))  # type: ignore[arg-type]
    for name, content in BROKEN.items():
        (tmp_path / "jobs" / "default" / f"{name}.json").write_bytes(content)
    return config


def test_list_skips_broken_records_and_names_each_file(jobs: Path, tmp_path: Path) -> None:
    listed = mat("finetune", "list", "--config", str(jobs), "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(job["id"] for job in json.loads(listed.stdout)) == ["good-1", "odd-1"]
    warnings = [line for line in listed.stderr.splitlines() if line.startswith("warning: ")]
    named = {
        Path(line.removeprefix("warning: ").split(": not a valid job record")[0]).stem for line in warnings
    }
    assert named == set(BROKEN)
    assert (
        f"warning: {tmp_path}/jobs/default/null-status.json: not a valid job record (status: input should be"
        in (listed.stderr)
    )
    assert "Traceback" not in listed.stdout + listed.stderr

    table = mat("finetune", "list", "--config", str(jobs))
    assert table.returncode == 0, table.stderr
    assert "good-1" in table.stdout and "[/bold]org/model[red]" in table.stdout  # shown as written


def test_status_of_another_job_works_and_of_a_broken_one_names_its_file(jobs: Path, tmp_path: Path) -> None:
    good = mat("finetune", "status", "good-1", "--config", str(jobs), "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["status"] == "completed"

    broken = mat("finetune", "status", "null-progress", "--config", str(jobs))
    assert broken.returncode == 1
    assert broken.stderr.startswith(
        f"error: job null-progress: its record {tmp_path}/jobs/default/null-progress.json cannot be read "
        "(progress: input should be a valid dictionary); restore the file or delete it"
    )
    assert "Traceback" not in broken.stdout + broken.stderr

    cancelled = mat("finetune", "cancel", "huge-pid", "--config", str(jobs))
    assert (
        cancelled.returncode == 1 and "huge-pid.json cannot be read (pid: input should be" in cancelled.stderr
    )
