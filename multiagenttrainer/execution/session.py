"""The session helper that mat runs on a remote target (an SSH host, a container) with the Python there.

mat ships this module together with processes.py as one zip (`remote.session_zip()`), so the target starts,
kills, verifies and reports exactly as local runs do. Standard library only; Linux (/proc) only.

    python3 -I -S session.pyz run --sessions DIR --cwd DIR --nonce N --timeout-s T --grace-s G
                                  --heartbeat-s H [--env NAME=VALUE ...] -- COMMAND ...
    python3 -I -S session.pyz stop --sessions DIR --grace-s G
    python3 -I -S session.pyz state ROOT

run    first stops the sessions recorded in DIR (what a lost connection or a killed mat left behind) and
       the process scopes of helpers that died (processes.py: what their commands detached), then
       starts COMMAND in --cwd in a new session, stdout and stderr both on this process's stdout, records the
       session in DIR. Past T seconds the whole session is stopped (SIGTERM, SIGKILL after G seconds, then
       checked gone); when COMMAND ends, whatever it left behind is stopped the same way. On stderr it writes
       `N alive` every H seconds (the heartbeat that shows mat the connection is up) and, last,
       `N {"exit_code": ..., "timed_out": ..., "survivors": [...], "error": ...}`.
stop   does the same stopping and prints {"stopped": [...], "orphans": [...], "survivors": [...]}.
state  prints {relative path: fingerprint} for the files under ROOT (see `fingerprint`), so that mat copies
       only what differs; links and other non-regular entries are reported as "other".

A session record is the file DIR/<session id> holding its leader's start time: a recorded id whose process
now has another start time was reused, and since Linux keeps an id while any process uses it as a group or
session id, nothing of the recorded session is left.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from multiagenttrainer.processes import (
    group_alive,
    read_start_time,
    start_in_session,
    stop_group,
    stop_orphaned_scopes,
)

HASHED_MAX_BYTES = 1 << 20  # files up to this size are compared by content, larger ones by size and mtime
SKIPPED_NAMES = frozenset({".git", "__pycache__"})  # never copied: the target trains, it does not commit
OTHER = "other"  # the fingerprint of a link, a device, a directory where a file should be


class Stopped(Exception):
    """The helper got SIGTERM or SIGINT while the command ran."""


# ---------------------------------------------------------------- workspace state


def fingerprint(path: Path, info: os.stat_result) -> str:
    """`sha256:<hex>` for a file up to HASHED_MAX_BYTES, `<size>:<mtime in whole seconds>` for larger ones."""
    if info.st_size > HASHED_MAX_BYTES:
        return f"{info.st_size}:{int(info.st_mtime)}"
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def tree_state(root: Path, prefix: str = "") -> dict[str, str]:
    """{relative path: fingerprint} of what lies under `root`, links not followed, SKIPPED_NAMES left out."""
    state: dict[str, str] = {}
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return state
    for entry in entries:
        if entry.name in SKIPPED_NAMES:
            continue
        relative = prefix + entry.name
        if entry.is_dir(follow_symlinks=False):
            state.update(tree_state(Path(entry.path), relative + "/"))
        elif entry.is_file(follow_symlinks=False):
            state[relative] = fingerprint(Path(entry.path), entry.stat(follow_symlinks=False))
        else:
            state[relative] = OTHER
    return state


# ---------------------------------------------------------------- session records


def record_session(sessions: Path, sid: int) -> Path:
    """Write DIR/<sid> holding the leader's start time."""
    record = sessions / str(sid)
    record.write_text(str(read_start_time(sid) or ""), encoding="ascii")
    return record


def was_reused(record: Path) -> bool:
    """Whether the recorded session id now belongs to another process (so nothing of ours is left)."""
    started = read_start_time(int(record.name))
    try:
        recorded = record.read_text(encoding="ascii").strip()
    except OSError:
        return False
    return started is not None and recorded != "" and recorded != str(started)


def stop_recorded(sessions: Path, grace_s: float) -> dict[str, list[int]]:
    """Stop every session recorded in `sessions`, and the process scopes of helpers that died (what their
    commands detached); {"stopped": session ids, "orphans": pids, "survivors": pids that would not die}."""
    report: dict[str, list[int]] = {"stopped": [], "orphans": stop_orphaned_scopes(), "survivors": []}
    if not sessions.is_dir():
        return report
    for record in sorted(sessions.iterdir()):
        if not record.name.isdigit():
            continue
        sid = int(record.name)
        if not was_reused(record) and group_alive(sid):
            report["stopped"].append(sid)
            report["survivors"] += stop_group(sid, None, grace_s)
        if not group_alive(sid) or was_reused(record):
            record.unlink(missing_ok=True)
    return report


# ---------------------------------------------------------------- run


class Reporter:
    """Writes the protocol lines on stderr: heartbeats from a thread, then the outcome."""

    def __init__(self, nonce: str, heartbeat_s: float) -> None:
        self.nonce = nonce
        self.heartbeat_s = heartbeat_s
        self.done = threading.Event()
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        """One line `<nonce> <text>`; a closed connection is ignored (the timeout still holds)."""
        with self.lock:
            try:
                sys.stderr.write(f"{self.nonce} {text}\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def beat(self) -> None:
        """Say `alive` every heartbeat_s until done."""
        while not self.done.wait(self.heartbeat_s):
            self.write("alive")

    def start(self) -> None:
        if self.heartbeat_s > 0:
            threading.Thread(target=self.beat, daemon=True).start()

    def finish(self, outcome: dict[str, Any]) -> None:
        self.done.set()
        self.write(json.dumps(outcome))


def raise_stopped(signum: int, frame: FrameType | None) -> None:
    """Signal handler: SIGTERM and SIGINT end the run (its session is stopped first)."""
    raise Stopped(signal.Signals(signum).name)


def ignore(signum: int, frame: FrameType | None) -> None:
    """Signal handler for SIGHUP: a closed connection must not end the helper (children get the default)."""


def command_env(assignments: list[str]) -> dict[str, str]:
    """This process's environment plus NAME=VALUE assignments."""
    env = dict(os.environ)
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        env[name] = value
    return env


def wait_and_stop(
    proc: subprocess.Popen[bytes], timeout_s: float, grace_s: float
) -> tuple[int | None, bool, list[int]]:
    """Wait for the command; on timeout or a stop signal, stop its session. (code, timed out, survivors)"""
    try:
        code: int | None = proc.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        code, timed_out = None, True
    except Stopped:
        code, timed_out = None, False
    survivors = stop_group(proc.pid, proc, grace_s) if group_alive(proc.pid) else []
    if code is None and not timed_out:
        code = proc.wait()
    return code, timed_out, survivors


def run(args: argparse.Namespace) -> int:
    """The `run` action; returns the command's exit code (124 after a timeout, as timeout(1) does)."""
    sessions = Path(args.sessions)
    sessions.mkdir(parents=True, exist_ok=True)
    reporter = Reporter(args.nonce, args.heartbeat_s)
    leftovers = stop_recorded(sessions, args.grace_s)
    try:
        proc = start_in_session(args.command, Path(args.cwd), sys.stdout.buffer, command_env(args.env))
    except OSError as exc:
        reporter.finish({"exit_code": 127, "timed_out": False, "survivors": [], "error": str(exc)})
        return 127
    record = record_session(sessions, proc.pid)
    reporter.start()
    code, timed_out, survivors = wait_and_stop(proc, args.timeout_s, args.grace_s)
    if not survivors:
        record.unlink(missing_ok=True)
    survivors += leftovers["survivors"]
    reporter.finish({"exit_code": code, "timed_out": timed_out, "survivors": survivors, "error": None})
    return 124 if timed_out else (code if code is not None and code >= 0 else 1)


# ---------------------------------------------------------------- entry point


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line of the three actions."""
    parser = argparse.ArgumentParser(prog="session.pyz", description="mat's session helper on a target")
    actions = parser.add_subparsers(dest="action", required=True)
    run_parser = actions.add_parser("run")
    run_parser.add_argument("--sessions", required=True)
    run_parser.add_argument("--cwd", required=True)
    run_parser.add_argument("--nonce", required=True)
    run_parser.add_argument("--timeout-s", type=float, required=True)
    run_parser.add_argument("--grace-s", type=float, default=5.0)
    run_parser.add_argument("--heartbeat-s", type=float, default=0.0)
    run_parser.add_argument("--env", action="append", default=[])
    run_parser.add_argument("command", nargs="+")
    stop_parser = actions.add_parser("stop")
    stop_parser.add_argument("--sessions", required=True)
    stop_parser.add_argument("--grace-s", type=float, default=5.0)
    state_parser = actions.add_parser("state")
    state_parser.add_argument("root")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one action; see the module docstring."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.action == "state":
        print(json.dumps(tree_state(Path(args.root))))
        return 0
    if args.action == "stop":
        print(json.dumps(stop_recorded(Path(args.sessions), args.grace_s)))
        return 0
    signal.signal(signal.SIGHUP, ignore)
    signal.signal(signal.SIGTERM, raise_stopped)
    signal.signal(signal.SIGINT, raise_stopped)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
