"""The step API the train flow drives (Runner.begin / step / end / abort), and the CLI's progress lines.

These use the trivial train.py of tests/experiments (val_bpb is a known function of its constants), so
they need neither torch nor Prefect.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiagenttrainer.experiments.loop import RunInterrupted
from multiagenttrainer.experiments.results import read_results
from multiagenttrainer.report import experiment_line
from tests.support.experiments import ScheduleAgent, new_trivial_run, trivial_val_bpb
from tests.support.run_states import CRASH_ERROR, make_state, mixed_experiments

SCHEDULE = {1: {"LEARNING_RATE": "0.002"}, 2: {"LEARNING_RATE": "0.003"}, 3: {"LEARNING_RATE": "0.0015"}}


def test_one_step_is_one_recorded_experiment(tmp_path: Path, tiny_corpus: Path) -> None:
    seen: list[int] = []
    runner, workspace = new_trivial_run(
        tmp_path, tiny_corpus, "steps", agent=ScheduleAgent(SCHEDULE), max_experiments=3,
        on_result=lambda r: seen.append(r.experiment_id),
    )  # fmt: skip
    assert runner.run_dir is not None
    loop = runner.begin(workspace)
    statuses = []
    while runner.has_next(loop):
        (result,) = runner.step(loop)
        statuses.append(result.status)
        assert len(read_results(runner.run_dir / "results.tsv")) == result.experiment_id + 1
        assert json.loads((runner.run_dir / "run.json").read_text())["status"] == "running"
    assert runner.step(loop) == [] and seen == [0, 1, 2]
    runner.end(loop, "completed")

    assert statuses == ["keep", "keep", "discard"]
    state = json.loads((runner.run_dir / "run.json").read_text())
    assert state["status"] == "completed" and state["finished_at"] and state["current"] == []
    assert state["best"]["val_bpb"] == trivial_val_bpb(0.002)


def test_begin_can_extend_a_finished_run(tmp_path: Path, tiny_corpus: Path) -> None:
    runner, workspace = new_trivial_run(
        tmp_path, tiny_corpus, "extend", agent=ScheduleAgent(SCHEDULE), max_experiments=1
    )
    loop = runner.begin(workspace)
    runner.step(loop)
    runner.end(loop, "completed")
    loop = runner.begin(workspace, max_experiments=3)
    assert runner.has_next(loop) and loop.state.status == "running"
    while runner.has_next(loop):
        runner.step(loop)
    runner.end(loop, "completed")
    assert [e.experiment_id for e in loop.state.experiments] == [0, 1, 2]


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [
        (KeyboardInterrupt(), "interrupted", "interrupted"),
        (RunInterrupted("run x was interrupted"), "interrupted", "run x was interrupted"),
        (ValueError("disk full"), "failed", "ValueError: disk full"),
    ],
)
def test_abort_records_how_the_run_ended(
    tmp_path: Path, tiny_corpus: Path, error: BaseException, status: str, message: str
) -> None:
    runner, workspace = new_trivial_run(tmp_path, tiny_corpus, "abort", agent=ScheduleAgent(SCHEDULE))
    loop = runner.begin(workspace)
    runner.step(loop)
    runner.abort(loop, error)
    assert loop.stop.is_set() == isinstance(error, KeyboardInterrupt)
    state = json.loads((tmp_path / str(runner.run_id) / "run.json").read_text())
    assert (state["status"], state["error"]) == (status, message)
    if loop.stop.is_set():
        with pytest.raises(RunInterrupted, match="mat train --resume"):
            runner.step(loop)


def test_progress_lines_show_position_status_value_delta_duration_and_change() -> None:
    state = make_state(experiments=mixed_experiments(), max_experiments=8)
    lines = [experiment_line(result, state) for result in state.experiments]
    assert lines == [
        "[1/8] keep val_bpb 2.000000 65.0s  baseline",
        "[2/8] discard val_bpb 2.010000 (+0.010000) 30.5s  raise MATRIX_LR to 0.08",
        "[3/8] keep val_bpb 1.950000 (-0.050000) 125.0s  DEPTH 4 | wider MLP",
        f"[4/8] crash 12.0s  break the model ({CRASH_ERROR.splitlines()[0]})",
        "[5/8] keep val_bpb 1.900000 (-0.050000) 60.0s  WARMUP_RATIO 0.1",
        "[6/8] discard val_bpb 1.920000 (+0.020000) 90.0s  halve the batch",
    ]
