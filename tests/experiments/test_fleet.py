"""Several machines in one run (experiments/fleet.py): the total handed out, the best shared, results
judged again when recorded, a failing machine dropped while the others finish, and resume."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from multiagenttrainer.agents.base import AgentOutcome, AgentRequest
from multiagenttrainer.config import AutoresearchConfig, MachineConfig, TrainingConfig
from multiagenttrainer.errors import MachineError
from multiagenttrainer.experiments.fleet import Fleet, FleetFailed
from multiagenttrainer.experiments.loop import record
from multiagenttrainer.experiments.results import read_results
from multiagenttrainer.experiments.run_state import RunState, load_run
from multiagenttrainer.experiments.runner import Runner, run_loop
from multiagenttrainer.history import ExperimentResult
from multiagenttrainer.report import render_report_markdown
from multiagenttrainer.workspace import gitops
from tests.support.experiments import REPO_ROOT, edit_train, install_train_py

RESULTS_HEADER = ["commit", "val_bpb", "memory_gb", "status", "description"]


def constant(workspace: Path, name: str) -> str:
    match = re.search(rf"^{name} = (\S+)", (workspace / "train.py").read_text(), re.MULTILINE)
    assert match, name
    return match.group(1)


class MachineAgent:
    """On the machine whose work tree ends in `-slow`: a first experiment that finds the best value
    (LEARNING_RATE 0.001) only once the other machine has taken three turns, then worse ones. Elsewhere:
    steadily better values that never reach it. Records what each experiment started from."""

    name = "machine-agent"

    def __init__(self, late_find_after: int = 3) -> None:
        self.late_find_after = late_find_after  # the other machine's turns the find waits for
        self.lock = threading.Lock()
        self.fast_values = iter(f"{0.004 - 0.0001 * i:.4f}" for i in range(1, 100))
        self.slow_turns = 0
        self.seen: list[dict[str, str]] = []

    def wait_for_fast_turns(self, turns: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if sum(1 for seen in self.seen if seen["machine"] != "slow") >= turns:
                    return
            time.sleep(0.05)

    def propose(self, request: AgentRequest) -> AgentOutcome:
        workspace = request.workspace
        machine = workspace.name.removeprefix("workspace-")
        with self.lock:
            self.seen.append(
                {
                    "machine": machine,
                    "id": str(request.experiment_id),
                    "start_lr": constant(workspace, "LEARNING_RATE"),
                    "head": gitops.head_sha(workspace),
                }
            )
            if machine == "slow":
                self.slow_turns += 1
                first = self.slow_turns == 1
                value = "0.001" if first else "0.009"
            else:
                first, value = False, next(self.fast_values)
        if first:  # the find comes late: the fast machine has moved on from the baseline by then
            self.wait_for_fast_turns(self.late_find_after)
        edit_train(workspace, LEARNING_RATE=value, SLEEP_S="0.2")
        return AgentOutcome(f"LEARNING_RATE -> {value}", log=f"{machine}: {value}\n")


def local_machines(*names: str) -> list[MachineConfig]:
    return [MachineConfig(name=name) for name in names]


def fleet_runner(
    tmp_path: Path, corpus: Path, machines: list[MachineConfig], **training: object
) -> tuple[Runner, object]:
    runner = Runner(
        AutoresearchConfig(train_time=60),
        TrainingConfig(max_experiments=int(training.pop("max_experiments", 8)), **training),  # type: ignore[arg-type]
        "fleet",
        output_dir=tmp_path / "runs",
        machines=machines,
    )
    workspace = runner.setup_workspace(corpus)
    install_train_py(workspace)
    return runner, workspace


def test_two_machines_share_the_best_and_split_the_total(tmp_path: Path, tiny_corpus_dir: Path) -> None:
    agent = MachineAgent()
    runner, workspace = fleet_runner(
        tmp_path, tiny_corpus_dir, local_machines("slow", "fast"), max_experiments=9
    )
    runner.agent = agent
    results = asyncio.run(runner.run_experiments(workspace))  # type: ignore[arg-type]

    assert runner.run_dir is not None
    state = load_run(runner.run_dir)
    assert state.status == "completed" and state.done == 9
    assert sorted(r.experiment_id for r in results) == list(range(9))
    header, *rows = (runner.run_dir / "results.tsv").read_text().splitlines()
    assert header.split("\t") == RESULTS_HEADER and len(rows) == 9
    assert all(len(row.split("\t")) == 5 for row in rows)
    assert {r.machine for r in state.experiments} == {"slow", "fast"}
    assert [(m.name, m.status) for m in state.machines] == [("slow", "active"), ("fast", "active")]

    slow_find = next(r for r in state.experiments if r.machine == "slow" and "0.001" in r.description)
    assert state.best is not None and state.best.experiment_id == slow_find.experiment_id
    # the fast machine went on from the slow machine's kept commit, not from its own work
    later_fast = [s for s in agent.seen if s["machine"] == "fast" and s["head"] == slow_find.commit]
    assert later_fast and all(s["start_lr"] == "0.001" for s in later_fast)
    # every experiment started from the best kept at the time: the baseline or a kept commit
    kept = {r.commit for r in state.experiments if r.status == "keep"} | {workspace.baseline_commit}
    assert {s["head"] for s in agent.seen} <= kept
    # the hub (the run's workspace) holds every kept commit, so a resume can put any of them back
    for commit in kept:
        assert gitops.resolve_commit(workspace.path, commit) == commit
    report = render_report_markdown(state)
    assert "## Machines" in report and "| slow |" in report and "| fast |" in report


def test_a_keep_is_judged_again_against_the_best_kept_meanwhile(
    tmp_path: Path, tiny_corpus_dir: Path
) -> None:
    runner, workspace = fleet_runner(tmp_path, tiny_corpus_dir, local_machines("a"), max_experiments=3)
    loop = runner.begin(workspace)
    runner.step(loop)  # the baseline
    better = ExperimentResult(1, workspace.baseline_commit, 2.0, 1.0, "keep", "found elsewhere", machine="b")
    record(loop, better)
    edit_train(workspace.path, LEARNING_RATE="0.002")
    commit = gitops.commit_paths(workspace.path, "LEARNING_RATE -> 0.002", ["train.py"])
    late = ExperimentResult(2, commit, 2.1, 1.0, "keep", "LEARNING_RATE -> 0.002", machine="a")
    record(loop, late)
    assert late.status == "discard"
    assert any("not experiment 1 (2.000000, kept on b meanwhile)" in note for note in late.notes)
    assert [row.status for row in read_results(loop.results_path)][-1] == "discard"


def test_a_failing_machine_is_dropped_and_the_others_finish(tmp_path: Path, tiny_corpus_dir: Path) -> None:
    unreachable = MachineConfig.model_validate(
        {
            "name": "gone",
            "execution": {"type": "ssh", "ssh_host": "mat@127.0.0.1", "ssh_port": 1, "remote_dir": "/tmp/x"},
        }
    )
    machines = [unreachable, *local_machines("here")]
    runner, workspace = fleet_runner(
        tmp_path, tiny_corpus_dir, machines, max_experiments=4, max_machine_failures=2
    )
    runner.agent = MachineAgent()
    asyncio.run(runner.run_experiments(workspace))  # type: ignore[arg-type]
    assert runner.run_dir is not None
    state = load_run(runner.run_dir)
    assert state.status == "completed" and state.done == 4
    assert {r.machine for r in state.experiments} == {"here"}
    gone = state.machines[0]
    assert gone.name == "gone" and gone.status == "dropped" and gone.consecutive_failures == 2
    assert gone.reason and "127.0.0.1" in gone.reason
    assert "gone" in render_report_markdown(state) and "dropped" in render_report_markdown(state)


class LostAfterTheOthersEnd(MachineAgent):
    """On machine `far`: its first experiment after the baseline is held until the other machine has
    recorded every other experiment and ended its batch, then the machine goes away (MachineError)."""

    def __init__(self, run_dirs: Path, total: int) -> None:
        super().__init__(late_find_after=0)
        self.run_dirs, self.total = run_dirs, total

    def others_ended(self) -> bool:
        rows = [row for tsv in self.run_dirs.glob("*/results.tsv") for row in read_results(tsv)]
        return len(rows) == self.total - 1 and not any(
            thread.name == "mat-machine-here" for thread in threading.enumerate()
        )

    def propose(self, request: AgentRequest) -> AgentOutcome:
        if request.workspace.name != "workspace-far":
            return super().propose(request)
        deadline = time.monotonic() + 120
        while not self.others_ended() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise MachineError("lost the connection to far")


def test_an_experiment_lost_with_its_machine_after_the_others_ended_is_run_by_them(
    tmp_path: Path, tiny_corpus_dir: Path
) -> None:
    runner, workspace = fleet_runner(
        tmp_path, tiny_corpus_dir, local_machines("far", "here"), max_experiments=4, max_machine_failures=1
    )
    runner.agent = LostAfterTheOthersEnd(tmp_path / "runs", total=4)
    results = asyncio.run(runner.run_experiments(workspace))  # type: ignore[arg-type]
    assert runner.run_dir is not None
    state = load_run(runner.run_dir)
    assert state.status == "completed" and state.done == 4 and state.current == []
    assert sorted(r.experiment_id for r in results) == [0, 1, 2, 3]
    assert [r.machine for r in state.experiments].count("here") == 3  # the lost one included
    far = state.machines[0]
    assert far.name == "far" and far.status == "dropped" and far.reason == "lost the connection to far"


def test_every_machine_dropped_fails_the_run_with_the_reasons(tmp_path: Path, tiny_corpus_dir: Path) -> None:
    unreachable = MachineConfig.model_validate(
        {"name": "gone", "execution": {"type": "ssh", "ssh_host": "127.0.0.1", "ssh_port": 1}}
    )
    runner, workspace = fleet_runner(
        tmp_path, tiny_corpus_dir, [unreachable], max_experiments=2, max_machine_failures=1
    )
    with pytest.raises(FleetFailed, match=r"every machine was dropped .* gone \(.*--resume"):
        asyncio.run(runner.run_experiments(workspace))  # type: ignore[arg-type]
    assert runner.run_dir is not None and load_run(runner.run_dir).status == "failed"


def test_resume_reopens_every_machine_and_completes(tmp_path: Path, tiny_corpus_dir: Path) -> None:
    runner, workspace = fleet_runner(
        tmp_path, tiny_corpus_dir, local_machines("slow", "fast"), max_experiments=3
    )
    runner.agent = MachineAgent(late_find_after=0)  # 3 experiments: the fast machine never takes 3 turns
    asyncio.run(runner.run_experiments(workspace))  # type: ignore[arg-type]
    assert runner.run_id is not None
    resumed, hub = Runner.resume(runner.run_id, tmp_path / "runs", agent=MachineAgent(late_find_after=0))
    assert [m.name for m in resumed.machines] == ["slow", "fast"]
    results = asyncio.run(resumed.run_experiments(hub, max_experiments=6))
    assert len(results) == 6 and sorted(r.experiment_id for r in results) == list(range(6))
    assert resumed.run_dir is not None
    assert len(read_results(resumed.run_dir / "results.tsv")) == 6
    best = load_run(resumed.run_dir).best
    assert best is not None and gitops.head_sha(hub.path) == best.commit


# ---------------------------------------------------------------- machine batches in separate processes


def batch_main(output_dir: str, run_id: str, machine: str) -> None:
    """A worker's side of a run (what the `experiments-on-machine` flow does): one machine's batch."""
    from multiagenttrainer.training import PlainTrainSteps, run_machine_batch

    agent = MachineAgent(late_find_after=0)  # a process of its own: it never sees the other machine's turns
    run_machine_batch(run_id, Path(output_dir), machine, PlainTrainSteps(), agent=agent)


def batches_in_processes(fleet: Fleet, step: object) -> None:
    """Each active machine's batch in its own `python -c` process, as workers would run them."""
    output_dir, run_id = str(fleet.run_dir.parent), fleet.state.run_id
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from tests.experiments.test_fleet import batch_main; "
                f"batch_main({output_dir!r}, {run_id!r}, {loop.machine!r})",
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        for loop in fleet.active()
    ]
    assert [child.wait(timeout=300) for child in children] == [0] * len(children)


def test_machine_batches_in_separate_processes_share_one_run(tmp_path: Path, tiny_corpus_dir: Path) -> None:
    runner, workspace = fleet_runner(
        tmp_path, tiny_corpus_dir, local_machines("slow", "fast"), max_experiments=8
    )
    runner.agent = MachineAgent()
    runner.shared_with_processes = True
    fleet = runner.begin_fleet(workspace)
    run_loop(runner, fleet, runner.run_step, batches_in_processes)
    assert runner.run_dir is not None
    state = load_run(runner.run_dir)
    assert state.status == "completed" and state.current == []
    assert sorted(r.experiment_id for r in state.experiments) == list(range(8))
    assert {r.machine for r in state.experiments} == {"slow", "fast"}
    rows = read_results(runner.run_dir / "results.tsv")
    assert len(rows) == 8 and [r.commit[:7] for r in rows] == [r.commit[:7] for r in state.experiments]
    best = state.best
    assert best is not None and gitops.head_sha(workspace.path) == best.commit  # the hub holds the best


def test_a_batch_run_again_after_its_run_failed_short_completes_the_run(
    tmp_path: Path, tiny_corpus_dir: Path
) -> None:
    runner, workspace = fleet_runner(
        tmp_path, tiny_corpus_dir, local_machines("slow", "fast"), max_experiments=3
    )
    runner.agent = MachineAgent()
    runner.shared_with_processes = True
    fleet = runner.begin_fleet(workspace)
    with pytest.raises(FleetFailed, match="ended with 1 of 3 experiments"):
        run_loop(runner, fleet, runner.run_step, lambda fleet, step: None)  # the machines' batches all failed
    assert runner.run_dir is not None and load_run(runner.run_dir).status == "failed"
    # a batch retried from the UI: the experiments-on-machine flow run of one machine, run again
    retried = subprocess.run(
        [sys.executable, "-c", "from tests.experiments.test_fleet import batch_main; "
         f"batch_main({str(runner.run_dir.parent)!r}, {runner.run_dir.name!r}, 'fast')"],
        cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300, check=False,
    )  # fmt: skip
    assert retried.returncode == 0
    state = load_run(runner.run_dir)
    assert state.status == "completed" and state.error is None and state.done == 3
    assert "- Status: completed" in (runner.run_dir / "report.md").read_text()


def test_a_link_planted_as_the_run_lock_is_a_clear_error(tmp_path: Path) -> None:
    from multiagenttrainer.experiments.run_state import LOCK_FILE, RunLock, RunStateError

    state = RunState("r", "r", "running", 1, "t", "t")
    state.save(tmp_path)
    (tmp_path / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    lock = RunLock(tmp_path, state, across_processes=True)
    with (
        pytest.raises(RunStateError, match=r"\.run\.lock: cannot be opened as the run's lock .*; remove it"),
        lock,
    ):
        pass
    assert not (tmp_path / "elsewhere").exists()
