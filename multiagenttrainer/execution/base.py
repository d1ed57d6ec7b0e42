"""Where training runs: one Protocol for every execution target (local, ssh, docker).

prepare(workspace)            once per run: the workspace (code and data) made available on the target
sync(workspace, ["train.py"]) before each experiment: only what changed is copied again
run(...) -> RunOutcome        the training command, output streamed into a local log, killed on timeout
fetch(workspace, paths)       files copied back into the workspace, every path checked
stop(workspace)               everything started for the workspace killed and verified gone
cleanup()                     connections released; the remote copy stays for inspection
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class RunOutcome:
    """How a command on the target ended. The full output is in the log file the caller named."""

    exit_code: int | None  # None when it was killed for running past its timeout, or never ended
    timed_out: bool
    duration_s: float
    error: str | None = None  # why the run could not finish on the target (a lost connection); a crash


class Executor(Protocol):
    """Runs training for a workspace on one machine."""

    name: str

    def prepare(self, workspace: Path) -> None:
        """Make the workspace (code and data) available on the target; called once per run."""
        ...

    def sync(self, workspace: Path, paths: list[str]) -> None:
        """Bring the given workspace-relative files on the target up to date (train.py before each run)."""
        ...

    def run(
        self, workspace: Path, command: list[str], timeout_s: float, log_path: Path, env: dict[str, str]
    ) -> RunOutcome:
        """Run `command` in the workspace, streaming stdout+stderr into `log_path` on this machine.

        On timeout the whole process group (or remote session) is killed; nothing is left running.
        """
        ...

    def fetch(self, workspace: Path, paths: list[str]) -> None:
        """Copy the given workspace-relative files back from the target (results.tsv, run.log)."""
        ...

    def stop(self, workspace: Path) -> None:
        """Stop everything this executor started for `workspace`, and what an earlier (killed) mat left
        running there, verified gone. Callable from another thread while `run` is in progress; never
        raises: what cannot be stopped is logged.
        """
        ...

    def cleanup(self) -> None:
        """Release connections; leave the remote workspace for inspection."""
        ...
