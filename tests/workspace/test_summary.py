"""parse_run_summary: the `---` block at the end of a run log."""

from __future__ import annotations

import math

import pytest

from multiagenttrainer.workspace.summary import parse_run_summary

AUTORESEARCH_BLOCK = """\
step 00953 (100.0%) | loss: 3.1 | lrm: 0.00 | dt: 310ms | remaining: 0s
---
val_bpb:          0.997900
training_seconds: 300.1
total_seconds:    325.9
peak_vram_mb:     45060.2
mfu_percent:      39.80
total_tokens_M:   499.6
num_steps:        953
num_params_M:     50.3
depth:            8
"""


def test_reads_every_key_of_the_autoresearch_block_with_its_type() -> None:
    summary = parse_run_summary(AUTORESEARCH_BLOCK)
    assert summary == {
        "val_bpb": 0.9979,
        "training_seconds": 300.1,
        "total_seconds": 325.9,
        "peak_vram_mb": 45060.2,
        "mfu_percent": 39.8,
        "total_tokens_M": 499.6,
        "num_steps": 953,
        "num_params_M": 50.3,
        "depth": 8,
    }
    assert isinstance(summary["num_steps"], int) and isinstance(summary["val_bpb"], float)


def test_the_last_block_wins_and_ends_at_the_first_other_line() -> None:
    log = "---\nval_bpb: 2.5\n---\nval_bpb: 1.25\nnum_steps: 7\nTraceback? no, a trailing note\nlater: 3\n"
    assert parse_run_summary(log) == {"val_bpb": 1.25, "num_steps": 7}


def test_a_bare_separator_after_the_block_does_not_hide_it() -> None:
    assert parse_run_summary(AUTORESEARCH_BLOCK + "---\n") == parse_run_summary(AUTORESEARCH_BLOCK)


def test_progress_lines_rewritten_with_carriage_returns_are_split() -> None:
    log = "step 1 | loss: 5.0\rstep 2 | loss: 4.0\r---\r\nval_bpb: 1.5\r\nnum_steps: 2\r\n"
    assert parse_run_summary(log) == {"val_bpb": 1.5, "num_steps": 2}


def test_non_numeric_entries_are_skipped_without_ending_the_block() -> None:
    assert parse_run_summary("---\ndevice: cuda\nval_bpb: 1.5\n") == {"val_bpb": 1.5}


@pytest.mark.parametrize(
    "log",
    [
        "",
        "step 1 | loss: 5.0\nFAIL: loss is nan at step 1\n",
        "---\nnum_steps: 10\ndepth: 4\n",
        "---\nval_bpb: nan\nnum_steps: 10\n",
        "---\nval_bpb: inf\n",
        "---\n\nval_bpb: 1.0\n",
    ],
    ids=["empty", "crash", "no-val-bpb", "nan", "inf", "blank-line-before-entries"],
)
def test_a_log_without_a_finite_val_bpb_has_no_summary(log: str) -> None:
    assert parse_run_summary(log) is None


def test_integers_and_signed_values_parse() -> None:
    summary = parse_run_summary("---\nval_bpb: 1e-3\nnum_steps: -2\n")
    assert summary is not None
    assert math.isclose(summary["val_bpb"], 0.001) and summary["num_steps"] == -2
