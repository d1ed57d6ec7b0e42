"""DockerExecutor against a dockerd started by the session: copying, streaming, timeouts, stopping,
copying back with every path checked, and containers that are missing or stopped."""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from multiagenttrainer.errors import ExperimentError, MachineError
from multiagenttrainer.execution import make_executor
from multiagenttrainer.execution.docker import DockerExecutor, checked_members
from tests.execution.helpers import (
    FAMILY,
    PY,
    TALKER,
    TICKER,
    DockerConfig,
    elapsed,
    new_marker,
    start_run,
    wait_for_text,
    write_workspace,
)
from tests.support.dockerd import Dockerd
from tests.support.experiments import processes_with

pytestmark = pytest.mark.integration


def in_container(container: Any, *command: str) -> str:
    result = container.exec_run(list(command))
    assert result.exit_code == 0, result.output
    return str(result.output.decode())


def copy_dir(executor: DockerExecutor, workspace: Path) -> str:
    return str(executor.layout(workspace).workspace)


def test_output_streams_into_the_log_with_exit_code_and_environment(
    docker_config: DockerConfig, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAT_TEST_FORWARDED", "yes")
    executor = make_executor(docker_config(env={"X": "42"}, forward_env=["MAT_TEST_FORWARDED"]), "box")
    assert isinstance(executor, DockerExecutor) and executor.name == "box"
    write_workspace(workspace, {"train.py": TALKER})
    executor.prepare(workspace)
    log = tmp_path / "logs" / "exp-000.log"
    run = start_run(executor, workspace, [], log)
    wait_for_text(log, "line 0")
    assert "line 2" not in log.read_text()
    outcome = run.result(30)
    executor.cleanup()
    assert (outcome.exit_code, outcome.timed_out, outcome.error) == (3, False, None)
    lines = log.read_text().splitlines()
    assert lines[:3] == ["line 0", "line 1", "line 2"]
    assert "on stderr" in lines and "X=42 FWD=yes" in lines


def test_only_what_differs_is_put_and_an_edited_evaluator_is_restored(
    docker_config: DockerConfig, container: Any, workspace: Path
) -> None:
    executor = DockerExecutor(docker_config())
    write_workspace(
        workspace, {"train.py": "print(1)\n", "prepare.py": "EVAL = 1\n", "data/val.bin": "v" * 100}
    )
    (workspace / "results.tsv").symlink_to("../results.tsv")
    executor.prepare(workspace)
    copy = copy_dir(executor, workspace)
    listed = in_container(container, "find", copy, "-type", "f").split()
    assert sorted(p.removeprefix(copy + "/") for p in listed) == ["data/val.bin", "prepare.py", "train.py"]
    changed_before = in_container(container, "stat", "-c", "%Z", f"{copy}/data/val.bin")
    (workspace / "train.py").write_text("print(2)\n")
    in_container(container, "sh", "-c", f"echo 'EVAL = 0' > {copy}/prepare.py")
    time.sleep(1.1)  # ctime has whole seconds here
    executor.sync(workspace, ["train.py"])
    executor.cleanup()
    assert in_container(container, "cat", f"{copy}/train.py") == "print(2)\n"
    assert in_container(container, "cat", f"{copy}/prepare.py") == "EVAL = 1\n"
    assert in_container(container, "stat", "-c", "%Z", f"{copy}/data/val.bin") == changed_before


def test_the_timeout_kills_the_process_tree_inside_the_container(
    docker_config: DockerConfig, workspace: Path, tmp_path: Path
) -> None:
    marker = new_marker()
    executor = DockerExecutor(docker_config(), grace_s=0.5)
    write_workspace(workspace, {"train.py": FAMILY})
    executor.prepare(workspace)
    started = time.monotonic()
    outcome = executor.run(workspace, [PY, "train.py", marker, "600"], 3, tmp_path / "exp.log", {})
    executor.cleanup()
    assert outcome.timed_out and outcome.exit_code is None
    assert 3 <= elapsed(started) < 20
    assert processes_with(marker) == []  # container processes are visible from here
    assert "[mat] killed after 3 s" in (tmp_path / "exp.log").read_text()


def test_stop_from_a_new_executor_kills_what_an_earlier_one_left_running(
    docker_config: DockerConfig, workspace: Path, tmp_path: Path
) -> None:
    marker = new_marker()
    cfg = docker_config()
    first = DockerExecutor(cfg, grace_s=0.5)
    write_workspace(workspace, {"train.py": FAMILY})
    first.prepare(workspace)
    log = tmp_path / "exp.log"
    run = start_run(first, workspace, [marker, "600"], log)
    wait_for_text(log, "family started")
    DockerExecutor(cfg, grace_s=0.5).stop(workspace)
    outcome = run.result(30)
    first.cleanup()
    assert outcome.exit_code is not None and outcome.exit_code < 0
    assert processes_with(marker) == []


def test_copying_back_refuses_links_and_paths_outside_the_workspace(
    docker_config: DockerConfig, container: Any, workspace: Path, tmp_path: Path
) -> None:
    executor = DockerExecutor(docker_config())
    write_workspace(workspace, {"train.py": TICKER})
    executor.prepare(workspace)
    assert executor.run(workspace, [PY, "train.py", "0"], 60, tmp_path / "exp.log", {}).exit_code == 0
    executor.fetch(workspace, ["out.txt", "missing.txt"])
    assert (workspace / "out.txt").read_text() == "result"
    copy = copy_dir(executor, workspace)
    in_container(
        container, "sh", "-c", f"mkdir -p {copy}/out && echo a > {copy}/out/a && ln {copy}/out/a {copy}/out/b"
    )
    in_container(container, "ln", "-s", "/etc/passwd", f"{copy}/link.txt")
    with pytest.raises(ExperimentError, match="refused to copy back 'link.txt' .*: it is a link"):
        executor.fetch(workspace, ["link.txt"])
    with pytest.raises(ExperimentError, match="refused to copy back 'out/b' .*: it is a link"):
        executor.fetch(workspace, ["out"])  # a hard link inside a directory
    with pytest.raises(ExperimentError, match="only paths inside the workspace"):
        executor.fetch(workspace, ["../x"])
    executor.cleanup()
    assert not (workspace / "link.txt").exists() and not (workspace / "out").exists()


def tar_with(*members: tuple[str, bytes | str]) -> tarfile.TarFile:
    """A tar holding files (bytes) and symbolic links (str: the target)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, content in members:
            info = tarfile.TarInfo(name)
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r:")


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        ("out/../../x", "would land outside the workspace"),
        ("../x", "would land outside the workspace"),
        ("/etc/cron.d/x", "would land outside the workspace"),
        ("other/x", "would land outside the workspace"),
    ],
)
def test_an_archive_member_outside_the_requested_path_is_refused(member: str, reason: str) -> None:
    """What a daemon or a container could send back beyond what `docker cp` itself produces."""
    with pytest.raises(ExperimentError, match=reason):
        checked_members(tar_with(("out/ok", b"1"), (member, b"2")), "out", "container 'c'")


def test_an_archive_with_a_symbolic_link_is_refused_and_a_plain_one_accepted() -> None:
    with pytest.raises(ExperimentError, match="it is a link"):
        checked_members(tar_with(("out/ok", b"1"), ("out/l", "../../../etc/passwd")), "out", "container 'c'")
    assert [m.name for m in checked_members(tar_with(("out/ok", b"1")), "out", "container 'c'")] == ["out/ok"]


def test_a_missing_or_stopped_container_is_named_with_the_fix(
    dockerd: Dockerd, busybox_image: str, docker_config: DockerConfig, workspace: Path
) -> None:
    with pytest.raises(MachineError, match="there is no container 'no-such-box'"):
        DockerExecutor(docker_config(container="no-such-box")).prepare(workspace)
    stopped = dockerd.run_container(busybox_image, [], name="mat-test-stopped")
    stopped.stop(timeout=1)
    expected = r"'mat-test-stopped' is not running \(exited\); start it with `docker start mat-test-stopped`"
    with pytest.raises(MachineError, match=expected):
        DockerExecutor(docker_config(container="mat-test-stopped")).prepare(workspace)
    stopped.remove(force=True)
    unreachable = docker_config(docker_host="unix:///nonexistent/docker.sock")
    with pytest.raises(MachineError, match="container 'mat-test-.*'"):
        DockerExecutor(unreachable).prepare(workspace)
