"""report.md and progress.png for hand-built runs: numbers, formatting and a valid image."""

from __future__ import annotations

import struct
from pathlib import Path

from multiagenttrainer.report import (
    experiment_rows,
    format_duration,
    render_report_markdown,
    results_table,
    write_report,
)
from tests.support.run_states import make_state, result

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_summary_states_best_improvement_counts_durations_and_branch() -> None:
    markdown = render_report_markdown(make_state())
    lines = markdown.splitlines()
    assert lines[0] == "# Training run nightly (20250308-020000-nightly)"
    assert "- Status: completed" in lines
    assert "- Experiments: 6 of 8 (keep 3, discard 2, crash 1)" in lines
    assert "- Baseline val_bpb: 2.000000" in lines
    assert "- Best val_bpb: 1.900000 (experiment 4, commit `4444444`)" in lines
    assert "- Improvement over baseline: 0.100000 (5.00%)" in lines
    assert "- Duration: total 6m 22s, mean 1m 04s per experiment" in lines
    assert "- Workspace branch: `autoresearch/nightly`" in lines
    assert "- Machines: gpu-a, gpu-b" in lines


def test_table_rows_show_delta_against_the_best_kept_before_and_crash_errors() -> None:
    lines = render_report_markdown(make_state()).splitlines()
    start = lines.index("| # | status | val_bpb | delta vs best¹ | duration | machine | description |")
    assert lines[start + 1] == "|--:|:--|--:|--:|--:|:--|:--|"
    assert lines[start + 2 : start + 8] == [
        "| 0 | keep | 2.000000 | — | 1m 05s | gpu-a | baseline |",
        "| 1 | discard | 2.010000 | +0.010000 | 30.5 s | gpu-b | raise MATRIX_LR to 0.08 |",
        "| 2 | keep | 1.950000 | -0.050000 | 2m 05s | gpu-a | DEPTH 4 \\| wider MLP |",
        "| 3 | crash | crash | — | 12.0 s | gpu-b | "
        "break the model (error: RuntimeError: shape mismatch in attention) |",
        "| 4 | keep | 1.900000 | -0.050000 | 1m 00s | gpu-a | WARMUP_RATIO 0.1 |",
        "| 5 | discard | 1.920000 | +0.020000 | 1m 30s | gpu-b | halve the batch |",
    ]
    assert any(
        line.startswith("¹ val_bpb minus the best val_bpb kept before that experiment") for line in lines
    )


def test_one_machine_has_no_machine_column_and_missing_branch_says_unknown() -> None:
    experiments = [result(0, "keep", 1.5, "baseline", 10.0), result(1, "discard", 1.6, "x", 20.0)]
    state = make_state("solo", "running", experiments, max_experiments=3, finished=False)
    state.workspace = {}
    lines = render_report_markdown(state).splitlines()
    assert "| # | status | val_bpb | delta vs best¹ | duration | description |" in lines
    assert "| 1 | discard | 1.600000 | +0.100000 | 20.0 s | x |" in lines
    assert "- Improvement over baseline: 0.000000 (0.00%)" in lines
    assert "- Duration: total 30.0 s, mean 15.0 s per experiment" in lines
    assert "- Workspace branch: unknown" in lines
    assert not any(line.startswith("- Machines:") for line in lines)


def test_run_without_experiments_and_with_crashed_baseline() -> None:
    empty = render_report_markdown(make_state("fresh", "running", [], finished=False)).splitlines()
    assert "- Experiments: 0 of 8 (keep 0, discard 0, crash 0)" in empty
    assert "- Baseline val_bpb: not run yet" in empty
    assert "- Best val_bpb: none yet" in empty
    assert "No experiment has finished yet." in empty
    crashed = [result(0, "crash", None, "baseline", 3.0, error="\n\nOOM\nmore")]
    lines = render_report_markdown(make_state("broken", "failed", crashed)).splitlines()
    assert "- Baseline val_bpb: crashed" in lines
    assert "- Improvement over baseline: n/a (needs a finished baseline and a kept experiment)" in lines
    assert "| 0 | crash | crash | — | 3.0 s | baseline (error: OOM) |" in lines


def test_durations_read_naturally() -> None:
    assert [format_duration(s) for s in (0.0, 42.34, 59.96, 125, 3599.6, 3725)] == [
        "0.0 s",
        "42.3 s",
        "1m 00s",
        "2m 05s",
        "1h 00m",
        "1h 02m",
    ]


def test_running_best_follows_kept_experiments_only() -> None:
    rows = experiment_rows(make_state())
    assert [row.best_after for row in rows] == [2.0, 2.0, 1.95, 1.95, 1.90, 1.90]
    assert [row.commit for row in rows][:2] == ["0000000", "1111111"]


def test_results_table_for_the_prefect_artifact() -> None:
    table = results_table(make_state())
    assert len(table) == 6
    assert table[3] == {
        "#": 3,
        "status": "crash",
        "val_bpb": "crash",
        "delta vs best": "—",
        "duration": "12.0 s",
        "machine": "gpu-b",
        "commit": "3333333",
        "description": "break the model (error: RuntimeError: shape mismatch in attention)",
    }
    assert table[2]["description"] == "DEPTH 4 | wider MLP"


def test_write_report_writes_both_files_atomically(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    report, plot = write_report(run_dir, make_state())
    assert report == run_dir / "report.md" and plot == run_dir / "progress.png"
    assert report.read_text(encoding="utf-8") == render_report_markdown(make_state())
    assert png_size(plot) == (1100, 605)
    assert plot.stat().st_size > 20_000  # points, lines, labels and legend, not a blank canvas
    assert sorted(p.name for p in run_dir.iterdir()) == ["progress.png", "report.md"]  # no temp files left
    assert report.stat().st_mode & 0o777 == 0o644


def test_plot_without_any_val_bpb_is_still_a_png(tmp_path: Path) -> None:
    _, plot = write_report(tmp_path / "empty", make_state("fresh", "running", [], finished=False))
    assert png_size(plot) == (1100, 605)
    crashed = [result(0, "crash", None, "baseline", 3.0, error="OOM")]
    _, plot = write_report(tmp_path / "crashed", make_state("broken", "failed", crashed))
    assert png_size(plot) == (1100, 605)


def test_every_reverted_change_is_listed_by_experiment_and_file() -> None:
    state = make_state()
    state.workspace["evaluation"] = "independent"
    state.evaluator = {"hash": "ab" * 32}
    state.experiments[2].reverted = [
        {"path": "prepare.py", "change": "modified", "by": "agent"},
        {"path": ".git/config", "change": "modified", "by": "agent"},
        {"path": "data/val.bin", "change": "modified", "by": "training"},
    ]
    state.experiments[3].reverted = [{"path": "helpers.py", "change": "added", "by": "agent"}]
    lines = render_report_markdown(state).splitlines()
    start = lines.index("## Changes mat reverted")
    assert lines[start + 4 : start + 7] == [
        "- Experiment 2, by the agent: prepare.py (modified), .git/config (modified)",
        "- Experiment 2, by the training run: data/val.bin (modified)",
        "- Experiment 3, by the agent: helpers.py (added)",
    ]
    assert (
        "- Scoring: independent: mat re-scores the checkpoint train.py saves, apart from training; "
        "evaluator sha256 `abababababab`" in lines
    )
    assert "## Changes mat reverted" not in render_report_markdown(make_state())
