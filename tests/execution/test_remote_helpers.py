"""The pure parts the ssh and docker executors share: config fields, commands, fingerprints, logs, paths."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from multiagenttrainer.config import SshExecution, parse_config_text, split_ssh_host
from multiagenttrainer.errors import ConfigError, ExperimentError
from multiagenttrainer.execution import session
from multiagenttrainer.execution.remote import (
    Layout,
    LocalState,
    LogWriter,
    ProtocolReader,
    checked_relative,
    files_to_send,
    local_destination,
    outcome_of,
    session_zip,
    target_command,
    target_env,
)


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("gpu-box", (None, "gpu-box", None)),
        ("me@gpu-box", ("me", "gpu-box", None)),
        ("me@gpu-box:2222", ("me", "gpu-box", 2222)),
        ("me@[::1]:2222", ("me", "::1", 2222)),
        ("[fe80::1]", (None, "fe80::1", None)),
    ],
)
def test_ssh_host_is_user_at_host_colon_port(value: str, parsed: tuple[str | None, str, int | None]) -> None:
    assert split_ssh_host(value) == parsed


def test_ssh_and_docker_fields_are_checked_with_file_and_line() -> None:
    text = """\
training:
  execution:
    type: ssh
    ssh_host: "me@box:22"
    ssh_port: 2222
machines:
  - name: a
    execution: {type: ssh, ssh_host: "me@", python: "uv run python"}
  - name: b
    execution: {type: docker, container: c, container_dir: relative/dir}
"""
    with pytest.raises(ConfigError) as refused:
        parse_config_text(text, "mat.yaml")
    problems = refused.value.problems
    assert (
        "training.execution: ssh_host says port 22 and ssh_port says 2222; keep one (mat.yaml:2)" in problems
    )
    assert any(
        p.startswith("machines[0].execution.ssh_host: 'me@' is not [user@]host[:port]") for p in problems
    )
    assert any(p.startswith("machines[0].execution.python: must be one command or path") for p in problems)
    assert any(
        p.startswith("machines[1].execution.container_dir: must be an absolute path") for p in problems
    )


def test_the_product_fields_load_unchanged_and_the_address_has_defaults() -> None:
    cfg = parse_config_text(
        "training:\n  execution:\n    type: ssh\n    ssh_host: user@gpu-box.example.com\n"
        "    ssh_key: ~/.ssh/id_ed25519\n    remote_dir: /tmp/mat-runs\n"
    )
    execution = cfg.training.execution
    assert isinstance(execution, SshExecution)
    assert execution.address() == ("user", "gpu-box.example.com", 22)
    assert execution.host_key_policy == "strict" and execution.python == "python3"
    assert execution.model_copy(update={"ssh_port": 2200}).address()[2] == 2200


def test_the_local_interpreter_becomes_the_targets_python(monkeypatch: pytest.MonkeyPatch) -> None:
    assert target_command([sys.executable, "train.py"], "python3") == ["python3", "train.py"]
    assert target_command(["/opt/venv/bin/python3.11", "train.py"], "py") == ["py", "train.py"]
    assert target_command(["uv", "run", "train.py"], "python3") == ["uv", "run", "train.py"]
    monkeypatch.setenv("MAT_FIXED_STEPS", "3")
    monkeypatch.delenv("MAT_NOT_SET", raising=False)
    cfg = SshExecution(
        type="ssh", ssh_host="h", env={"A": "1"}, forward_env=["MAT_FIXED_STEPS", "MAT_NOT_SET"]
    )
    assert target_env({"PYTHONUNBUFFERED": "1", "A": "0"}, cfg) == {
        "PYTHONUNBUFFERED": "1", "A": "1", "MAT_FIXED_STEPS": "3"
    }  # fmt: skip


def test_layout_puts_each_run_and_machine_apart(tmp_path: Path) -> None:
    layout = Layout.for_run("/srv/mat", tmp_path / "20250101-000000-x" / "workspace", "gpu box/1")
    assert layout.workspace == PurePosixPath("/srv/mat/20250101-000000-x/gpu-box-1/workspace")
    assert layout.helper == PurePosixPath("/srv/mat/20250101-000000-x/gpu-box-1/.mat/session.pyz")


def test_fingerprints_here_and_on_the_target_agree(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "data" / "big.bin").write_bytes(b"x" * (session.HASHED_MAX_BYTES + 1))
    (tmp_path / "results.tsv").symlink_to("../results.tsv")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"\0")
    local = LocalState().of(tmp_path)
    assert local == session.tree_state(tmp_path)
    assert local["train.py"].startswith("sha256:") and local["results.tsv"] == session.OTHER
    assert (
        local["data/big.bin"]
        == f"{session.HASHED_MAX_BYTES + 1}:{int(os.stat(tmp_path / 'data/big.bin').st_mtime)}"
    )
    remote = dict(local, **{"train.py": "sha256:old", "extra.txt": "sha256:x"})
    del remote["data/big.bin"]
    assert files_to_send(local, remote) == ["data/big.bin", "train.py"]  # never the link


def test_the_helper_zip_runs_with_a_plain_python(tmp_path: Path) -> None:
    helper = tmp_path / "session.pyz"
    helper.write_bytes(session_zip())
    assert "multiagenttrainer/processes.py" in zipfile.ZipFile(helper).namelist()
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("a")
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(helper), "state", str(tmp_path / "ws")], capture_output=True
    )
    assert json.loads(done.stdout) == session.tree_state(tmp_path / "ws")


def test_log_lines_are_written_as_they_complete() -> None:
    log = io.BytesIO()
    writer = LogWriter(log)
    writer.feed(b"step 1\nstep")
    assert log.getvalue() == b"step 1\n"
    writer.feed(b" 2\n")
    writer.feed(b"\r" * 70_000)  # an endless progress line is written out anyway
    assert log.getvalue().startswith(b"step 1\nstep 2\n\r") and len(log.getvalue()) > 70_000
    writer.feed(b"tail")
    writer.close()
    assert log.getvalue().endswith(b"tail")


def test_protocol_lines_never_reach_the_log_and_a_forged_one_does() -> None:
    log = io.BytesIO()
    writer = LogWriter(log)
    reader = ProtocolReader("n0nce", writer)
    reader.feed(b"n0nce alive\nsh: python3: not found\nn0nce {broken\n")
    reader.feed(b'n0nce {"exit_code": 0, "timed_out": false, "survivors": [], "error": null}\n')
    reader.close()
    writer.close()
    assert log.getvalue() == b"sh: python3: not found\nn0nce {broken\n"
    outcome = outcome_of(reader, 0, 1.0, "host")
    assert (outcome.exit_code, outcome.timed_out, outcome.error) == (0, False, None)


def test_outcome_without_a_report_or_with_survivors() -> None:
    reader = ProtocolReader("n", LogWriter(io.BytesIO()))
    assert "ended without a report (exit status 137)" in str(outcome_of(reader, 137, 1.0, "host h").error)
    reader.outcome = {"exit_code": None, "timed_out": True, "survivors": [42]}
    with pytest.raises(ExperimentError, match=r"processes \[42\] .* on host h survived SIGKILL"):
        outcome_of(reader, 0, 1.0, "host h")


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "", "a/../../b", "a\0b"])
def test_paths_to_copy_back_must_stay_inside(path: str) -> None:
    with pytest.raises(ExperimentError, match="only paths inside the workspace"):
        checked_relative(path)


def test_a_copied_back_file_never_goes_through_a_link_out_of_the_workspace(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (workspace / "out").symlink_to(outside)
    with pytest.raises(ExperimentError, match="is not a directory of the workspace"):
        local_destination(workspace, PurePosixPath("out/x.txt"))
    assert (
        local_destination(workspace, PurePosixPath("logs/run.log"))
        == workspace.resolve() / "logs" / "run.log"
    )
    assert list(outside.iterdir()) == []
