"""run.json: the state of one training run, rewritten atomically at every step of the loop.

`mat status` and `mat watch` read only these files (and results.tsv), so they work for runs
started by any process, including several `mat train --name X &` at once.

Run directory layout (`<training.output_dir>/<run_id>/`):
    run.json        this state
    results.tsv     autoresearch's table: commit, val_bpb, memory_gb, status, description
    report.md       the report, rewritten after every experiment
    progress.png    val_bpb per experiment with the running best
    logs/           exp-000.log (training output), exp-000.agent.log (agent output),
                    exp-000.score.log (the independent evaluation), ...
    workspace/      the git work tree the agent edits; kept commits on its branch
    evaluator/      the recorded evaluator: hashes and copies of the fixed files, mat's git config,
                    the built-in's held-out split (workspace/evaluator.py)
    scoring/        the last independent evaluation's inputs and result (workspace/scoring.py)
    workspace-<m>/  with `machines:`, machine m's work tree (workspace/ is then the hub of kept commits)
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.clock import now_iso
from multiagenttrainer.errors import ExperimentError
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.processes import pid_alive

RunStatus = Literal["running", "completed", "failed", "interrupted"]
Phase = Literal["setup", "agent", "training", "scoring", "recording", "report"]
RUN_FILE = "run.json"
LOCK_FILE = ".run.lock"

log = logging.getLogger(__name__)


@dataclass
class CurrentExperiment:
    """The experiment in progress, for `mat watch`."""

    experiment_id: int
    phase: Phase
    started_at: str
    machine: str = "local"


@dataclass
class MachineRecord:
    """One machine of a multi-machine run: its work tree and whether it is still in the run."""

    name: str
    type: str
    workspace: str  # <run_dir>/workspace-<machine>
    status: Literal["active", "dropped"] = "active"
    reason: str | None = None  # why it was dropped
    consecutive_failures: int = 0


@dataclass
class RunState:
    """Everything about a run except the bulky files; one JSON document."""

    run_id: str
    name: str
    status: RunStatus
    max_experiments: int
    created_at: str
    updated_at: str
    config: dict[str, Any] = field(default_factory=dict)
    workspace: dict[str, Any] = field(default_factory=dict)  # how to run training in it (see workspace/setup)
    evaluator: dict[str, Any] = field(default_factory=dict)  # its fingerprint and files (workspace/evaluator)
    experiments: list[ExperimentResult] = field(default_factory=list)
    current: list[CurrentExperiment] = field(default_factory=list)
    pid: int = 0
    host: str = ""
    finished_at: str | None = None
    error: str | None = None
    flow_run_url: str | None = None
    flow_run_id: str | None = None  # the Prefect flow run driving the run, when there is one
    machines: list[MachineRecord] = field(default_factory=list)  # with `machines:` in the config

    # -- derived -------------------------------------------------------------

    @property
    def baseline(self) -> ExperimentResult | None:
        """Experiment 0 once it has finished."""
        return next((e for e in self.experiments if e.experiment_id == 0), None)

    @property
    def best(self) -> ExperimentResult | None:
        """The kept experiment with the lowest val_bpb."""
        kept = [e for e in self.experiments if e.status == "keep" and e.val_bpb is not None]
        return min(kept, key=lambda e: e.val_bpb or 0.0) if kept else None

    @property
    def done(self) -> int:
        return len(self.experiments)

    def effective_status(self) -> RunStatus:
        """`running` only while the process that owns the run is alive on this host."""
        if self.status == "running" and self.host == socket.gethostname() and not pid_alive(self.pid):
            return "interrupted"
        return self.status

    # -- persistence ---------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        best, baseline = self.best, self.baseline
        data["best"] = (
            {"experiment_id": best.experiment_id, "commit": best.commit, "val_bpb": best.val_bpb}
            if best
            else None
        )
        data["baseline_val_bpb"] = baseline.val_bpb if baseline else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        values["experiments"] = [ExperimentResult.from_dict(e) for e in data.get("experiments", [])]
        values["current"] = [CurrentExperiment(**c) for c in data.get("current", [])]
        values["machines"] = [MachineRecord(**m) for m in data.get("machines", [])]
        return cls(**values)

    def save(self, run_dir: Path) -> None:
        """Write run.json atomically (temp file + rename), so readers never see half a file."""
        self.updated_at = now_iso()
        write_json_atomically(run_dir / RUN_FILE, self.to_dict())


class RunStateError(ExperimentError):
    """run.json cannot be read back: missing, not JSON, or not the shape mat writes."""


_RUN_STATE: TypeAdapter[RunState] = TypeAdapter(RunState)


def parse_run_state(data: Any, path: Path) -> RunState:
    """Validate run.json's content field by field (it may have been damaged, or written by anyone)."""
    if not isinstance(data, dict):
        raise RunStateError(f"{path}: expected a JSON object, found {type(data).__name__}")
    known = {k: v for k, v in data.items() if k in RunState.__dataclass_fields__}
    try:
        return _RUN_STATE.validate_python(known, strict=False)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()[:5]
        )
        raise RunStateError(f"{path}: {problems}") from None


def load_run(run_dir: Path) -> RunState:
    """Read a run's state; RunStateError (naming the file and the problem) when it cannot be."""
    path = run_dir / RUN_FILE
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except FileNotFoundError:
        raise RunStateError(f"{path}: no run state here") from None
    except UnicodeDecodeError as exc:
        raise RunStateError(f"{path}: not text (byte {exc.start} is not UTF-8)") from None
    except json.JSONDecodeError as exc:
        raise RunStateError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except OSError as exc:
        raise RunStateError(f"{path}: cannot be read ({exc.strerror})") from None
    return parse_run_state(data, path)


class RunLock:
    """What every writer of a run's state holds: re-entrant across this process's threads; with
    `across_processes` (machines of one run served by separate worker processes), also an exclusive
    flock on `<run_dir>/.run.lock`, and the shared parts of the state are read back from run.json on
    entry, since another process may have changed them. Every change made under the lock is saved
    before it is released."""

    def __init__(self, run_dir: Path, state: RunState, across_processes: bool = False) -> None:
        self.run_dir, self.state, self.across_processes = run_dir, state, across_processes
        self._lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    def __enter__(self) -> None:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1 and self.across_processes:
            try:
                self._lock_file()
                refresh_shared(self.state, load_run(self.run_dir))
            except BaseException:
                self.__exit__(None, None, None)
                raise

    def _lock_file(self) -> None:
        path = self.run_dir / LOCK_FILE
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            self._fd = os.open(path, flags, 0o600)
        except OSError as exc:  # a link or a directory planted there, or a full disk
            if exc.errno == errno.ENOSPC:
                raise
            problem = f"cannot be opened as the run's lock ({exc.strerror}); remove it"
            raise RunStateError(f"{path}: {problem}") from None
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # closing releases the flock
            self._fd = None
        self._lock.release()


def refresh_shared(state: RunState, fresh: RunState) -> None:
    """Take what the machines of a run share (experiments, claims, machine records) and how the run stands
    (its owner may have ended it meanwhile) from `fresh`."""
    state.experiments, state.current, state.machines = fresh.experiments, fresh.current, fresh.machines
    state.max_experiments = fresh.max_experiments
    state.status, state.error, state.finished_at = fresh.status, fresh.error, fresh.finished_at


def list_runs(output_dir: Path) -> list[tuple[Path, RunState]]:
    """Every run under `output_dir`, oldest first; unreadable run.json files are skipped."""
    runs = []
    for run_file in sorted(Path(output_dir).glob(f"*/{RUN_FILE}")):
        try:
            runs.append((run_file.parent, load_run(run_file.parent)))
        except RunStateError as exc:
            log.warning("skipping a run that cannot be read: %s", exc)
    return sorted(runs, key=lambda item: item[1].created_at)


def find_run_of_flow_run(output_dir: Path, flow_run_id: str) -> RunState | None:
    """The run a Prefect flow run drove, found through run.json (None when it never got that far)."""
    matches = [state for _, state in list_runs(output_dir) if state.flow_run_id == flow_run_id]
    return matches[-1] if matches else None
