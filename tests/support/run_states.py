"""Run states built by hand: a mix of kept, discarded and crashed experiments on two machines."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta

from multiagenttrainer.experiments.run_state import CurrentExperiment, RunState
from multiagenttrainer.history import ExperimentResult, Status

T0 = datetime(2025, 3, 8, 2, 0, 0, tzinfo=UTC)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def result(
    experiment_id: int,
    status: Status,
    val_bpb: float | None,
    description: str,
    duration_s: float,
    machine: str = "gpu-a",
    error: str | None = None,
    log_path: str = "",
) -> ExperimentResult:
    return ExperimentResult(
        experiment_id=experiment_id,
        commit=f"{experiment_id:x}" * 7 + "0123456789abcdef0123456789abcdef0",
        val_bpb=val_bpb,
        memory_gb=0.0 if val_bpb is None else 1.5,
        status=status,
        description=description,
        duration_s=duration_s,
        machine=machine,
        error=error,
        log_path=log_path,
    )


CRASH_ERROR = "RuntimeError: shape mismatch in attention\nTraceback (most recent call last):\n  File train.py"


def mixed_experiments() -> list[ExperimentResult]:
    """Baseline 2.0, then discard, keep 1.95, crash, keep 1.90, discard 1.92 across gpu-a and gpu-b."""
    return [
        result(0, "keep", 2.0, "baseline", 65.0),
        result(1, "discard", 2.01, "raise MATRIX_LR to 0.08", 30.5, machine="gpu-b"),
        result(2, "keep", 1.95, "DEPTH 4 | wider MLP", 125.0),
        result(3, "crash", None, "break the model", 12.0, machine="gpu-b", error=CRASH_ERROR),
        result(4, "keep", 1.90, "WARMUP_RATIO 0.1", 59.96),
        result(5, "discard", 1.92, "halve the batch", 90.0, machine="gpu-b"),
    ]


def make_state(
    name: str = "nightly",
    status: str = "completed",
    experiments: list[ExperimentResult] | None = None,
    max_experiments: int = 8,
    pid: int = 0,
    current: list[CurrentExperiment] | None = None,
    finished: bool = True,
) -> RunState:
    run_id = f"20250308-020000-{name}"
    return RunState(
        run_id=run_id,
        name=name,
        status=status,  # type: ignore[arg-type]
        max_experiments=max_experiments,
        created_at=iso(T0),
        updated_at=iso(T0 + timedelta(minutes=7)),
        workspace={"branch": f"autoresearch/{name}"},
        experiments=mixed_experiments() if experiments is None else experiments,
        current=current or [],
        pid=pid,
        host=socket.gethostname(),
        finished_at=iso(T0 + timedelta(minutes=6, seconds=30)) if finished else None,
    )


def running_state(name: str, now: datetime, elapsed_s: int = 42) -> RunState:
    """A run owned by this (live) test process, busy training experiment 3."""
    current = [CurrentExperiment(3, "training", iso(now - timedelta(seconds=elapsed_s)), machine="local")]
    experiments = [
        result(0, "keep", 2.5, "baseline", 60.0, machine="local"),
        result(1, "keep", 2.4, "lower LR", 60.0, machine="local"),
        result(2, "discard", 2.45, "deeper", 60.0, machine="local"),
    ]
    return make_state(
        name, "running", experiments, max_experiments=10, pid=os.getpid(), current=current, finished=False
    )
