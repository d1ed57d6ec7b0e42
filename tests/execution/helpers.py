"""Training scripts and checks shared by the ssh and docker executor tests."""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from multiagenttrainer.config import DockerExecution, SshExecution
from multiagenttrainer.execution.base import Executor, RunOutcome
from tests.support.experiments import processes_with, wait_for

PY = sys.executable
SshConfig = Callable[..., SshExecution]  # the ssh_config fixture: ssh_config(server, **fields)
DockerConfig = Callable[..., DockerExecution]  # the docker_config fixture: docker_config(**fields)

# Prints three lines a little apart, one on stderr, the environment it got, then exits with 3.
TALKER = """\
import os, sys, time
for i in range(3):
    print("line", i, flush=True)
    time.sleep(0.3)
print("on stderr", file=sys.stderr, flush=True)
print("X=" + os.environ.get("X", "-"), "FWD=" + os.environ.get("MAT_TEST_FORWARDED", "-"), flush=True)
print("HOME=" + os.environ.get("HOME", "-"), flush=True)
sys.exit(3)
"""

# Starts three children marked with argv[1] (plain, SIGTERM-deaf, in its own process group), says so,
# then sleeps argv[2] seconds.
FAMILY = """\
import subprocess, sys, time
marker, sleep_s = sys.argv[1], float(sys.argv[2])
children = [
    "import time; time.sleep(3600)",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)",
    "import os, time; os.setpgid(0, 0); time.sleep(3600)",
]
for code in children:
    subprocess.Popen([sys.executable, "-c", code, marker])
print("family started", flush=True)
time.sleep(sleep_s)
print("family done", flush=True)
"""

# Starts a child marked with argv[1] that leaves the session (setsid), says so, then sleeps.
DETACHER = """\
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(3600)", sys.argv[1]])
print("detached", flush=True)
time.sleep(3600)
"""

# Writes out.txt and sleeps argv[1] seconds, printing a tick every 0.2 s.
TICKER = """\
import sys, time
open("out.txt", "w").write("result")
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    print("tick", flush=True)
    time.sleep(0.2)
"""


def new_marker() -> str:
    return f"mat-test-{uuid.uuid4().hex}"


def write_workspace(workspace: Path, files: dict[str, str]) -> Path:
    """Write files given by workspace-relative path."""
    for relative, text in files.items():
        path = workspace / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return workspace


class Background:
    """`executor.run(...)` in a thread, so a test can act while it runs."""

    def __init__(self, run: Callable[[], RunOutcome]) -> None:
        self.outcome: RunOutcome | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.work, args=(run,), daemon=True)
        self.thread.start()

    def work(self, run: Callable[[], RunOutcome]) -> None:
        try:
            self.outcome = run()
        except BaseException as exc:  # re-raised by result()
            self.error = exc

    def result(self, timeout_s: float) -> RunOutcome:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"the run did not end within {timeout_s} s"
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome


def start_run(
    executor: Executor, workspace: Path, args: list[str], log: Path, timeout_s: float = 60
) -> Background:
    """Run `python train.py ARGS` on the executor in the background."""
    return Background(lambda: executor.run(workspace, [PY, "train.py", *args], timeout_s, log, {}))


def wait_for_text(path: Path, text: str, timeout_s: float = 30) -> None:
    wait_for(
        lambda: path.is_file() and text in path.read_text(errors="replace"), timeout_s, f"{text!r} in {path}"
    )


def wait_gone(marker: str, timeout_s: float = 10) -> None:
    """Wait until no process on this machine (containers and namespaces included) carries `marker`."""
    wait_for(lambda: not processes_with(marker), timeout_s, f"processes marked {marker} to be gone")


def elapsed(since: float) -> float:
    return time.monotonic() - since


def slow_remote_run_main(output_dir: str, corpus: str, execution_json: str, marker: str) -> None:
    """Entry point of the resume test's child: a run on an SSH target whose experiment 1 trains for 300 s."""
    import asyncio

    from multiagenttrainer.config import AutoresearchConfig, SshExecution, TrainingConfig
    from multiagenttrainer.experiments.loop import LoopOptions
    from multiagenttrainer.experiments.runner import Runner
    from tests.support.experiments import ScheduleAgent, install_train_py

    training = TrainingConfig(max_experiments=3, execution=SshExecution.model_validate_json(execution_json))
    schedule = {1: {"LEARNING_RATE": "0.003", "SLEEP_S": "300"}, 2: {"LEARNING_RATE": "0.002"}}
    runner = Runner(
        AutoresearchConfig(train_time=60), training, "killed", output_dir=output_dir,
        agent=ScheduleAgent(schedule), options=LoopOptions(timeout_margin_s=600),
    )  # fmt: skip
    workspace = runner.setup_workspace(corpus)
    install_train_py(workspace)
    workspace.train_command = [*workspace.train_command, marker]  # marks the training processes in /proc
    print(runner.run_id, flush=True)
    asyncio.run(runner.run_experiments(workspace))
