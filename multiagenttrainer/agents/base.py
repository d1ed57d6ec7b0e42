"""What an agent is: something that changes `train.py` in a workspace, once per experiment."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from multiagenttrainer.history import ExperimentResult


@dataclass(frozen=True)
class AgentRequest:
    """Everything an agent gets for one experiment."""

    workspace: Path  # a git work tree; HEAD is the best train.py so far
    experiment_id: int
    history: list[ExperimentResult]  # every finished experiment of this run, oldest first
    prompt: str  # the instruction text (program.md + the current state), for command agents
    timeout_s: float
    mode: str = "harness"  # harness: only edit train.py; agent: also run and record the experiment
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class AgentOutcome:
    """What the agent did: a one-line description, and its log (stdout+stderr) for the run's records."""

    description: str
    log: str = ""
    exit_code: int = 0
    timed_out: bool = False


class Agent(Protocol):
    """Makes one change to train.py in `request.workspace` and describes it."""

    name: str

    def propose(self, request: AgentRequest) -> AgentOutcome:
        """Edit the workspace; return how it went. Must not raise for an agent's own failure."""
        ...
