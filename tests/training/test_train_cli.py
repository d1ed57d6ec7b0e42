"""`mat train` end to end through the real entry point, against the session's Prefect server.

Each test drives `mat` subprocesses as a user would (built-in agent, built-in template trained for
3 fixed steps) and checks the run directory, the workspace's git history, the Prefect records
(task per experiment, artifacts) and `mat status` / `mat watch`.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any, cast
from uuid import UUID

import pandas as pd
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import Artifact, TaskRun

from tests.training.conftest import (
    COMMAND_TIMEOUT_S,
    MAT,
    RESULTS_HEADER,
    ROOT,
    mat,
    mat_env,
    only_run_dir,
    results_rows,
    start_mat,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

RECORDS_TIMEOUT_S = 30  # the server records task runs and artifacts from events, shortly after the fact
PROGRESS_LINE = re.compile(
    r"^\[(\d)/3\] (keep|discard) val_bpb (\d\.\d{6})( \([+-]\d\.\d{6}\))? \d+\.\ds  (.+)$"
)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def flow_run_id(run_json: dict[str, Any]) -> str:
    url = run_json["flow_run_url"]
    assert url and "/runs/flow-run/" in url, url
    return str(url.rsplit("/", 1)[-1])


def task_runs_of(flow_run: str, expected: int) -> list[TaskRun]:
    """The task runs of a flow run, once the server has recorded at least `expected` of them."""
    found: list[TaskRun] = []

    def recorded() -> bool:
        nonlocal found
        with get_client(sync_client=True) as client:
            found = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run])))
        return len(found) >= expected

    wait_until(recorded, RECORDS_TIMEOUT_S, f"{expected} task runs of flow run {flow_run}", interval_s=0.5)
    return found


def artifacts_with_key(key: str) -> list[Artifact]:
    found: list[Artifact] = []

    def recorded() -> bool:
        nonlocal found
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        return bool(found)

    wait_until(recorded, RECORDS_TIMEOUT_S, f"artifact {key}", interval_s=0.5)
    return found


def test_mat_train_end_to_end(prefect_api: str, tiny_source: Path, tmp_path: Path) -> None:
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    config = write_config(tmp_path, tiny_source)
    result = mat("train", "--config", str(config), "--name", name)
    assert result.returncode == 0, result.stdout + result.stderr

    run_dir = only_run_dir(tmp_path / "runs")
    assert run_dir.name.endswith(f"-{name}")
    lines = result.stdout.splitlines()
    progress = [m for m in map(PROGRESS_LINE.match, lines) if m]
    assert [m.group(1) for m in progress] == ["1", "2", "3"], result.stdout
    assert progress[0].group(5) == "baseline" and progress[0].group(4) is None
    assert all(m.group(4) for m in progress[1:])  # later experiments show their delta against the best
    assert lines[-2] == f"run {run_dir.name} completed: {run_dir}"
    assert lines[-1] == f"report: {run_dir / 'report.md'}"
    assert f"corpus: {tmp_path / 'corpus'} (built)" in result.stdout

    table = pd.read_csv(run_dir / "results.tsv", sep="\t")
    assert list(table.columns) == RESULTS_HEADER
    assert len(table) == 3 and table["description"][0] == "baseline" and table["status"][0] == "keep"
    assert set(table["status"]) <= {"keep", "discard"} and (table["val_bpb"] > 0).all()
    assert all(len(commit) == 7 for commit in table["commit"])
    assert [float(m.group(3)) for m in progress] == pytest.approx(list(table["val_bpb"]), abs=1e-6)

    state = json.loads((run_dir / "run.json").read_text())
    assert state["name"] == name and state["status"] == "completed" and state["max_experiments"] == 3
    assert [e["experiment_id"] for e in state["experiments"]] == [0, 1, 2]
    assert state["config"]["training"]["output_dir"] == str(tmp_path / "runs")
    kept = [e for e in state["experiments"] if e["status"] == "keep"]
    best = min(kept, key=lambda e: e["val_bpb"])
    assert state["best"] == {
        "experiment_id": best["experiment_id"],
        "commit": best["commit"],
        "val_bpb": best["val_bpb"],
    }
    assert state["flow_run_url"].startswith(prefect_api.removesuffix("/api") + "/runs/flow-run/")
    assert state["experiments"][0]["summary"]["num_steps"] == 3  # MAT_FIXED_STEPS reached train.py

    report = (run_dir / "report.md").read_text()
    assert f"# Training run {name} ({run_dir.name})" in report and "- Status: completed" in report
    assert "- Experiments: 3 of 3" in report and f"`{best['commit'][:7]}`" in report
    assert (run_dir / "progress.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert all((run_dir / f"logs/exp-{i:03d}.log").is_file() for i in range(3))

    workspace = run_dir / "workspace"
    assert git(workspace, "rev-parse", "--abbrev-ref", "HEAD").strip() == f"autoresearch/{run_dir.name}"
    history = git(workspace, "log", "--format=%H %s").splitlines()
    assert history[-1].endswith(" baseline") and history[0].split()[0] == best["commit"]
    assert [line.split(" ", 1)[1] for line in history[:-1]] == [
        e["description"] for e in reversed(kept) if e["experiment_id"] > 0
    ]
    assert git(workspace, "status", "--porcelain") == ""

    flow_run = flow_run_id(state)
    names = {task_run.name for task_run in task_runs_of(flow_run, 5)}
    experiments = sorted(n for n in names if n.startswith("experiment-"))
    assert experiments == [
        f"experiment-{e['experiment_id']}: {e['description']}" for e in state["experiments"]
    ]  # renamed after the change each one tried
    assert any(n.startswith("setup-run") for n in names) and any(n.startswith("write-report") for n in names)
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(UUID(flow_run)).state_name == "Completed"
        subflows = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run]))
        )
    assert len(subflows) == 1  # ingest

    (markdown,) = artifacts_with_key(f"mat-report-{name}")
    assert markdown.type == "markdown" and f"# Training run {name}" in str(markdown.data)
    (results,) = artifacts_with_key(f"mat-results-{name}")
    assert results.type == "table"
    data = results.data  # the server may hand the table back as JSON text
    rows = cast(list[dict[str, Any]], json.loads(data) if isinstance(data, str) else data)
    assert [row["#"] for row in rows] == [0, 1, 2] and rows[0]["description"] == "baseline"


def test_status_and_watch_show_two_concurrent_runs(
    prefect_api: str, tiny_source: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 2})
    logs = {name: tmp_path / f"{name}.log" for name in ("alpha", "beta")}
    processes = {
        name: start_mat("train", "--config", str(config), "--name", name, log=log)
        for name, log in logs.items()
    }
    try:
        for name, process in processes.items():
            assert process.wait(timeout=240) == 0, logs[name].read_text()
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)

    status = mat("status", "--config", str(config), "--json")
    assert status.returncode == 0, status.stderr
    rows = {row["name"]: row for row in json.loads(status.stdout)}
    assert set(rows) == {"alpha", "beta"}
    for name, row in rows.items():
        assert row["id"].endswith(f"-{name}") and row["status"] == "completed"
        assert (row["experiments_done"], row["max_experiments"]) == (2, 2)
        assert row["baseline_val_bpb"] > 0 and row["best_val_bpb"] <= row["baseline_val_bpb"]
    # Same corpus, same seeded agent, fixed steps: the two runs train the same thing.
    assert rows["alpha"]["baseline_val_bpb"] == rows["beta"]["baseline_val_bpb"]

    watch = mat("watch", "--output-dir", str(tmp_path / "runs"), "--once")
    assert watch.returncode == 0, watch.stderr
    assert "2 runs" in watch.stdout and "0 running" in watch.stdout
    for name in ("alpha", "beta"):
        (line,) = [line for line in watch.stdout.splitlines() if line.startswith(name)]
        assert "completed" in line and "2/2" in line
        assert f"{rows[name]['best_val_bpb']:.6f}" in line


def test_resume_after_sigkill_completes_the_run_without_repeating_experiments(
    prefect_api: str, tiny_source: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 4})
    log = tmp_path / "killed.log"
    process = start_mat("train", "--config", str(config), "--name", "killed", log=log)
    try:
        runs = tmp_path / "runs"
        wait_until(
            lambda: runs.is_dir() and any(results_rows(p / "results.tsv") for p in runs.iterdir()),
            180,
            "a first results.tsv row",
            interval_s=0.05,
        )
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    run_dir = only_run_dir(runs)
    done_before = results_rows(run_dir / "results.tsv")
    assert 1 <= len(done_before) < 4, log.read_text()

    resumed = mat("train", "--config", str(config), "--resume", run_dir.name)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"run {run_dir.name}: resuming after {len(done_before)} of 4 experiments" in resumed.stdout
    first_new = len(done_before) + 1
    assert [line[:5] for line in resumed.stdout.splitlines() if line.startswith("[")] == [
        f"[{i}/4]" for i in range(first_new, 5)
    ]

    rows = results_rows(run_dir / "results.tsv")
    assert len(rows) == 4 and rows[: len(done_before)] == done_before
    assert [row[3] for row in rows[:1]] == ["keep"] and rows[0][4] == "baseline"
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "completed" and [e["experiment_id"] for e in state["experiments"]] == [
        0,
        1,
        2,
        3,
    ]
    status = json.loads(mat("status", "--output-dir", str(runs), "--json").stdout)
    assert [(r["id"], r["status"], r["experiments_done"]) for r in status] == [(run_dir.name, "completed", 4)]


def test_train_on_the_quickstart_config(prefect_api: str, tmp_path: Path) -> None:
    """The shipped quickstart as `make demo` runs it (this repository as corpus), cut to 2 experiments."""
    corpus, runs = tmp_path / "corpus", tmp_path / "runs"
    args = ["train", "--config", "configs/quickstart.yaml", "--output-dir", str(runs)]
    args += ["--corpus-dir", str(corpus)]
    result = subprocess.run(
        [*MAT, *args, "--max-experiments", "2"],
        cwd=ROOT,
        env=mat_env(MAT_CORPUS__STAGING_DIR=str(tmp_path / "staging")),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    stats = json.loads((corpus / "stats.json").read_text())
    assert stats["sources"]["multiagenttrainer"]["files"] > 20
    run_dir = only_run_dir(runs)
    rows = results_rows(run_dir / "results.tsv")
    assert [row[4] for row in rows][:1] == ["baseline"] and len(rows) == 2
    assert str(run_dir / "report.md") in result.stdout
    state = json.loads((run_dir / "run.json").read_text())
    assert state["name"] == "quickstart" and state["status"] == "completed"
