"""`mat train` with each kind of Prefect server: Ctrl-C to the terminal's process group stops it within
seconds (exit 130, the resume command printed, nothing left running); `kill -9` leaves no server of its own
behind; two first commands at once on a fresh machine start one server without racing on its database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from multiagenttrainer.experiments.run_state import load_run
from tests.support.experiments import processes_with
from tests.training.conftest import MAT, ROOT, mat_env, only_run_dir, wait_until, write_config

pytestmark = pytest.mark.integration
STOP_WITHIN_S = 15.0  # "within a few seconds": SIGTERM grace for training included


def servers_of(home: Path) -> list[int]:
    """Live `prefect server start` processes using `home` as MAT_HOME."""
    found = []
    for pid in processes_with("prefect"):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            f"PREFECT_HOME={home / 'prefect'}".encode() in environ
            and b"server" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ):
            found.append(pid)
    return found


@pytest.fixture(scope="module")
def own_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A MAT_HOME of these tests' own (no PREFECT_API_URL): mat starts its servers there."""
    home = tmp_path_factory.mktemp("mat-home")
    yield home
    subprocess.run([*MAT, "server", "stop"], env=own_env(home), cwd=ROOT, capture_output=True, timeout=60)
    for pid in servers_of(home):
        os.kill(pid, signal.SIGKILL)


def own_env(home: Path, **extra: str) -> dict[str, str]:
    env = mat_env(MAT_HOME=str(home), **extra)
    env.pop("PREFECT_API_URL", None)
    return env


def start_in_terminal_group(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`mat ARGS` as a terminal's foreground job: a process group of its own, SIGINT delivered normally."""
    with log.open("wb") as handle:
        return subprocess.Popen(
            [*MAT, *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=handle,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip


def wait_for_training(runs: Path) -> Path:
    def training() -> bool:
        run_files = list(runs.glob("*/run.json")) if runs.is_dir() else []
        current = json.loads(run_files[0].read_text())["current"] if run_files else []
        return any(c["phase"] == "training" for c in current)

    wait_until(training, 240, "the baseline to start training")
    return only_run_dir(runs)


def test_two_first_commands_at_once_start_one_local_server(
    own_home: Path, tiny_source: Path, tmp_path: Path
) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    configs = [write_config(tmp_path / name, tiny_source) for name in ("a", "b")]
    processes = [
        subprocess.Popen(
            [*MAT, "ingest", "--config", str(config)],
            cwd=ROOT,
            env=own_env(own_home),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for config in configs
    ]
    outputs = [p.communicate(timeout=400) for p in processes]
    for process, (_out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
        assert "Traceback" not in err and "database is locked" not in err
    announced = [err for _, err in outputs if "Started a local Prefect server" in err]
    assert len(announced) == 1 and "mat server stop" in announced[0]
    assert len(servers_of(own_home)) == 1
    started = time.monotonic()
    again = subprocess.run(
        [*MAT, "ingest", "--config", str(configs[0])], cwd=ROOT, env=own_env(own_home),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0 and "Started" not in again.stderr
    print(f"second no-change ingest: {time.monotonic() - started:.1f} s")


@pytest.mark.parametrize("mode", ["local", "ephemeral", "remote"])
def test_ctrl_c_to_the_process_group_stops_within_seconds(
    mode: str, own_home: Path, tiny_source: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if mode == "remote":
        env = mat_env(PREFECT_API_URL=request.getfixturevalue("prefect_api"))
    else:
        env = own_env(own_home, MAT_PREFECT_SERVER=mode)
    config = write_config(tmp_path, tiny_source)
    log = tmp_path / "mat.log"
    process = start_in_terminal_group(
        ["train", "--config", str(config), "--name", "ctrlc"], {**env, "MAT_FIXED_STEPS": "1000000"}, log
    )
    try:
        run_dir = wait_for_training(tmp_path / "runs")
        wait_until(lambda: bool(trainers_in(run_dir / "workspace")), 60, "train.py to start")
        ephemeral = [pid for pid in servers_of(own_home) if pid not in persistent_servers(own_home)]
        pressed = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        assert process.wait(timeout=60) == 130, log.read_text()
        assert time.monotonic() - pressed < STOP_WITHIN_S, log.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    assert f"continue it with `mat train --resume {run_dir.name}`" in log.read_text()
    assert load_run(run_dir).status == "interrupted"
    assert trainers_in(run_dir / "workspace") == []
    if mode == "ephemeral":
        assert ephemeral, "the command ran a server of its own"
        wait_until(lambda: not set(ephemeral) & set(servers_of(own_home)), 20, "the ephemeral server to stop")
    if mode == "local":
        assert servers_of(own_home), "mat's local server keeps running for later commands"


def test_kill_9_leaves_no_ephemeral_server_and_resume_cleans_up(
    own_home: Path, tiny_source: Path, tmp_path: Path
) -> None:
    env = own_env(own_home, MAT_PREFECT_SERVER="ephemeral", MAT_FIXED_STEPS="1000000")
    config = write_config(tmp_path, tiny_source, training={"max_experiments": 1})
    process = start_in_terminal_group(
        ["train", "--config", str(config), "--name", "killed"], env, tmp_path / "log"
    )
    run_dir = wait_for_training(tmp_path / "runs")
    wait_until(lambda: bool(trainers_in(run_dir / "workspace")), 60, "train.py to start")
    ephemeral = [pid for pid in servers_of(own_home) if pid not in persistent_servers(own_home)]
    assert ephemeral, "an ephemeral server runs for the command"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in ephemeral), 20, "the server to die")
    wait_until(lambda: not trainers_in(run_dir / "workspace"), 20, "train.py to die with mat")
    resumed = subprocess.run(
        [*MAT, "train", "--resume", run_dir.name, "--output-dir", str(tmp_path / "runs")], cwd=ROOT,
        env={**env, "MAT_FIXED_STEPS": "2"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert load_run(run_dir).status == "completed"


def persistent_servers(home: Path) -> list[int]:
    """The pid of mat's recorded local server under `home`, if any."""
    try:
        return [int(json.loads((home / "server.json").read_text())["pid"])]
    except (OSError, ValueError, KeyError):
        return []


def trainers_in(workspace: Path) -> list[int]:
    """Live train.py processes working in `workspace`."""
    found = []
    for pid in processes_with("train.py"):
        try:
            if Path(f"/proc/{pid}/cwd").readlink() == workspace:
                found.append(pid)
        except OSError:
            continue
    return found


def test_deploy_without_a_server_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = subprocess.run(
        [*MAT, "deploy"], cwd=ROOT, env=own_env(home), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert "mat server start" in result.stderr and "Traceback" not in result.stderr
    assert servers_of(home) == []
