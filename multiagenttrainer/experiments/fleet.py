"""Several machines, one run: experiments handed out as machines become free, the best shared by all.

With `machines:` in the config, a run has one loop per machine, all on the same run.json and
results.tsv:

    fleet = open_fleet(runner, workspace)     # a work tree per machine, its executor and agent
    run_fleet(runner, fleet, step)            # the baseline first, then every machine at once

- The baseline (experiment 0) runs first, on the first machine that can run it; every machine then
  takes the next free experiment id until the run holds `max_experiments` (the run's total).
- Each machine has its own work tree, `<run_dir>/workspace-<machine>`, a copy of the run's workspace:
  its agent edits train.py there and its executor trains from it. The run's workspace itself is the
  hub no agent works in: a kept commit is pushed into it (as refs/mat/kept/<sha>) before its row is
  recorded, and a machine fetches the best commit from it before its next experiment. So every
  machine starts from the best train.py found so far, whichever machine found it.
- A result is judged again when it is recorded: a change that beat the best it started from, but not
  the best another machine kept meanwhile, is a discard (with a note), never merged blindly.
- A machine whose infrastructure fails (MachineError: unreachable, container gone; or a run the target
  could not finish, such as a lost connection) `training.max_machine_failures` times in a row is
  dropped, named in run.json, the report and the log; the other machines finish the run. An
  experiment whose machine failed before it could be recorded goes back to the pool.
- run.json's `machines` says each machine's work tree, status and consecutive failures, so `--resume`
  reopens the same work trees, stops what a killed mat left running on every target, and goes on.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import MachineConfig, TrainingConfig
from multiagenttrainer.errors import ExperimentError, MachineError, is_disk_full
from multiagenttrainer.execution.base import Executor
from multiagenttrainer.experiments.loop import Loop, best_commit
from multiagenttrainer.experiments.results import link_results
from multiagenttrainer.experiments.run_state import CurrentExperiment, MachineRecord, RunLock, RunState
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.setup import Workspace, train_command_for

log = logging.getLogger(__name__)

KEPT_REFS = "refs/mat/kept"
RETRY_WAIT_S = (1.0, 30.0)  # a failing machine waits 1, 2, 4 ... 30 s before its next try
JOIN_WAIT_S = 0.5


class FleetFailed(ExperimentError):
    """Every machine of the run was dropped before the run was complete."""


# ---------------------------------------------------------------- work trees


def machine_dir_name(name: str, taken: set[str]) -> str:
    """`workspace-<machine>` with the name made path-safe (and numbered if two names collide)."""
    from multiagenttrainer.experiments.runner import slugify

    base = f"workspace-{slugify(name)}"
    candidate, number = base, 2
    while candidate in taken:
        candidate, number = f"{base}-{number}", number + 1
    taken.add(candidate)
    return candidate


def copy_workspace(hub: Workspace, target: Path) -> None:
    """A machine's work tree: a copy of the hub (repository, ignored data), links kept as links."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(hub.path, target, symlinks=True)


def machine_workspace(hub: Workspace, path: Path) -> Workspace:
    """The hub's Workspace description, for a machine's work tree."""
    return dataclasses.replace(hub, path=path, train_command=train_command_for(hub.kind, path))


def machine_records(state: RunState, machines: list[MachineConfig], run_dir: Path) -> list[MachineRecord]:
    """run.json's record per configured machine: the recorded ones kept, new ones added."""
    known = {record.name: record for record in state.machines}
    taken = {Path(record.workspace).name for record in state.machines}
    records = []
    for machine in machines:
        record = known.get(machine.name)
        if record is None:
            path = run_dir / machine_dir_name(machine.name, taken)
            record = MachineRecord(machine.name, machine.execution.type, str(path))
        records.append(record)
    return records


def revive_dropped(state: RunState) -> None:
    """On resume, machines dropped earlier are tried again (the user may have fixed them)."""
    for record in state.machines:
        if record.status == "dropped":
            log.info(
                "resume %s: machine %s is tried again (dropped: %s)", state.run_id, record.name, record.reason
            )
            record.status, record.reason, record.consecutive_failures = "active", None, 0


def ensure_machine_tree(hub: Workspace, record: MachineRecord, run_dir: Path) -> Workspace:
    """The machine's work tree, copied from the hub when it does not exist yet (or lost its repository)."""
    path = Path(record.workspace)
    if path.parent != run_dir or not path.name.startswith("workspace-"):
        raise ExperimentError(
            f"{run_dir}/run.json: machine {record.name!r} names a work tree outside the run ({path}); "
            "the file was changed, so the run is not resumed"
        )
    if not (path / ".git").is_dir():
        copy_workspace(hub, path)
    link_results(run_dir, path)
    return machine_workspace(hub, path)


# ---------------------------------------------------------------- the shared best


@dataclass
class SharedBest:
    """Kept commits pass through the hub repository, which no agent works in; its branch is the best."""

    hub: Workspace

    def publish(self, loop: Loop, result: ExperimentResult) -> None:
        """Push a kept commit into the hub and check it out there (called under the record lock, before
        the row is written: a recorded keep is always the best so far)."""
        hub, ref = str(self.hub.path), f"{KEPT_REFS}/{result.commit}"
        push = ("push", "-q", "--no-verify", hub, f"{result.commit}:{ref}")
        gitops.transfer(loop.workspace.path, self.hub.path, loop.guard.evaluator.git_copy, *push)
        gitops.reset_hard(self.hub.path, result.commit, self.hub.branch)

    def base_for(self, loop: Loop) -> str:
        """The best commit so far, fetched from the hub into this machine's repository when missing."""
        commit = best_commit(loop)
        workspace, hub = loop.workspace.path, str(self.hub.path)
        if gitops.resolve_commit(workspace, commit) is None:
            fetch = ("fetch", "-q", "--no-tags", hub, f"{KEPT_REFS}/{commit}")
            gitops.transfer(workspace, self.hub.path, loop.guard.evaluator.git_copy, *fetch)
            if gitops.resolve_commit(workspace, commit) is None:
                raise ExperimentError(f"commit {commit[:7]} could not be fetched from the run's hub {hub}")
        return commit


# ---------------------------------------------------------------- the fleet


@dataclass
class Fleet:
    """The machines of one run (all of them, or the one a worker process serves) and their claims.

    Everything shared lives in the run's state and changes under its lock: the experiments, the claims
    (`state.current`: an experiment id is taken when a machine adds its entry there), and the machine
    records (`state.machines`). So the same code coordinates threads of one process and, with a lock
    across processes, machines served by separate workers.
    """

    loops: list[Loop]
    max_failures: int
    stop: threading.Event
    prepared: set[str] = field(default_factory=set)  # machines whose target holds the work tree

    @property
    def state(self) -> RunState:
        return self.loops[0].state

    @property
    def lock(self) -> RunLock:
        return self.loops[0].lock

    @property
    def run_dir(self) -> Path:
        return self.loops[0].run_dir

    def targets(self) -> list[tuple[Executor, Path]]:
        """Each machine's executor and work tree, for whoever has to stop them."""
        return [(loop.executor, loop.workspace.path) for loop in self.loops]

    def record_of(self, loop: Loop) -> MachineRecord:
        """The machine's record in the run's state (read again under the lock when shared with processes)."""
        return next(record for record in self.state.machines if record.name == loop.machine)

    def is_active(self, loop: Loop) -> bool:
        with self.lock:
            return self.record_of(loop).status == "active"

    def active(self) -> list[Loop]:
        with self.lock:
            return [loop for loop in self.loops if self.record_of(loop).status == "active"]

    def claim(self, loop: Loop) -> int | None:
        """The next experiment id for this machine, or None once the run holds (or runs) its total."""
        with self.lock:
            state = self.state
            if self.stop.is_set() or len(state.experiments) + len(state.current) >= state.max_experiments:
                return None
            used = {result.experiment_id for result in state.experiments} | {
                c.experiment_id for c in state.current
            }
            experiment_id = next(number for number in range(len(used) + 1) if number not in used)
            state.current.append(CurrentExperiment(experiment_id, "setup", now_iso(), loop.machine))
            state.save(self.run_dir)
            return experiment_id

    def release(self, loop: Loop) -> None:
        """Give back what the machine claimed and did not record (its experiment goes back to the pool)."""
        with self.lock:
            before = len(self.state.current)
            self.state.current = [c for c in self.state.current if c.machine != loop.machine]
            if len(self.state.current) != before:
                self.state.save(self.run_dir)

    def succeeded(self, loop: Loop) -> None:
        with self.lock:
            record = self.record_of(loop)
            if record.consecutive_failures:
                record.consecutive_failures = 0
                self.state.save(self.run_dir)

    def failed(self, loop: Loop, reason: str) -> bool:
        """Count an infrastructure failure; True when the machine is dropped."""
        with self.lock:
            record = self.record_of(loop)
            record.consecutive_failures += 1
            count = record.consecutive_failures
            log.warning("machine %s failed (%d in a row): %s", record.name, count, reason)
            if count >= self.max_failures:
                record.status, record.reason = "dropped", reason
                log.error(
                    "machine %s dropped after %d failures in a row: %s; the other machines go on",
                    record.name,
                    count,
                    reason,
                )
            self.state.save(self.run_dir)
            return record.status == "dropped"


def infrastructure_failure(loop: Loop) -> str | None:
    """Why the target could not finish the experiment just recorded (a lost connection), if it could not."""
    outcome = loop.last_outcome
    return outcome.error if outcome is not None and outcome.error else None


# ---------------------------------------------------------------- running it

Step = Callable[[Loop, int], object]


def backoff_s(failures: int) -> float:
    low, high = RETRY_WAIT_S
    return float(min(high, low * 2 ** max(0, failures - 1)))


def prepare(fleet: Fleet, loop: Loop) -> None:
    """Copy the machine's work tree to its target once (again after a failure left it unknown)."""
    if loop.machine in fleet.prepared:
        return
    loop.executor.prepare(loop.workspace.path)
    fleet.prepared.add(loop.machine)


def try_experiment(fleet: Fleet, loop: Loop, experiment_id: int, step: Step) -> bool:
    """Run one experiment on `loop`'s machine; False when the machine failed and should wait or stop."""
    loop.last_outcome = None
    try:
        prepare(fleet, loop)
        step(loop, experiment_id)
    except MachineError as exc:
        fleet.release(loop)
        fleet.prepared.discard(loop.machine)
        fleet.failed(loop, str(exc))
        return False
    except OSError as exc:
        fleet.release(loop)
        if is_disk_full(exc):
            raise
        fleet.failed(loop, f"{type(exc).__name__}: {exc}")
        return False
    fleet.release(loop)  # a step that recorded nothing (the run was complete) leaves no claim behind
    reason = infrastructure_failure(loop)
    if reason is not None:
        fleet.failed(loop, reason)
        return False
    fleet.succeeded(loop)
    return True


def attempt(fleet: Fleet, loop: Loop, experiment_id: int, step: Step) -> None:
    """Run one experiment on the loop's machine; after a machine failure, wait before its next try."""
    if try_experiment(fleet, loop, experiment_id, step) or not fleet.is_active(loop):
        return
    with fleet.lock:
        failures = fleet.record_of(loop).consecutive_failures
    fleet.stop.wait(backoff_s(failures))


def run_machine(fleet: Fleet, loop: Loop, step: Step) -> None:
    """One machine's sequential batch: take the next free experiment until none is left or it is dropped."""
    while fleet.is_active(loop):
        experiment_id = fleet.claim(loop)
        if experiment_id is None:
            return
        attempt(fleet, loop, experiment_id, step)


def run_baseline(fleet: Fleet, step: Step) -> None:
    """Experiment 0 on the first machine that can run it; the others wait for it."""
    while fleet.state.baseline is None and not fleet.stop.is_set():
        candidates = fleet.active()
        if not candidates:
            return
        loop = candidates[0]
        experiment_id = fleet.claim(loop)
        if experiment_id is None:
            return
        attempt(fleet, loop, experiment_id, step)


def run_in_threads(fleet: Fleet, step: Step) -> None:
    """Every active machine's batch in its own thread (each with a copy of the caller's context), until
    all end. The first error other than a machine failure stops every machine and is raised again here.
    """
    errors: list[BaseException] = []

    def work(loop: Loop) -> None:
        try:
            run_machine(fleet, loop, step)
        except BaseException as exc:  # handed to the calling thread
            errors.append(exc)
            fleet.stop.set()

    threads = [
        threading.Thread(
            target=contextvars.copy_context().run,
            args=(work, loop),
            name=f"mat-machine-{loop.machine}",
            daemon=True,
        )
        for loop in fleet.active()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(JOIN_WAIT_S)  # short joins, so Ctrl-C reaches the calling thread
    if errors:
        raise errors[0]


Batches = Callable[[Fleet, Step], None]  # runs every active machine's batch: threads, or flow runs


def run_fleet_experiments(fleet: Fleet, step: Step, batches: Batches = run_in_threads) -> None:
    """The baseline, then every machine's batch at once, in rounds until the run holds its total;
    FleetFailed when every machine was dropped early, or a round recorded nothing.

    A machine ends its batch when every experiment left is claimed, some by other machines; if one of
    those fails, its experiment goes back to the pool after the others ended, so the next round runs it.
    """
    run_baseline(fleet, step)
    recorded = -1
    while fleet.state.baseline is not None and not fleet.stop.is_set():
        with fleet.lock:  # batches run by other processes have written run.json meanwhile
            done = len(fleet.state.experiments)
        if done >= fleet.state.max_experiments or done == recorded or not fleet.active():
            break
        recorded = done
        batches(fleet, step)
    with fleet.lock:
        done, state = len(fleet.state.experiments), fleet.state
        dropped = [
            f"{record.name} ({record.reason})" for record in state.machines if record.status == "dropped"
        ]
        active = [record.name for record in state.machines if record.status == "active"]
    if fleet.stop.is_set() or done >= state.max_experiments:
        return
    if active or not dropped:
        also = f" (dropped: {'; '.join(dropped)})" if dropped else ""
        raise FleetFailed(
            f"the machines' batches ended with {done} of {state.max_experiments} experiments{also}; "
            f"continue with `mat train --resume {state.run_id}`"
        )
    raise FleetFailed(
        f"every machine was dropped after {fleet.max_failures} failures in a row: {'; '.join(dropped)}. "
        f"Fix the machines, then continue with `mat train --resume {state.run_id}`"
    )


def training_for(training: TrainingConfig, machine: MachineConfig) -> TrainingConfig:
    """training: as one machine sees it (its agent_command wins, its execution target)."""
    return training.model_copy(
        update={
            "agent_command": machine.agent_command or training.agent_command,
            "execution": machine.execution,
        }
    )
