"""Shared helpers for the agent tests: requests, histories, process checks, test agent paths."""

from __future__ import annotations

import os
from pathlib import Path

from multiagenttrainer.agents import AgentRequest
from multiagenttrainer.history import ExperimentResult

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "agents"


def request_for(
    workspace: Path,
    experiment_id: int = 1,
    history: list[ExperimentResult] | None = None,
    prompt: str = "change one thing",
    timeout_s: float = 30.0,
    env: dict[str, str] | None = None,
) -> AgentRequest:
    """An AgentRequest with test defaults."""
    return AgentRequest(workspace, experiment_id, history or [], prompt, timeout_s, env=env or {})


def result(experiment_id: int, status: str, val_bpb: float | None, description: str) -> ExperimentResult:
    """A finished experiment for a history."""
    return ExperimentResult(
        experiment_id, f"{experiment_id:07x}" + "0" * 33, val_bpb, 0.1, status, description
    )  # type: ignore[arg-type]


def process_gone(pid: int) -> bool:
    """True when `pid` no longer runs (absent, or a zombie waiting for a parent that is not ours)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


def asset(name: str) -> str:
    """The shell-quoted path of a test agent script."""
    path = ASSETS / name
    assert os.access(path, os.X_OK), f"{path} must be executable"
    return str(path)
