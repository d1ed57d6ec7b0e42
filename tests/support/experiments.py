"""Shared by the experiment tests and the `python -c` runs they start: corpora, train.py scripts, agents.

The agents here implement the Agent Protocol for real (they edit files in the workspace); they live in
an importable module so that a separate `python -c` process can use them too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from multiagenttrainer.agents.base import AgentOutcome, AgentRequest
from multiagenttrainer.config import AutoresearchConfig, TrainingConfig
from multiagenttrainer.experiments.loop import LoopOptions
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.workspace import gitops
from multiagenttrainer.workspace.setup import Workspace

REPO_ROOT = Path(__file__).resolve().parents[2]
LIBRARY_DIR = REPO_ROOT / "multiagenttrainer"

# A train.py without torch: val_bpb is a pure function of its constants, so tests know every result.
# Best LEARNING_RATE is 0.001, fewer layers are a little better; SLEEP_S makes a run slow (kill tests),
# EXIT_CODE makes it fail, SPAWN_CHILD starts a child process.
TRIVIAL_TRAIN_PY = '''\
"""Trivial train.py for harness tests: prints the summary block, no training."""
import subprocess
import sys
import time

LEARNING_RATE = 0.004
N_LAYER = 2
SLEEP_S = 0.0
EXIT_CODE = 0
SPAWN_CHILD = False

if SPAWN_CHILD:  # a child in the same process group, marked with our arguments
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", *sys.argv[1:]])
time.sleep(SLEEP_S)
val_bpb = 2.0 + abs(LEARNING_RATE - 0.001) * 100 + 0.01 * (N_LAYER - 2)
print("step 00001 (100.0%) | loss: 1.0")
print("---")
print(f"val_bpb:          {val_bpb:.6f}")
print(f"training_seconds: {SLEEP_S:.1f}")
print(f"total_seconds:    {SLEEP_S:.1f}")
print(f"peak_vram_mb:     {1126.4:.1f}")
print("num_steps:        1")
sys.exit(EXIT_CODE)
'''


def trivial_val_bpb(learning_rate: float, n_layer: int = 2) -> float:
    """What TRIVIAL_TRAIN_PY prints, rounded as printed."""
    return round(2.0 + abs(learning_rate - 0.001) * 100 + 0.01 * (n_layer - 2), 6)


def library_records(limit: int | None = None) -> list[dict[str, Any]]:
    """corpus.jsonl records from this repository's library sources; every tenth file is validation."""
    files = sorted(p for p in LIBRARY_DIR.rglob("*.py") if p.stat().st_size > 0)[:limit]
    return [
        {
            "source": "self",
            "repo": "acme/mat",
            "commit": "0" * 40,
            "path": str(path.relative_to(REPO_ROOT)),
            "bytes": path.stat().st_size,
            "sha": "",
            "split": "val" if position % 10 == 0 else "train",
            "text": path.read_text(encoding="utf-8"),
        }
        for position, path in enumerate(files)
    ]


def write_corpus_dir(directory: Path, records: list[dict[str, Any]] | None = None) -> Path:
    """A corpus directory with corpus.jsonl and a matching corpus.txt (mat's header lines)."""
    directory.mkdir(parents=True, exist_ok=True)
    records = records if records is not None else library_records()
    (directory / "corpus.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    text = "".join(
        f"--- source: {r['source']} | repo: {r['repo']} | path: {r['path']} ---\n{r['text']}\n"
        for r in records
    )
    (directory / "corpus.txt").write_text(text, encoding="utf-8")
    return directory


def set_constant(source: str, name: str, value: str) -> str:
    """Replace the literal of `NAME = ...` at the start of a line."""
    updated, count = re.subn(rf"^({name} = )[^\s#]+", rf"\g<1>{value}", source, count=1, flags=re.MULTILINE)
    assert count == 1, f"no {name} line"
    return updated


def install_train_py(workspace: Workspace, source: str = TRIVIAL_TRAIN_PY) -> None:
    """Replace the template's train.py with `source` and make that the baseline commit.

    Such a train.py saves no checkpoint, so its printed val_bpb is taken as the result ("summary"
    evaluation, autoresearch's contract); the independent evaluation has tests of its own.
    """
    (workspace.path / "train.py").write_text(source, encoding="utf-8")
    workspace.baseline_commit = gitops.commit_paths(workspace.path, "baseline (test train.py)", ["train.py"])
    workspace.evaluation = "summary"


def edit_train(workspace: Path, **constants: str) -> None:
    train = workspace / "train.py"
    source = train.read_text(encoding="utf-8")
    for name, value in constants.items():
        source = set_constant(source, name, value)
    train.write_text(source, encoding="utf-8")


# ---------------------------------------------------------------- agents (the Agent Protocol)


class ScheduleAgent:
    """Sets constants of train.py from a schedule keyed by experiment id: {id: {NAME: value}}."""

    name = "schedule"

    def __init__(
        self, schedule: dict[int, dict[str, str]], other_edits: dict[int, dict[str, str]] | None = None
    ):
        self.schedule = schedule
        self.other_edits = other_edits or {}  # {id: {relative path: text to append}} outside train.py
        self.requests: list[AgentRequest] = []

    def propose(self, request: AgentRequest) -> AgentOutcome:
        self.requests.append(request)
        changes = self.schedule.get(request.experiment_id, {})
        if changes:
            edit_train(request.workspace, **changes)
        for relative, text in self.other_edits.get(request.experiment_id, {}).items():
            target = request.workspace / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a", encoding="utf-8") as handle:
                handle.write(text)
        description = ", ".join(f"{k} -> {v}" for k, v in changes.items()) or "nothing"
        return AgentOutcome(description, log=f"schedule agent: {description}\n")


class ByExperiment:
    """Delegates each experiment to the agent registered for its id."""

    name = "by-experiment"

    def __init__(self, agents: dict[int, Any]):
        self.agents = agents

    def propose(self, request: AgentRequest) -> AgentOutcome:
        outcome: AgentOutcome = self.agents[request.experiment_id].propose(request)
        return outcome


class CommittingAgent:
    """Edits train.py and prepare.py and commits both itself, as some coding agents do (on a branch of its own
    when `branch` is given)."""

    name = "committing"

    def __init__(self, branch: str | None = None):
        self.branch = branch

    def propose(self, request: AgentRequest) -> AgentOutcome:
        if self.branch:
            gitops.run_git(request.workspace, "checkout", "-q", "-b", self.branch)
        edit_train(request.workspace, LEARNING_RATE="0.002")
        with (request.workspace / "prepare.py").open("a", encoding="utf-8") as handle:
            handle.write("\n# the agent was here\n")
        gitops.commit_paths(request.workspace, "agent's own commit")
        return AgentOutcome("LEARNING_RATE -> 0.002", log="committed\n")


class ProtocolAgent:
    """Agent mode done by the book: edit, commit, `python train.py > run.log 2>&1`, append a row, keep/reset.

    `values` maps experiment id -> LEARNING_RATE; `touch_prepare` also commits a prepare.py edit;
    `skip_row` runs but records nothing.
    """

    name = "protocol"

    def __init__(self, values: dict[int, str], touch_prepare: bool = False, skip_row: bool = False):
        self.values = values
        self.touch_prepare = touch_prepare
        self.skip_row = skip_row

    def propose(self, request: AgentRequest) -> AgentOutcome:
        ws = request.workspace
        base = gitops.head_sha(ws)
        edit_train(ws, LEARNING_RATE=self.values[request.experiment_id])
        if self.touch_prepare:
            with (ws / "prepare.py").open("a", encoding="utf-8") as handle:
                handle.write("\nEVAL_BYTES = 1\n")
        description = f"LEARNING_RATE -> {self.values[request.experiment_id]}"
        commit = gitops.commit_paths(ws, description)
        with (ws / "run.log").open("wb") as log:
            subprocess.run(
                [sys.executable, "train.py"], cwd=ws, stdout=log, stderr=subprocess.STDOUT, check=False
            )
        match = re.search(r"^val_bpb:\s+(\S+)", (ws / "run.log").read_text(), re.MULTILINE)
        val = float(match.group(1)) if match else 0.0
        best = min((r.val_bpb for r in request.history if r.status == "keep" and r.val_bpb), default=None)
        status = "keep" if match and (best is None or val < best) else ("discard" if match else "crash")
        if not self.skip_row:
            with (ws / "results.tsv").open("a", encoding="utf-8") as table:
                table.write(f"{commit[:7]}\t{val:.6f}\t1.1\t{status}\t{description}\n")
        if status != "keep":
            gitops.reset_hard(ws, base)
        return AgentOutcome(description, log=f"protocol agent: {status}\n")


# ---------------------------------------------------------------- runs in a separate process


def configs(train_time: int = 60, max_experiments: int = 4, mode: str = "harness") -> tuple[Any, Any]:
    return (
        AutoresearchConfig(train_time=train_time),
        TrainingConfig(max_experiments=max_experiments, mode=mode),  # type: ignore[arg-type]
    )


def new_trivial_run(
    output_dir: Path, corpus: Path, name: str, **runner_kwargs: Any
) -> tuple[Runner, Workspace]:
    """A Runner with a set-up workspace whose train.py is TRIVIAL_TRAIN_PY."""
    autoresearch, training = configs(max_experiments=runner_kwargs.pop("max_experiments", 4))
    runner = Runner(autoresearch, training, name, output_dir=output_dir, **runner_kwargs)
    workspace = runner.setup_workspace(corpus)
    install_train_py(workspace)
    return runner, workspace


def slow_run_main(output_dir: str, corpus: str, slow_id: int, marker: str) -> None:
    """Entry point of the SIGKILL test's child: experiment `slow_id` trains for a long time."""
    import asyncio

    schedule = {i: {"LEARNING_RATE": str(0.004 - 0.0005 * i)} for i in range(1, 10)}
    schedule[slow_id]["SLEEP_S"] = "300"
    runner, workspace = new_trivial_run(
        Path(output_dir), Path(corpus), "killed", agent=ScheduleAgent(schedule), max_experiments=5,
        options=LoopOptions(timeout_margin_s=600),
    )  # fmt: skip
    workspace.train_command = [*workspace.train_command, marker]  # marks the training processes in /proc
    print(runner.run_id, flush=True)
    asyncio.run(runner.run_experiments(workspace))


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode("utf-8", "replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
