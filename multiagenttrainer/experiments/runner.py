"""The experiments of a training run, written once: set a workspace up, run experiments, resume after a kill.

    runner = Runner(cfg.autoresearch, cfg.training, name="nightly")
    workspace = runner.setup_workspace("corpus/corpus.txt")
    results = await runner.run_experiments(workspace)      # [ExperimentResult(experiment_id, val_bpb, ...)]

    runner, workspace = Runner.resume("20250101-020000-nightly", "./runs")
    results = await runner.run_experiments(workspace)      # continues after the last recorded experiment

`run_loop` is the one driver of a run's experiments (the library API above and the Prefect flow both use
it; the flow passes a step that runs each experiment as a task):

    loop = runner.begin(workspace)
    run_loop(runner, loop, step)      # step(loop, experiment_id) runs and records one experiment;
                                      # the run is ended in run.json (completed, interrupted, failed)

A run lives in `<output_dir>/<run_id>/` (layout in run_state.py). Resuming trusts results.tsv: its rows
are the finished experiments, run.json is brought in line with them, and the workspace is reset to the
best kept commit, so no finished experiment is lost or run twice. Before any git command on resume, mat's
git config is put back (a killed run may have left an agent's behind), and the evaluator's record is
checked and restored (experiments/guard.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import FrameType

from pydantic import ValidationError

from multiagenttrainer.agents.base import Agent
from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import AutoresearchConfig, GithubConfig, MachineConfig, TrainingConfig
from multiagenttrainer.errors import DiskFullError, ExperimentError, disk_full_error, is_disk_full
from multiagenttrainer.execution.base import Executor
from multiagenttrainer.experiments.fleet import (
    Batches,
    Fleet,
    SharedBest,
    ensure_machine_tree,
    machine_records,
    revive_dropped,
    run_fleet_experiments,
    run_in_threads,
    run_machine,
    training_for,
)
from multiagenttrainer.experiments.guard import Guard
from multiagenttrainer.experiments.loop import (
    Loop,
    LoopOptions,
    ProposalHook,
    ResultHook,
    RunInterrupted,
    check_stop,
    run_experiment,
)
from multiagenttrainer.experiments.results import (
    RESULTS_FILE,
    ResultRow,
    ResultsTableError,
    link_results,
    read_ledger,
    rewrite_results,
)
from multiagenttrainer.experiments.run_state import (
    RUN_FILE,
    CurrentExperiment,
    RunLock,
    RunState,
    RunStateError,
    RunStatus,
    load_run,
)
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.processes import pid_alive, stop_orphaned_scopes, terminate_processes_in
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.evaluator import load_evaluator
from multiagenttrainer.workspace.setup import Workspace, clone_credentials, reopen_workspace, setup_workspace

log = logging.getLogger(__name__)

DEFAULT_NAME = "run"
STOP_WAIT_S = 30.0  # how long an interrupted run waits for its worker thread to wind down
STOP_GRACE_S = 5.0  # between SIGTERM and SIGKILL for agents left working in the workspace
RECOVERED_NOTE = "recovered from results.tsv after an interrupted run"


# ---------------------------------------------------------------- run directories


def slugify(name: str) -> str:
    """A run name reduced to characters safe in a directory and a git branch name."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")
    return re.sub(r"\.{2,}", ".", slug).removesuffix(".lock") or DEFAULT_NAME


def claim_run_dir(output_dir: Path, name: str, now: datetime | None = None) -> Path:
    """Create `<output_dir>/<YYYYmmdd-HHMMSS>-<name>`, adding -2, -3, ... when that is taken."""
    output_dir.mkdir(parents=True, exist_ok=True)
    base = f"{(now or datetime.now()).strftime('%Y%m%d-%H%M%S')}-{slugify(name)}"
    for attempt in range(1, 1000):
        candidate = output_dir / (base if attempt == 1 else f"{base}-{attempt}")
        try:
            candidate.mkdir()  # atomic: two runners never get the same directory
        except FileExistsError:
            continue
        return candidate
    raise ExperimentError(f"could not create a run directory for {name!r} under {output_dir}")


def config_snapshot(
    autoresearch: AutoresearchConfig, training: TrainingConfig, machines: Sequence[MachineConfig] = ()
) -> dict[str, object]:
    """The config sections a run depends on, as stored in run.json (and read back by resume)."""
    snapshot: dict[str, object] = {
        "autoresearch": autoresearch.model_dump(mode="json"),
        "training": training.model_dump(mode="json"),
    }
    if machines:
        snapshot["machines"] = [machine.model_dump(mode="json") for machine in machines]
    return snapshot


def find_run_dir(run_id: str, output_dir: Path) -> Path:
    """The directory of a run, given its id (under output_dir) or its path."""
    for candidate in (output_dir / run_id, Path(run_id)):
        if (candidate / RUN_FILE).is_file():
            return candidate.absolute()
    raise ExperimentError(f"no run {run_id!r} under {output_dir}; `mat status` lists the runs there")


# ---------------------------------------------------------------- resume: results.tsv is the truth


def recovered_result(workspace: Path, experiment_id: int, row: ResultRow) -> ExperimentResult:
    """An ExperimentResult rebuilt from a results.tsv row that run.json missed."""
    return ExperimentResult(
        experiment_id=experiment_id,
        commit=gitops.resolve_commit(workspace, row.commit) or row.commit,
        val_bpb=row.val_bpb,
        memory_gb=row.memory_gb,
        status=row.status,
        description=row.description,
        notes=[RECOVERED_NOTE],
    )


def reconcile_experiments(state: RunState, rows: list[ResultRow], workspace: Path) -> list[str]:
    """Make run.json's experiments match results.tsv row by row; return what changed, for the log.

    results.tsv is written first, so its rows are the truth where both have a row; experiments that
    run.json knows beyond the last row (the table lost them) are kept, never dropped.
    """
    changes: list[str] = []
    kept: list[ExperimentResult] = []
    for index, row in enumerate(rows):
        known = state.experiments[index] if index < len(state.experiments) else None
        if known is not None and known.commit[:7] == row.commit[:7] and known.status == row.status:
            kept.append(known)
        else:
            kept.append(recovered_result(workspace, index, row))
            changes.append(f"experiment {index} taken from results.tsv")
    lost = state.experiments[len(rows) :]
    if lost:
        changes.append(f"{len(lost)} experiments missing from results.tsv restored from run.json")
    state.experiments = kept + lost
    return changes


def reset_to_best(state: RunState, workspace: Workspace, guard: Guard) -> str:
    """Put the workspace branch on the best kept commit (the baseline commit if none), clean, with the
    evaluator as recorded."""
    best = state.best
    target = best.commit if best else workspace.baseline_commit
    if gitops.resolve_commit(workspace.path, target) is None:
        raise ExperimentError(
            f"commit {target[:7]} of run {state.run_id} is missing from {workspace.path}; it cannot resume"
        )
    for undone in guard.clean(target):
        log.info("resume %s: reverted %s (%s)", state.run_id, undone.path, undone.change)
    return target


def reconcile_run(run_dir: Path, state: RunState, workspace: Workspace) -> None:
    """Bring a killed run back to a consistent state: results.tsv, run.json and the workspace agree."""
    evaluator = load_evaluator(run_dir)
    evaluator.check_copies()
    guard = Guard(workspace, evaluator)
    for undone in guard.secure_git():  # before any git command reads what the last agent left
        log.info("resume %s: put back mat's %s", state.run_id, undone.path)
    table = run_dir / RESULTS_FILE
    try:
        rows = read_ledger(table)  # also cuts a torn last row
    except ResultsTableError as exc:
        raise ResultsTableError(
            f"{exc} (run {state.run_id}: run.json holds {state.done} experiments). Move the damaged file "
            f"aside (mv {table} {table}.damaged) and resume again: mat writes the table back from run.json"
        ) from None
    changes = reconcile_experiments(state, rows, workspace.path)
    for change in changes:
        log.info("resume %s: %s", state.run_id, change)
    if len(state.experiments) > len(rows):
        rewrite_results(table, list(state.experiments))
    link_results(run_dir, workspace.path)
    target = reset_to_best(state, workspace, guard)
    state.current = []
    log.info("resume %s: %d experiments done, workspace at %s", state.run_id, state.done, target[:7])


def recorded_config(
    run_dir: Path, state: RunState
) -> tuple[AutoresearchConfig, TrainingConfig, list[MachineConfig]]:
    """The config sections a run recorded in run.json, validated again."""
    try:
        return (
            AutoresearchConfig.model_validate(state.config.get("autoresearch", {})),
            TrainingConfig.model_validate(state.config.get("training", {})),
            [MachineConfig.model_validate(machine) for machine in state.config.get("machines", [])],
        )
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise RunStateError(
            f"{run_dir / RUN_FILE}: its config record is damaged ({where}: {problem['msg']}); "
            "the run cannot be resumed, start a new one with `mat train`"
        ) from None


def still_running(state: RunState) -> bool:
    """Whether another live process on this host owns the run."""
    return (
        state.status == "running"
        and state.host == socket.gethostname()
        and state.pid != os.getpid()
        and pid_alive(state.pid)
    )


# ---------------------------------------------------------------- interrupts


def stop_processes(executor: Executor, workspace: Path) -> None:
    """Kill whatever this run started: training on its target (through the executor), agents (they run on
    this machine) still working in the workspace, and what a killed mat left in its process scopes."""
    executor.stop(workspace)
    terminate_processes_in(workspace, STOP_GRACE_S)
    stop_orphaned_scopes()


Targets = list[tuple[Executor, Path]]  # each machine's executor and work tree
_active_runs: dict[int, tuple[threading.Event, Targets]] = {}  # id -> (stop flag, what it runs)
_active_lock = threading.Lock()
_previous_handler: list[object] = []  # the SIGTERM handler to restore when the last run ends


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Stop every run of this process and kill what they are running; the loops then raise RunInterrupted."""
    with _active_lock:
        runs = list(_active_runs.values())
    for stop, _ in runs:
        stop.set()
    for _, targets in runs:
        for executor, workspace in targets:
            stop_processes(executor, workspace)


@contextlib.contextmanager
def sigterm_stops(stop: threading.Event, targets: Targets) -> Iterator[None]:
    """While the block runs, SIGTERM stops this run and kills its processes.

    One handler serves every run of the process (several Runners may run at once); it is installed when
    the first run starts and the previous handler is put back when the last one ends. Signal handlers
    can only be set from the main thread, so elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    key = id(stop)
    with _active_lock:
        if not _active_runs:
            _previous_handler[:] = [signal.signal(signal.SIGTERM, on_sigterm)]
        _active_runs[key] = (stop, targets)
    try:
        yield
    finally:
        with _active_lock:
            del _active_runs[key]
            if not _active_runs and _previous_handler:
                signal.signal(signal.SIGTERM, _previous_handler.pop())  # type: ignore[arg-type]


# ---------------------------------------------------------------- the Runner


def describe_error(error: BaseException) -> str:
    """`Type: message` for run.json's error field."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def as_hooks(on_result: ResultHook | Sequence[ResultHook] | None) -> list[ResultHook]:
    """One callback, several, or none, as a list."""
    if on_result is None:
        return []
    return [on_result] if callable(on_result) else list(on_result)


class Runner:
    """Sets up one training run and runs its experiments; see the module docstring."""

    def __init__(
        self,
        autoresearch_cfg: AutoresearchConfig,
        training_cfg: TrainingConfig,
        name: str | None = None,
        *,
        output_dir: str | Path | None = None,
        agent: Agent | None = None,
        executor: Executor | None = None,
        on_result: ResultHook | Sequence[ResultHook] | None = None,
        options: LoopOptions | None = None,
        github: GithubConfig | None = None,
        secrets: Mapping[str, str] | None = None,
        machines: Sequence[MachineConfig] = (),
    ) -> None:
        """`github` and `secrets` (the environment by default): GITHUB_TOKEN from `secrets` is sent when
        cloning an autoresearch.repo on the GitHub host, for private forks. `machines`: run on all of
        them at once (experiments/fleet.py); without, on `training.execution`."""
        self.autoresearch = autoresearch_cfg
        self.training = training_cfg
        self.github = github or GithubConfig()
        self.secrets = secrets
        self.name = name or DEFAULT_NAME
        self.output_dir = Path(output_dir if output_dir is not None else training_cfg.output_dir)
        self.agent = agent
        self.executor = executor
        self.hooks = as_hooks(on_result)
        self.proposal_hooks: list[ProposalHook] = []  # told each change before it is trained
        self.options = options or LoopOptions()
        self.machines = list(machines)
        self.resumed = False
        self.shared_with_processes = False  # machine batches run by other processes (flow runs)
        self.run_dir: Path | None = None
        self.state: RunState | None = None

    @property
    def run_id(self) -> str | None:
        """`YYYYmmdd-HHMMSS-<name>` once the run exists."""
        return self.state.run_id if self.state else None

    def _require_run(self) -> tuple[Path, RunState]:
        if self.run_dir is None or self.state is None:
            raise ExperimentError("call setup_workspace() (or Runner.resume) before run_experiments()")
        return self.run_dir, self.state

    def _finish(self, status: RunStatus, error: str | None = None) -> None:
        run_dir, state = self._require_run()
        state.status, state.error, state.current = status, error, []
        state.finished_at = now_iso()
        try:
            state.save(run_dir)
        except OSError as exc:  # a full disk: run.json keeps `running`, which reads as interrupted once
            log.error("could not record how run %s ended: %s", state.run_id, exc)  # this process exits

    def setup_workspace(self, corpus_path: str | Path, env: dict[str, str] | None = None) -> Workspace:
        """Create the run directory and its workspace from a corpus (dir, corpus.txt or corpus.jsonl)."""
        run_dir = claim_run_dir(self.output_dir, self.name).absolute()
        created = now_iso()
        self.run_dir = run_dir
        self.state = RunState(
            run_id=run_dir.name,
            name=self.name,
            status="running",
            max_experiments=self.training.max_experiments,
            created_at=created,
            updated_at=created,
            config=config_snapshot(self.autoresearch, self.training, self.machines),
            current=[CurrentExperiment(0, "setup", created, "local")],
            pid=os.getpid(),
            host=socket.gethostname(),
        )
        self.state.save(run_dir)
        try:
            credentials = clone_credentials(
                self.autoresearch.repo, self.github, os.environ if self.secrets is None else self.secrets
            )
            workspace = setup_workspace(
                run_dir,
                Path(corpus_path),
                self.autoresearch,
                run_tag=run_dir.name,
                env=env,
                credentials=credentials,
            )
        except BaseException as exc:
            self._finish("failed", str(exc))
            raise
        link_results(run_dir, workspace.path)
        self.state.workspace = workspace.to_dict()
        self.state.evaluator = load_evaluator(run_dir).summary()
        self.state.current = []
        self.state.save(run_dir)
        return workspace

    def _make_loop(self, workspace: Workspace, max_experiments: int, stop: threading.Event) -> Loop:
        run_dir, state = self._require_run()
        agent = self.agent
        if agent is None and max_experiments > max(1, state.done):
            from multiagenttrainer.agents import make_agent

            agent = make_agent(self.training)
        if self.executor is None:
            from multiagenttrainer.execution.registry import make_executor

            self.executor = make_executor(self.training.execution)
        evaluator = load_evaluator(run_dir)
        evaluator.check_copies()
        return Loop(
            run_dir,
            workspace,
            state,
            agent,
            self.executor,
            self.training,
            self.hooks,
            self.options,
            stop,
            evaluator=evaluator,
            proposal_hooks=self.proposal_hooks,
        )

    def _mark_running(self, workspace: Workspace, max_experiments: int | None) -> tuple[Path, RunState]:
        run_dir, state = self._require_run()
        state.max_experiments = max_experiments or state.max_experiments
        state.workspace, state.status = workspace.to_dict(), "running"
        state.pid, state.host, state.finished_at, state.error = os.getpid(), socket.gethostname(), None, None
        state.save(run_dir)
        return run_dir, state

    def begin(self, workspace: Workspace, max_experiments: int | None = None) -> Loop:
        """Mark the run as running in this process and return its loop, ready for `step`.

        `max_experiments` raises (or lowers) the run's bound; without it the run keeps its own.
        """
        run_dir, state = self._mark_running(workspace, max_experiments)
        try:
            loop = self._make_loop(workspace, state.max_experiments, threading.Event())
            loop.executor.prepare(workspace.path)
            link_results(run_dir, workspace.path)
        except BaseException as exc:
            self._finish("failed", describe_error(exc))
            raise
        return loop

    def begin_fleet(self, workspace: Workspace, max_experiments: int | None = None) -> Fleet:
        """Like `begin`, for a run on `machines`: a loop per machine, each on its own work tree."""
        run_dir, state = self._mark_running(workspace, max_experiments)
        try:
            state.machines = machine_records(state, self.machines, run_dir)
            if self.resumed:
                revive_dropped(state)
            fleet = self._make_fleet(run_dir, state, workspace, self.machines)
            if self.resumed:  # a SIGKILLed mat leaves training running on its targets
                for executor, path in fleet.targets():
                    stop_processes(executor, path)
            state.save(run_dir)
        except BaseException as exc:
            self._finish("failed", describe_error(exc))
            raise
        return fleet

    def _make_fleet(
        self, run_dir: Path, state: RunState, hub: Workspace, machines: Sequence[MachineConfig]
    ) -> Fleet:
        """The loops of `machines` (each with its executor, agent and work tree) on the run's shared lock."""
        from multiagenttrainer.execution.registry import make_executor

        lock = RunLock(run_dir, state, across_processes=self.shared_with_processes)
        stop, sharing = threading.Event(), SharedBest(hub)
        records = {record.name: record for record in state.machines}
        loops = []
        for machine in machines:
            training = training_for(self.training, machine)
            executor = make_executor(machine.execution, machine.name)
            agent = self.agent if self.agent is not None else self._agent_for(training, state)
            workspace = ensure_machine_tree(hub, records[machine.name], run_dir)
            loop = Loop(run_dir, workspace, state, agent, executor, training, self.hooks, self.options, stop)
            loop.save_lock, loop.sharing = lock, sharing
            loops.append(loop)
        return Fleet(loops, self.training.max_machine_failures, stop)

    @classmethod
    def open_batch(
        cls,
        run_id: str,
        output_dir: str | Path,
        machine: str,
        *,
        agent: Agent | None = None,
        on_result: ResultHook | Sequence[ResultHook] | None = None,
    ) -> tuple[Runner, Fleet]:
        """One machine's batch of a live multi-machine run, served by another process (a worker running
        the `experiments-on-machine` flow): the run's state is shared through run.json under a file lock.
        """
        run_dir = find_run_dir(run_id, Path(output_dir))
        state = load_run(run_dir)
        autoresearch, training, machines = recorded_config(run_dir, state)
        chosen = [m for m in machines if m.name == machine]
        if not chosen or machine not in {record.name for record in state.machines}:
            names = ", ".join(m.name for m in machines) or "none"
            raise ExperimentError(f"run {state.run_id} has no machine {machine!r} (its machines: {names})")
        runner = cls(
            autoresearch, training, state.name, output_dir=run_dir.parent, agent=agent,
            on_result=on_result, machines=machines,
        )  # fmt: skip
        runner.run_dir, runner.state, runner.shared_with_processes = run_dir, state, True
        hub = reopen_workspace(run_dir, state.workspace)
        return runner, runner._make_fleet(run_dir, state, hub, chosen)

    @staticmethod
    def _agent_for(training: TrainingConfig, state: RunState) -> Agent | None:
        if state.max_experiments <= max(1, state.done):
            return None
        from multiagenttrainer.agents import make_agent

        return make_agent(training)

    @staticmethod
    def has_next(loop: Loop) -> bool:
        """Whether the run holds fewer experiments than its bound."""
        return len(loop.state.experiments) < loop.state.max_experiments

    def step(self, loop: Loop, experiment_id: int | None = None) -> list[ExperimentResult]:
        """Run and record experiment `experiment_id` (the next one by default; the baseline first); []
        once the run is complete. Agent mode may record several experiments in one step. Raises
        RunInterrupted once stopped.
        """
        if not self.has_next(loop):
            return []
        check_stop(loop)
        return run_experiment(loop, len(loop.state.experiments) if experiment_id is None else experiment_id)

    def interrupt(self, loop: Loop | Fleet) -> None:
        """Stop the run: the current step raises RunInterrupted, and whatever it runs is killed (on every
        machine)."""
        loop.stop.set()
        for executor, workspace in targets_of(loop):
            stop_processes(executor, workspace)
        for machine_loop in loop.loops if isinstance(loop, Fleet) else [loop]:
            if machine_loop.scoring_executor not in (None, machine_loop.executor):  # scoring here
                machine_loop.scorer.stop(machine_loop.run_dir)

    def end(self, loop: Loop | Fleet, status: RunStatus, error: str | None = None) -> None:
        """Release the executors and record in run.json how the run ended."""
        try:
            for executor, _ in targets_of(loop):
                with contextlib.suppress(Exception):  # one machine's client must not hide the others'
                    executor.cleanup()
        finally:
            self._finish(status, error)

    def abort(self, loop: Loop | Fleet, error: BaseException) -> None:
        """End the run after `error` escaped a step: interrupted (its processes killed) or failed."""
        if isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)):
            self.interrupt(loop)
            self.end(loop, "interrupted", "interrupted")
        elif isinstance(error, (RunInterrupted, DiskFullError)):  # both can be resumed as they are
            self.end(loop, "interrupted", str(error))
        else:
            self.end(loop, "failed", describe_error(error))

    async def run_experiments(
        self, workspace: Workspace, max_experiments: int | None = None
    ) -> list[ExperimentResult]:
        """Run experiments until the run holds `max_experiments`; return all of the run's results.

        The experiments run in a worker thread; cancelling this coroutine (or Ctrl-C) stops the run:
        what it is running is killed and run.json says `interrupted`.
        """
        loop = (
            self.begin_fleet(workspace, max_experiments)
            if self.machines
            else self.begin(workspace, max_experiments)
        )
        finished = threading.Event()

        def work() -> None:
            try:
                run_loop(self, loop, self.run_step)
            finally:
                finished.set()

        with sigterm_stops(loop.stop, targets_of(loop)):
            try:
                await asyncio.to_thread(work)
            except (asyncio.CancelledError, KeyboardInterrupt):
                self.interrupt(loop)
                if not finished.wait(STOP_WAIT_S):  # the worker ends the run itself once it stops
                    self.end(loop, "interrupted", "interrupted")
                raise
        return list(loop.state.experiments)

    def run_step(self, loop: Loop, experiment_id: int) -> list[ExperimentResult]:
        """The plain step of `run_loop`: run experiment `experiment_id` here."""
        return self.step(loop, experiment_id)

    @classmethod
    def resume(
        cls,
        run_id: str,
        output_dir: str | Path | None = None,
        *,
        agent: Agent | None = None,
        executor: Executor | None = None,
        on_result: ResultHook | Sequence[ResultHook] | None = None,
        options: LoopOptions | None = None,
    ) -> tuple[Runner, Workspace]:
        """Reopen a run after a kill: reconcile results.tsv, run.json and the workspace, ready to continue."""
        run_dir = find_run_dir(
            run_id, Path(output_dir if output_dir is not None else TrainingConfig().output_dir)
        )
        try:
            state = load_run(run_dir)
        except RunStateError as exc:
            raise RunStateError(
                f"{exc}. Run {run_id} cannot be resumed without its state: restore run.json, or start a new "
                f"run with `mat train` (the results so far stay in {run_dir / RESULTS_FILE})"
            ) from None
        if still_running(state):
            raise ExperimentError(f"run {state.run_id} is still running (pid {state.pid}); stop it first")
        if not state.workspace:
            raise ExperimentError(f"run {state.run_id} never finished its set-up; start a new run instead")
        autoresearch, training, machines = recorded_config(run_dir, state)
        runner = cls(
            autoresearch,
            training,
            state.name,
            output_dir=run_dir.parent,
            agent=agent,
            executor=executor,
            on_result=on_result,
            options=options,
            machines=machines,
        )
        runner.resumed = True
        workspace = reopen_workspace(run_dir, state.workspace)
        if executor is None:
            from multiagenttrainer.execution.registry import make_executor

            runner.executor = make_executor(training.execution)
        assert runner.executor is not None
        stop_processes(runner.executor, workspace.path)  # a SIGKILLed mat leaves its training running
        reconcile_run(run_dir, state, workspace)
        state.status, state.pid, state.host = "running", os.getpid(), socket.gethostname()
        state.finished_at, state.error = None, None
        state.save(run_dir)
        runner.run_dir, runner.state = run_dir, state
        return runner, workspace


# ---------------------------------------------------------------- the driver

Step = Callable[[Loop, int], object]


def targets_of(loop: Loop | Fleet) -> Targets:
    """What a run's loop (one machine) or fleet (several) runs on: (executor, work tree) pairs."""
    return loop.targets() if isinstance(loop, Fleet) else [(loop.executor, loop.workspace.path)]


def run_loop(runner: Runner, loop: Loop | Fleet, step: Step, batches: Batches = run_in_threads) -> None:
    """Run the run's remaining experiments, one `step(loop, experiment_id)` each: in order on one
    machine, or on every machine of a fleet at once (experiments/fleet.py).

    The run is ended in run.json whatever happens: completed, interrupted (Ctrl-C, SIGTERM, stop) or
    failed; the exception that ended it is raised again.
    """
    try:
        if isinstance(loop, Fleet):
            run_fleet_experiments(loop, step, batches)
            if loop.stop.is_set():
                raise RunInterrupted(f"run {loop.state.run_id} was interrupted; {resume_hint(loop)}")
        else:
            while runner.has_next(loop):
                check_stop(loop)
                step(loop, len(loop.state.experiments))
    except OSError as exc:
        if not is_disk_full(exc):
            runner.abort(loop, exc)
            raise
        full = disk_full_error(exc, runner_dir(loop), space_for_an_experiment(loop), resume_hint(loop))
        runner.abort(loop, full)
        raise full from None
    except BaseException as exc:
        runner.abort(loop, exc)
        raise
    runner.end(loop, "completed")


def resume_hint(loop: Loop | Fleet) -> str:
    return f"`mat train --resume {loop.state.run_id}`"


def space_for_an_experiment(loop: Loop | Fleet) -> int:
    """Twice what the largest experiment so far wrote to its logs (a floor applies in disk_full_error)."""
    logs = runner_dir(loop) / "logs"
    sizes = [path.stat().st_size for path in logs.glob("exp-*")] if logs.is_dir() else []
    return 2 * max(sizes, default=0)


def runner_dir(loop: Loop | Fleet) -> Path:
    return loop.loops[0].run_dir if isinstance(loop, Fleet) else loop.run_dir


def drive(
    runner: Runner,
    workspace: Workspace,
    max_experiments: int | None,
    step: Step,
    batches: Batches = run_in_threads,
) -> None:
    """Begin the run and run its experiments with `step` (on every machine when the run has several);
    SIGTERM stops it cleanly."""
    loop = (
        runner.begin_fleet(workspace, max_experiments)
        if runner.machines
        else runner.begin(workspace, max_experiments)
    )
    with sigterm_stops(loop.stop, targets_of(loop)):
        run_loop(runner, loop, step, batches)


def run_batch(fleet: Fleet, step: Step) -> None:
    """Run one machine's batch (Runner.open_batch) here until the run holds its total or the machine is
    dropped; Ctrl-C or SIGTERM stops what it runs and gives its claim back. The run itself is ended by
    the process that owns it."""
    try:
        with sigterm_stops(fleet.stop, fleet.targets()):
            for loop in fleet.loops:
                run_machine(fleet, loop, step)
    except BaseException:
        fleet.stop.set()
        for executor, workspace in fleet.targets():
            stop_processes(executor, workspace)
        for loop in fleet.loops:
            fleet.release(loop)
        raise
    finally:
        for executor, _ in fleet.targets():
            with contextlib.suppress(Exception):
                executor.cleanup()
