"""Fine-tune targets on their machine: an open-source target whose `machine:` is an ssh or docker machine.

The stage (runner.py) hands such a target here instead of to a local child process. The machine's executor
(execution/ssh.py, execution/docker.py) does what it does for training runs: copy a workspace there, run one
command under mat's session helper (output streamed back, the whole process scope killed on cancel or time
limit), copy files back with every path checked (execution/remote.py).

    <jobs_dir>/<target>/<job id>/workspace/       what goes to the machine: target.json, corpus/<file>
    <jobs_dir>/<target>/<job id>/worker.log       the worker's output, as it arrives
    <jobs_dir>/<target>/<job id>/CANCEL           left by `mat finetune cancel`: the job ends cancelled
    on the machine, <remote_dir>/<job id>/<machine>/workspace/ holds besides them:
        output/<job id>/                the adapter and tokenizer (checkpoints/ stays on the machine)
        jobs/<target>/<job id>.json     the worker's own record

The machine runs the worker that a local target runs (`<execution.python> -m
multiagenttrainer.finetune.worker`), so mat with its `opensource` extra must be installed for that Python, and
`model_id` must be a hub id or a folder on that machine. When the worker ends, the adapter comes back to
`<output_dir>/<job id>/` and the machine's record is merged into the local one, which keeps where the job runs
(machine, remote_dir, remote_pid). While it trains, its progress is copied from the machine's record every
PROGRESS_POLL_S seconds, so `mat finetune start` and `list` show it as they do a local job's.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from multiagenttrainer.atomic import write_json_atomically
from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import DockerExecution, MachineConfig, OpenSourceConfig, SshExecution
from multiagenttrainer.corpus.records import corpus_file
from multiagenttrainer.errors import BackendError, MachineError, MatError
from multiagenttrainer.execution.base import RunOutcome
from multiagenttrainer.finetune.base import DEFAULT_TARGET, JobRecord, JobStore, read_record, safe_name
from multiagenttrainer.finetune.registry import ResolvedTarget
from multiagenttrainer.finetune.worker import target_spec
from multiagenttrainer.processes import pid_alive

log = logging.getLogger(__name__)

RemoteExecution = SshExecution | DockerExecution
REMOTE_TYPES = frozenset({"ssh", "docker"})
TIMEOUT_S = 7 * 24 * 3600.0  # the session helper stops a remote job that is still training after a week
SPEC = "target.json"
CORPUS_DIR = "corpus"
OUTPUT_DIR = "output"  # the target's output_dir on the machine, inside the job's workspace there
JOBS_DIR = "jobs"
KEPT_THERE = frozenset({"checkpoints"})  # parts of the job folder that are not copied back
CANCEL_MARKER = "CANCEL"
PROGRESS_POLL_S = 3.0
LOG_TAIL_LINES = 8
LOG_TAIL_CHARS = 1500
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false"}
REMOTE_FIELDS = ("status", "started_at", "finished_at", "dataset", "metrics", "progress", "error")


class Machine(Protocol):
    """What a fine-tune needs of an executor (execution/ssh.py and execution/docker.py provide it)."""

    name: str

    def prepare(self, workspace: Path) -> None: ...

    def run(
        self, workspace: Path, command: list[str], timeout_s: float, log_path: Path, env: dict[str, str]
    ) -> RunOutcome: ...

    def fetch(self, workspace: Path, paths: list[str]) -> None: ...

    def listing(self, workspace: Path) -> dict[str, str]: ...

    def remote_workspace(self, workspace: Path) -> str: ...

    def stop(self, workspace: Path) -> None: ...

    def cleanup(self) -> None: ...


# --------------------------------------------------------------------------- which machine


def machine_execution(name: str | None, machines: Sequence[MachineConfig]) -> RemoteExecution | None:
    """The ssh or docker execution of the named machine; None for no machine, a local one, or a name that
    is not in `machines` (then it only documents which host the target is sized for: see unknown_machine)."""
    if name is None:
        return None
    for machine in machines:
        if machine.name == name:
            execution = machine.execution
            return execution if isinstance(execution, (SshExecution, DockerExecution)) else None
    return None


def unknown_machine(name: str | None, machines: Sequence[MachineConfig]) -> str | None:
    """What to tell the user when a target names a machine that `machines` does not list, else None."""
    if name is None or any(machine.name == name for machine in machines):
        return None
    known = ", ".join(m.name for m in machines) or "none"
    return (
        f"machine {name!r} is not in machines (configured: {known}), so it only labels the target, which "
        "trains on this machine; add it under machines: to train there"
    )


def open_machine(execution: RemoteExecution, name: str) -> Machine:
    """The executor of the machine (its client library imported on first use)."""
    from multiagenttrainer.execution.registry import executor_class

    machine: Machine = executor_class(execution.type)(execution, name)
    return machine


def job_folder(store: JobStore, target: str, job_id: str) -> Path:
    """`<jobs_dir>/<target>/<job id>/`: the job's workspace and log on this machine."""
    return store.jobs_dir / safe_name(target or DEFAULT_TARGET) / safe_name(job_id)


def staging(store: JobStore, target: str, job_id: str) -> Path:
    """The local workspace whose copy runs on the machine (its parent's name is the job id)."""
    return job_folder(store, target, job_id) / "workspace"


def cancel_marker(store: JobStore, target: str, job_id: str) -> Path:
    """The file `cancel` leaves; the process that drives the job then ends it cancelled, whatever it read."""
    return job_folder(store, target, job_id) / CANCEL_MARKER


def record_path(target: str, job_id: str) -> str:
    """Where the worker on the machine keeps its record, relative to the workspace there."""
    return f"{JOBS_DIR}/{safe_name(target or DEFAULT_TARGET)}/{safe_name(job_id)}.json"


# --------------------------------------------------------------------------- starting


def stage(target: ResolvedTarget, corpus: Path, workspace: Path) -> str:
    """Write the workspace: the target (output_dir: `output`) and the corpus; the corpus's path in it."""
    source = corpus_file(corpus)
    (workspace / CORPUS_DIR).mkdir(parents=True, exist_ok=True)
    destination = workspace / CORPUS_DIR / source.name
    destination.unlink(missing_ok=True)
    try:
        os.link(source, destination)  # no second copy of a large corpus where the filesystem allows
    except OSError:
        shutil.copyfile(source, destination)
    spec = target_spec(target)
    spec["config"]["output_dir"] = OUTPUT_DIR
    write_json_atomically(workspace / SPEC, spec)
    return f"{CORPUS_DIR}/{source.name}"


def worker_argv(execution: RemoteExecution, corpus: str, name: str, job_id: str) -> list[str]:
    """The worker's command on the machine (paths relative to the workspace there; all its CPUs)."""
    return [
        execution.python, "-m", "multiagenttrainer.finetune.worker", "--target", SPEC, "--corpus", corpus,
        "--name", name, "--job-id", job_id, "--jobs-dir", JOBS_DIR, "--threads", "0",
    ]  # fmt: skip


def new_record(target: ResolvedTarget, job_id: str, name: str) -> JobRecord:
    """The local record of a job about to start on its machine."""
    assert isinstance(target.config, OpenSourceConfig)
    output = Path(target.config.output_dir) / safe_name(job_id)
    return JobRecord(id=job_id, backend=target.backend, target=target.name, model=target.config.model_id,
                     status="pending", name=name, output_path=str(output), pid=os.getpid(),
                     machine=target.machine)  # fmt: skip


def train_on_machine(
    target: ResolvedTarget, job_id: str, execution: RemoteExecution, corpus: Path, name: str, store: JobStore
) -> JobRecord:
    """Run the target's worker on its machine until it ends; its final record (MatError: it could not run)."""
    assert target.machine is not None
    store.save(new_record(target, job_id, name))
    workspace = staging(store, target.name, job_id)
    machine = open_machine(execution, target.machine)
    try:
        argv = worker_argv(execution, stage(target, corpus, workspace), name, job_id)
        machine.prepare(workspace)
        remote_dir = machine.remote_workspace(workspace)
        if cancel_marker(store, target.name, job_id).exists():  # cancelled while the workspace was copied
            return finish(machine, target, store, job_id, "cancelled")
        record = store.get(job_id)
        record.status, record.started_at, record.remote_dir = "running", now_iso(), remote_dir
        store.save(record)
        worker_log = job_folder(store, target.name, job_id) / "worker.log"
        with ProgressPoller(machine, target, store, job_id):
            outcome = machine.run(workspace, argv, TIMEOUT_S, worker_log, dict(WORKER_ENV))
        return finish(machine, target, store, job_id, failure_reason(outcome, worker_log, target.machine))
    finally:
        machine.cleanup()


class ProgressPoller:
    """While the job trains, copies the machine's record's progress into the local record now and then."""

    def __init__(self, machine: Machine, target: ResolvedTarget, store: JobStore, job_id: str) -> None:
        self.machine, self.target, self.store, self.job_id = machine, target, store, job_id
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.poll, name=f"mat-progress-{job_id}", daemon=True)

    def __enter__(self) -> ProgressPoller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def poll(self) -> None:
        """Every PROGRESS_POLL_S until done: progress, metrics and the remote pid (never the status)."""
        workspace = staging(self.store, self.target.name, self.job_id)
        while not self.done.wait(PROGRESS_POLL_S):
            try:
                remote = fetch_record(self.machine, workspace, self.store.get(self.job_id))
            except MatError as exc:  # the run itself notices a lost machine
                log.debug("no progress from machine %s: %s", self.target.machine, exc)
                continue
            if remote is not None:
                self.save_progress(remote)

    def save_progress(self, remote: JobRecord) -> None:
        """The remote record's progress into the local record, unless the job was cancelled meanwhile."""
        record = self.store.get(self.job_id)
        if record.finished or cancel_marker(self.store, self.target.name, self.job_id).exists():
            return
        record.progress, record.metrics = remote.progress, remote.metrics
        record.remote_pid = remote.pid or worker_pid(remote.metrics) or record.remote_pid
        self.store.save(record)


def failure_reason(outcome: RunOutcome, worker_log: Path, machine: str) -> str:
    """Why a worker that left no final record ended: the executor's reason or its exit, and its last lines."""
    if outcome.error:
        reason = outcome.error
    elif outcome.timed_out:
        reason = f"the training process on machine {machine!r} was stopped after {TIMEOUT_S:.0f} s"
    else:
        reason = f"the training process on machine {machine!r} exited with code {outcome.exit_code}"
    tail = log_tail(worker_log)
    return f"{reason}: {tail}" if tail else reason


def log_tail(worker_log: Path) -> str:
    """The last lines of the worker's log, as one line."""
    try:
        lines = worker_log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-LOG_TAIL_LINES:] if line.strip())[-LOG_TAIL_CHARS:]


# --------------------------------------------------------------------------- copying back


def finish(machine: Machine, target: ResolvedTarget, store: JobStore, job_id: str, reason: str) -> JobRecord:
    """Bring back the adapter and the machine's record; the final local record.

    A job cancelled here stays cancelled; one the machine did not finish failed for `reason`.
    """
    cancelled = cancel_marker(store, target.name, job_id).exists()
    remote = collect(machine, target, store, job_id)
    record = store.get(job_id)
    if remote is not None:
        merge(record, remote)
    if cancelled:
        record.status = "cancelled"
    elif remote is None or not remote.finished:
        record.status, record.error = "failed", reason
    record.finished_at, record.pid = record.finished_at or now_iso(), None
    return store.save(record)


def collect(machine: Machine, target: ResolvedTarget, store: JobStore, job_id: str) -> JobRecord | None:
    """Copy the job's adapter folder (into output_dir) and record back; the machine's record, if readable."""
    assert isinstance(target.config, OpenSourceConfig)
    workspace = staging(store, target.name, job_id)
    adapter = f"{OUTPUT_DIR}/{safe_name(job_id)}/"
    record_file = record_path(target.name, job_id)
    files = [p for p, fp in machine.listing(workspace).items() if fp != "other"]
    wanted = [p for p in files if p.startswith(adapter) and p[len(adapter) :].split("/")[0] not in KEPT_THERE]
    machine.fetch(workspace, wanted + ([record_file] if record_file in files else []))
    move_adapter(
        workspace / OUTPUT_DIR / safe_name(job_id), Path(target.config.output_dir) / safe_name(job_id)
    )
    return remote_record(workspace / record_file, job_id)


def move_adapter(source: Path, destination: Path) -> None:
    """Move the copied-back adapter folder to the target's output_dir (merged into one already there)."""
    if not source.is_dir():
        return
    destination.parent.mkdir(parents=True, exist_ok=True)
    if destination.exists():
        shutil.copytree(source, destination, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(source)
    else:
        shutil.move(source, destination)


def remote_record(path: Path, job_id: str) -> JobRecord | None:
    """The record the machine's worker wrote (untrusted: None when missing, unreadable or another job's)."""
    try:
        record = read_record(path)
    except (OSError, ValueError, RecursionError):
        return None
    return record if record.id == job_id else None


def merge(local: JobRecord, remote: JobRecord) -> None:
    """The machine's progress and outcome into the local record, which keeps its identity and paths."""
    for name in REMOTE_FIELDS:
        setattr(local, name, getattr(remote, name))
    local.remote_pid = remote.pid or worker_pid(remote.metrics) or local.remote_pid


def worker_pid(metrics: dict[str, Any]) -> int | None:
    """The worker's process id the machine's record kept in its metrics (a positive int, or None)."""
    value = metrics.get("worker_pid")
    valid = isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31
    return value if valid else None


# --------------------------------------------------------------------------- status and cancel


def unreachable(record: JobRecord, exc: MachineError) -> BackendError:
    """The error of `status`/`cancel` when the job's machine cannot be reached."""
    return BackendError(
        f"job {record.id} runs on machine {record.machine!r}, which cannot be reached ({exc}); "
        f"its last known state is {record.status}"
    )


def refresh(
    record: JobRecord, target: ResolvedTarget, execution: RemoteExecution, store: JobStore
) -> JobRecord:
    """The record refreshed from the machine's; once the job ended there and no process here drives it any
    more, its adapter is copied back too."""
    assert record.machine is not None
    machine = open_machine(execution, record.machine)
    workspace = staging(store, record.target, record.id)
    try:
        remote = fetch_record(machine, workspace, record)
        if remote is not None and remote.finished and not pid_alive(record.pid or 0):
            remote = collect(machine, target, store, record.id)
            record = store.get(record.id)
            record.pid = None
    except MachineError as exc:
        raise unreachable(record, exc) from exc
    finally:
        machine.cleanup()
    if remote is not None and not cancel_marker(store, record.target, record.id).exists():
        merge(record, remote)
        store.save(record)
    return record


def fetch_record(machine: Machine, workspace: Path, record: JobRecord) -> JobRecord | None:
    """Copy the machine's record of the job back and read it."""
    path = record_path(record.target, record.id)
    machine.fetch(workspace, [path])
    return remote_record(workspace / path, record.id)


def cancel_on_machine(record: JobRecord, execution: RemoteExecution, store: JobStore) -> JobRecord:
    """Record the job cancelled, then kill its process scope on the machine (checked gone there)."""
    assert record.machine is not None
    machine = open_machine(execution, record.machine)
    workspace = staging(store, record.target, record.id)
    try:
        if record.status == "running":
            machine.listing(workspace)  # reachable: only then is the job recorded as cancelled
        marker = cancel_marker(store, record.target, record.id)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(now_iso(), encoding="utf-8")
        record.status, record.finished_at, record.pid = "cancelled", now_iso(), None
        store.save(record)
        if record.remote_dir is not None:
            machine.stop(workspace)
    except MachineError as exc:
        raise unreachable(record, exc) from exc
    finally:
        machine.cleanup()
    return record
