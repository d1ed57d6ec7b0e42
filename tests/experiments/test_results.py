"""results.tsv: autoresearch's exact bytes, whole rows under concurrent appends, torn-line repair."""

from __future__ import annotations

import math
import multiprocessing
from pathlib import Path

import pandas as pd
import pytest

from multiagenttrainer.experiments.results import (
    RESULTS_HEADER,
    ResultRow,
    append_result,
    ensure_header,
    format_row,
    parse_row,
    read_results,
)
from multiagenttrainer.history import ExperimentResult

SHA = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"


def result(
    status: str = "keep", val_bpb: float | None = 0.9979, memory_gb: float = 44.0, **kw: object
) -> ExperimentResult:
    return ExperimentResult(
        0, kw.pop("commit", SHA), val_bpb, memory_gb, status, kw.pop("description", "baseline"), **kw
    )  # type: ignore[arg-type]


def test_header_is_autoresearchs() -> None:
    assert RESULTS_HEADER == "commit\tval_bpb\tmemory_gb\tstatus\tdescription"


def test_row_bytes_match_autoresearch() -> None:
    assert format_row(result()) == "a1b2c3d\t0.997900\t44.0\tkeep\tbaseline\n"
    assert format_row(result("discard", 1.0051234567, 44.04, description="double LR")) == (
        "a1b2c3d\t1.005123\t44.0\tdiscard\tdouble LR\n"
    )


def test_crash_rows_write_zeros_whatever_the_numbers() -> None:
    assert (
        format_row(result("crash", None, 12.3, description="OOM")) == "a1b2c3d\t0.000000\t0.0\tcrash\tOOM\n"
    )
    assert format_row(result("crash", 1.5, 12.3)) == "a1b2c3d\t0.000000\t0.0\tcrash\tbaseline\n"
    assert format_row(result("keep", math.nan, 1.0)).split("\t")[1:3] == ["0.000000", "0.0"]


def test_description_is_one_line_without_tabs() -> None:
    row = format_row(result(description="a\tb\nc\r\nd  "))
    assert row == "a1b2c3d\t0.997900\t44.0\tkeep\ta b c  d\n"
    assert row.count("\t") == 4 and row.count("\n") == 1


def test_append_writes_header_once_then_rows(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    append_result(path, result())
    append_result(path, result("discard", 1.01, 44.0, description="wider"))
    assert path.read_bytes() == (
        b"commit\tval_bpb\tmemory_gb\tstatus\tdescription\n"
        b"a1b2c3d\t0.997900\t44.0\tkeep\tbaseline\n"
        b"a1b2c3d\t1.010000\t44.0\tdiscard\twider\n"
    )
    assert read_results(path) == [
        ResultRow("a1b2c3d", 0.9979, 44.0, "keep", "baseline"),
        ResultRow("a1b2c3d", 1.01, 44.0, "discard", "wider"),
    ]


def test_torn_last_line_is_cut_before_reading_and_appending(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    append_result(path, result())
    whole = path.read_bytes()
    with path.open("ab") as handle:
        handle.write(b"b2c3d4e\t0.99")  # a write cut short
    assert read_results(path) == [ResultRow("a1b2c3d", 0.9979, 44.0, "keep", "baseline")]
    assert path.read_bytes() == whole
    with path.open("ab") as handle:
        handle.write(b"c3d4e5f\t0.98")
    append_result(path, result("discard", 1.2, 1.0))
    assert path.read_bytes() == whole + b"a1b2c3d\t1.200000\t1.0\tdiscard\tbaseline\n"


def test_torn_header_is_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    path.write_bytes(b"commit\tval_b")
    ensure_header(path)
    assert path.read_bytes() == (RESULTS_HEADER + "\n").encode()
    assert read_results(tmp_path / "missing.tsv") == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("commit\tval_bpb\tmemory_gb\tstatus\tdescription", None),
        ("", None),
        ("a1b2c3d 0.99 44.0 keep spaces, not tabs", None),
        ("a1b2c3d\tnot-a-number\t44.0\tkeep\tx", None),
        ("a1b2c3d\t0.99\t44.0\tmaybe\tx", None),
        ("a1b2c3d\t0.990000\t44.0\tkeep", ResultRow("a1b2c3d", 0.99, 44.0, "keep", "")),
        (
            "a1b2c3d\t0.000000\t0.0\tcrash\tOOM\twith a tab",
            ResultRow("a1b2c3d", None, 0.0, "crash", "OOM\twith a tab"),
        ),
    ],
)
def test_parse_row(line: str, expected: ResultRow | None) -> None:
    assert parse_row(line) == expected


def test_pandas_reads_the_file_with_autoresearchs_columns(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    append_result(path, result())
    append_result(path, result("discard", 1.003, 44.0, description="halve batch, then warm up"))
    append_result(path, result("crash", None, 0.0, description="depth 24\t(OOM)"))
    frame = pd.read_csv(path, sep="\t")
    assert list(frame.columns) == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert frame["status"].tolist() == ["keep", "discard", "crash"]
    assert frame["val_bpb"].tolist() == [0.9979, 1.003, 0.0]
    assert frame["memory_gb"].tolist() == [44.0, 44.0, 0.0]
    assert frame["commit"].tolist() == ["a1b2c3d"] * 3
    assert frame["description"].iloc[2] == "depth 24 (OOM)"
    kept = frame[frame["status"] == "keep"]  # what autoresearch's analysis notebook does
    assert kept["val_bpb"].min() == 0.9979


def _append_many(path: str, writer: int, count: int) -> None:
    for index in range(count):
        append_result(
            Path(path),
            result("discard", 1.0 + index / 1000, 1.0, description=f"writer {writer} " + "x" * 300),
        )


def test_concurrent_appends_from_processes_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "results.tsv"
    ensure_header(path)
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_append_many, args=(str(path), w, 150)) for w in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    lines = path.read_text().splitlines()
    assert lines[0] == RESULTS_HEADER
    assert len(lines) == 1 + 3 * 150
    assert all(parse_row(line) is not None for line in lines[1:])
