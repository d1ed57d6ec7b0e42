"""`mat status` rows and `mat watch` frames for hand-written run.json files."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.console import Console

from multiagenttrainer.experiments.run_state import MachineRecord, RunState
from multiagenttrainer.experiments.starting import STARTING_DIR, StartingRun, marker_path
from multiagenttrainer.monitor import (
    render_status_table,
    render_watch_frame,
    run_rows,
    status_row,
    watch_runs,
)
from tests.support.run_states import T0, make_state, running_state


def text_console() -> Console:
    return Console(file=io.StringIO(), width=120, color_system=None, force_terminal=False)


def output(console: Console) -> str:
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def save(output_dir: Path, state: RunState) -> None:
    state.save(output_dir / state.run_id)


def test_status_rows_with_an_interrupted_run(tmp_path: Path) -> None:
    save(tmp_path, make_state("done"))
    killed = make_state("killed", "running", finished=False)
    killed.pid = dead_pid()
    save(tmp_path, killed)
    (tmp_path / "not-a-run").mkdir()
    rows = run_rows(tmp_path)
    assert [row["name"] for row in rows] == ["done", "killed"]
    assert rows[0] == {
        "id": "20250308-020000-done",
        "name": "done",
        "status": "completed",
        "experiments_done": 6,
        "max_experiments": 8,
        "baseline_val_bpb": 2.0,
        "best_val_bpb": 1.9,
        "started_at": "2025-03-08T02:00:00+00:00",
        "duration_s": 390.0,
        "machines": [],
    }
    assert rows[1]["status"] == "interrupted"
    assert rows[1]["duration_s"] > 390.0  # until run.json was last written (now: save() stamps updated_at)


def test_status_rows_of_a_multi_machine_run_say_what_each_machine_did() -> None:
    state = make_state("spread")
    state.machines = [
        MachineRecord("a", "ssh", "/runs/x/workspace-a"),
        MachineRecord("b", "docker", "/runs/x/workspace-b", "dropped", "container trainer is gone", 3),
    ]
    for index, result in enumerate(state.experiments):
        result.machine = "a" if index % 2 == 0 else "b"
    (a, b) = status_row(state, T0)["machines"]
    assert (a["machine"], a["type"], a["status"], a["reason"]) == ("a", "ssh", "active", None)
    assert (b["machine"], b["status"], b["reason"]) == ("b", "dropped", "container trainer is gone")
    assert a["experiments"] + b["experiments"] == len(state.experiments)
    assert a["keep"] + a["discard"] + a["crash"] == a["experiments"]


def test_running_duration_counts_until_now() -> None:
    state = running_state("live", T0 + timedelta(minutes=3))
    row = status_row(state, T0 + timedelta(minutes=3, seconds=5))
    assert row["status"] == "running" and row["duration_s"] == 185.0
    assert row["baseline_val_bpb"] == 2.5 and row["best_val_bpb"] == 2.4


def test_status_table_text(tmp_path: Path) -> None:
    save(tmp_path, make_state("done"))
    console = text_console()
    render_status_table(console, run_rows(tmp_path))
    lines = output(console).splitlines()
    assert lines[0].split() == [
        "id",
        "name",
        "status",
        "experiments",
        "baseline",
        "best",
        "started",
        "duration",
    ]
    assert lines[1].split()[:6] == [
        "20250308-020000-done",
        "done",
        "completed",
        "6/8",
        "2.000000",
        "1.900000",
    ]
    assert lines[1].split()[-1] == "6:30"
    empty = text_console()
    render_status_table(empty, [])
    assert output(empty) == "No training runs yet; start one with `mat train`.\n"


LONG_NAME = "llama3-8b-instruct-nightly-sweep"


def status_lines(tmp_path: Path, width: int, terminal: bool) -> list[str]:
    """`mat status`'s table for two runs with long names, on a terminal of `width` columns or piped."""
    save(tmp_path, make_state(LONG_NAME))
    save(tmp_path, make_state("small"))
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=terminal)
    render_status_table(console, run_rows(tmp_path))
    return output(console).splitlines()


@pytest.mark.parametrize("width", [80, 60, 40])
def test_status_on_a_narrow_terminal_never_cuts_a_run_id(tmp_path: Path, width: int) -> None:
    lines = status_lines(tmp_path, width, terminal=True)
    ids = [f"20250308-020000-{LONG_NAME}", "20250308-020000-small"]
    assert [line.split()[0] for line in lines[1:] if line.startswith(" 2025")] == ids
    assert all(len(line) <= max(width, len(ids[0]) + 2) for line in lines)
    assert "…" not in "".join(lines)
    header = lines[0].split()
    assert header[0] == "id" and "started" not in header  # the first column to give way
    assert ("status" in header) == (width >= 60)


def test_status_piped_keeps_every_column_whole(tmp_path: Path) -> None:
    lines = status_lines(tmp_path, 80, terminal=False)  # a pipe: rich assumes 80 columns
    assert lines[0].split() == [
        "id",
        "name",
        "status",
        "experiments",
        "baseline",
        "best",
        "started",
        "duration",
    ]
    assert lines[1].split()[:3] == [f"20250308-020000-{LONG_NAME}", LONG_NAME, "completed"]
    assert len(lines[1].split()) == 9  # every value on one line (the start time is two words)


def test_mat_status_piped_at_80_columns_prints_whole_ids(tmp_path: Path) -> None:
    save(tmp_path, make_state(LONG_NAME))
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")} | {
        "COLUMNS": "80"
    }
    result = subprocess.run(
        [sys.executable, "-m", "multiagenttrainer.cli", "status", "--output-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert row.split()[:3] == [f"20250308-020000-{LONG_NAME}", LONG_NAME, "completed"]
    assert row.split()[-1] == "6:30" and len(row) > 80


def test_watch_frame_for_a_running_and_a_completed_run() -> None:
    now = datetime(2025, 3, 8, 2, 10, 0, tzinfo=UTC)
    states = [running_state("alpha", now, elapsed_s=42), make_state("beta")]
    console = text_console()
    console.print(render_watch_frame(states, now, "runs"))
    lines = output(console).splitlines()
    assert lines[0].startswith("2 runs under runs, 1 running, at ")
    assert lines[1].split() == ["run", "status", "experiments", "current", "best", "val_bpb"]
    alpha = next(line for line in lines if line.startswith("alpha"))
    beta = next(line for line in lines if line.startswith("beta"))
    assert alpha.split()[1] == "running" and "3/10" in alpha and "#3 training 0:42" in alpha
    assert "2.400000 (-4.00%)" in alpha
    assert beta.split()[1] == "completed" and "6/8" in beta and "1.900000 (-5.00%)" in beta
    assert "━" in alpha  # the progress bar is drawn


def test_watch_frame_shows_every_busy_machine() -> None:
    now = datetime(2025, 3, 8, 2, 10, 0, tzinfo=UTC)
    state = running_state("multi", now, elapsed_s=5)
    state.current.append(type(state.current[0])(4, "agent", "2025-03-08T02:08:55+00:00", machine="gpu-b"))
    console = text_console()
    console.print(render_watch_frame([state], now))
    text = output(console)
    assert "#3 training 0:05 on local" in text and "#4 agent 1:05 on gpu-b" in text
    console = text_console()
    console.print(render_watch_frame([], now, "runs"))
    assert output(console) == "No training runs under runs yet.\n"


def test_watch_once_prints_one_frame_and_returns(tmp_path: Path) -> None:
    save(tmp_path, running_state("alpha", datetime.now(UTC)))
    save(tmp_path, make_state("beta"))
    console = text_console()
    started = time.monotonic()
    watch_runs(console, tmp_path, once=True)
    assert time.monotonic() - started < 5
    text = output(console)
    assert "alpha" in text and "beta" in text and "#3 training" in text


def test_watch_exits_when_the_last_run_finishes(tmp_path: Path) -> None:
    state = running_state("alpha", datetime.now(UTC))
    save(tmp_path, state)

    def finish_later() -> None:
        time.sleep(1.0)
        state.status, state.current = "completed", []
        save(tmp_path, state)

    finisher = threading.Thread(target=finish_later)
    finisher.start()
    started = time.monotonic()
    console = text_console()
    watch_runs(console, tmp_path, once=False, refresh_s=0.1)
    finisher.join(timeout=10)
    assert 0.9 < time.monotonic() - started < 10
    assert "completed" in output(console)


def test_watch_gives_up_when_no_run_appears(tmp_path: Path) -> None:
    started = time.monotonic()
    watch_runs(text_console(), tmp_path, once=False, refresh_s=0.05, wait_for_runs_s=0.3)
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------- runs that `mat train` is still starting


def write_marker(output_dir: Path, name: str, pid: int, started_at: datetime) -> Path:
    marker = StartingRun(name, pid, socket.gethostname(), started_at.isoformat(timespec="seconds"))
    path = marker_path(output_dir, pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(marker)))
    return path


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The pid of a process that stays alive for the test (a `mat train` still starting)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child.pid
    child.kill()
    child.wait(timeout=30)


def test_watch_once_lists_runs_being_started_and_ignores_dead_or_damaged_markers(
    tmp_path: Path, live_pid: int
) -> None:
    now = datetime.now(UTC)
    write_marker(tmp_path, "small", live_pid, now - timedelta(seconds=12))
    write_marker(tmp_path, "killed", dead_pid(), now)
    (tmp_path / STARTING_DIR / "1.json").write_text("{not json")
    (tmp_path / STARTING_DIR / "2.json").write_text(json.dumps({"name": "x" * 10_000, "pid": 2}))
    console = text_console()
    watch_runs(console, tmp_path, once=True)
    lines = output(console).splitlines()
    assert lines[0] == f"No training runs under {tmp_path} yet." and len(lines) == 2
    assert re.fullmatch(rf"starting: small \(pid {live_pid}, 1[23] s\)", lines[1]), lines


def test_a_run_whose_process_wrote_run_json_is_no_longer_starting(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    save(tmp_path, running_state("alpha", now))  # owned by this process
    write_marker(tmp_path, "alpha", os.getpid(), now)
    console = text_console()
    watch_runs(console, tmp_path, once=True)
    assert "starting:" not in output(console) and "alpha" in output(console)


def test_watch_waits_for_a_starting_run_and_shows_it_to_the_end(tmp_path: Path, live_pid: int) -> None:
    """The Quick Start's race: watch starts before the run's directory exists, with an old run there."""
    save(tmp_path, make_state("old"))
    marker = write_marker(tmp_path, "fresh", live_pid, datetime.now(UTC))
    state = make_state("fresh", "running", finished=False)
    state.pid = os.getpid()

    def start_then_finish() -> None:
        time.sleep(1.5)  # ingest and Prefect start-up
        save(tmp_path, state)
        marker.unlink()
        time.sleep(1.0)
        state.status = "completed"
        save(tmp_path, state)

    worker = threading.Thread(target=start_then_finish)
    worker.start()
    started = time.monotonic()
    console = text_console()
    watch_runs(console, tmp_path, once=False, refresh_s=0.1, wait_for_runs_s=0.2)
    worker.join(timeout=10)
    assert 2.4 < time.monotonic() - started < 10  # neither the old finished run nor the short grace ended it
    final = output(console)
    assert "fresh" in final and "old" in final and "2 runs" in final and "Nothing is running" not in final


def test_watch_gives_up_with_a_clear_line_when_nothing_starts(tmp_path: Path) -> None:
    save(tmp_path, make_state("old"))
    console = text_console()
    watch_runs(console, tmp_path, once=False, refresh_s=0.05, wait_for_runs_s=0.3)
    assert " ".join(output(console).split()).endswith(
        f"Nothing is running or starting under {tmp_path} (waited 0.3 s); start a run with "
        "`mat train --name NAME &`, then `mat watch`."
    )
