"""CommandAgent: run a coding agent's command line (claude, codex, aider, any script) in the workspace.

    {prompt}        -> the instruction text, shell-quoted (do not add quotes around it yourself)
    {prompt_file}   -> the path of a file holding the same text, in the run directory (outside the git tree)

The command runs as `bash -c <command>` in its own process group, with stdin closed, for at most
`request.timeout_s`; then the whole group gets SIGTERM, a grace period, and SIGKILL. Processes the
agent leaves behind after it exits are stopped the same way. The agent's own failures (exit codes,
timeouts, a missing executable) never raise: they come back in the AgentOutcome.

The description is the first line of `.mat-description` if the agent wrote one (the file is then
deleted), else derived from how train.py changed: `LEARNING_RATE 3e-3 -> 1e-3`, `edited train.py
(+3 -1 lines)`, or `no change`.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import shlex
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from multiagenttrainer.agents.base import AgentOutcome, AgentRequest
from multiagenttrainer.agents.hyperparameter_edits import (
    changed_constants,
    describe_change,
    parse_constants,
    replace_literal,
)
from multiagenttrainer.agents.prompt import DESCRIPTION_FILE
from multiagenttrainer.errors import ConfigError, ExperimentError
from multiagenttrainer.processes import group_alive, start_in_session, stop_group

log = logging.getLogger(__name__)

KILL_GRACE_S = 5.0  # between SIGTERM and SIGKILL
REAP_TIMEOUT_S = 10.0  # how long to wait for killed processes to disappear
LOG_HEAD_BYTES = 64 * 1024  # the outcome log keeps the start and the end of long outputs
LOG_TAIL_BYTES = 192 * 1024
MAX_DESCRIPTION_CHARS = 200
COMMAND_NOT_FOUND = 127
NOT_EXECUTABLE = 126
_PLACEHOLDER = re.compile(r"""(["']?)\{(prompt|prompt_file)\}\1""")
_NOT_FOUND_NAME = re.compile(r"(?:^|: )([^\s:]+): (?:command )?not found", re.MULTILINE)


# ---------------------------------------------------------------- the command line


def substitute(command: str, prompt: str, prompt_file: Path) -> str:
    """The command with {prompt} and {prompt_file} replaced by shell-quoted values, in one pass."""
    values = {"prompt": prompt, "prompt_file": str(prompt_file)}
    return _PLACEHOLDER.sub(lambda m: shlex.quote(values[m.group(2)]), command)


def prompt_path(workspace: Path, experiment_id: int) -> Path:
    """Where the prompt file goes: `<run dir>/prompts/exp-NNN.md`, next to the workspace, not inside it."""
    return workspace.resolve().parent / "prompts" / f"exp-{experiment_id:03d}.md"


def program_name(command: str, output: str) -> str:
    """The executable bash could not find: from its error message, else the command's first word."""
    match = _NOT_FOUND_NAME.search(output)
    if match:
        return match.group(1)
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return words[0] if words else command


# ---------------------------------------------------------------- process groups


@dataclass(frozen=True)
class CommandRun:
    """How the agent's process ended."""

    exit_code: int
    timed_out: bool
    notes: list[str]


def run_in_group(
    command: str, cwd: Path, env: dict[str, str], output: IO[bytes], timeout_s: float, grace_s: float
) -> CommandRun:
    """Run `bash -c command` in a new session; on timeout, or if it leaves processes, stop the group."""
    try:
        process = start_in_session(["bash", "-c", command], cwd, output, env)
    except OSError as exc:
        raise ExperimentError(
            f"cannot start the agent in {cwd}: {exc.strerror or exc}; is bash installed?"
        ) from exc
    notes: list[str] = []
    try:
        process.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        notes.append(f"the agent ran past its {timeout_s:g} s timeout; its process group was stopped")
    if timed_out or group_alive(process.pid):
        if not timed_out:
            notes.append("the agent exited but left processes running; they were stopped")
        survivors = stop_group(process.pid, process, grace_s, REAP_TIMEOUT_S)
        if process.pid not in survivors:
            process.wait()  # it is gone: collect its exit status
        if survivors:
            notes.append(f"processes still alive after SIGKILL: {survivors}")
            log.warning("agent processes survived SIGKILL: %s", survivors)
    code = process.returncode if process.returncode is not None else -signal.SIGKILL
    return CommandRun(code, timed_out, notes)


def read_bounded(output: IO[bytes]) -> str:
    """The captured output: all of it when small, else its head and tail around an omission marker."""
    size = output.seek(0, os.SEEK_END)
    output.seek(0)
    if size <= LOG_HEAD_BYTES + LOG_TAIL_BYTES:
        return output.read().decode("utf-8", errors="replace")
    head = output.read(LOG_HEAD_BYTES)
    output.seek(size - LOG_TAIL_BYTES)
    tail = output.read()
    omitted = size - len(head) - len(tail)
    marker = f"\n[... {omitted} bytes of agent output omitted ...]\n".encode()
    return (head + marker + tail).decode("utf-8", errors="replace")


# ---------------------------------------------------------------- the description


def read_text_or_none(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def take_description(workspace: Path) -> str | None:
    """The first line of `.mat-description`, trimmed and made one TSV-safe line; the file is deleted."""
    path = workspace / DESCRIPTION_FILE
    text = read_text_or_none(path)
    if text is None:
        return None
    path.unlink(missing_ok=True)
    first = text.splitlines()[0] if text.splitlines() else ""
    line = " ".join(first.split())
    return line[:MAX_DESCRIPTION_CHARS] or None


def line_counts(before: str, after: str) -> tuple[int, int]:
    """(added, removed) lines between two texts."""
    added = removed = 0
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def with_constants_of(before: str, after: str, changes: list[tuple[str, str, str]]) -> str:
    """`before` with the changed constants set to their new text: what remains differs in other code."""
    for name, _old, new_text in changes:
        before = replace_literal(before, parse_constants(before)[name], new_text)
    return before


def describe_train_change(before: str | None, after: str | None) -> str:
    """`LEARNING_RATE 3e-3 -> 1e-3, N_LAYER 2 -> 3`, `edited train.py (+A -B lines)` or `no change`."""
    if before == after:
        return "no change"
    if after is None:
        return "deleted train.py"
    if before is None:
        return "created train.py"
    try:
        changes = changed_constants(before, after)
        rest = with_constants_of(before, after, changes)
    except (SyntaxError, ValueError):
        changes, rest = [], before
    added, removed = line_counts(rest, after)
    edited = f"edited train.py (+{added} -{removed} lines)"
    if not changes:
        return edited
    listed = ", ".join(describe_change(*change) for change in changes)
    return listed if rest == after else f"{listed}; {edited}"


def failure_description(run: CommandRun, command: str, output: str) -> str | None:
    """A description for an agent that could not start at all (missing or non-executable program)."""
    if run.timed_out:
        return None
    program = program_name(command, output)
    if run.exit_code == COMMAND_NOT_FOUND:
        return f"agent command not found: {program}; install it or set training.agent_command"
    if run.exit_code == NOT_EXECUTABLE:
        return f"agent command is not executable: {program}; check its permissions"
    return None


# ---------------------------------------------------------------- the agent


class CommandAgent:
    """Runs a shell command line as the agent; see the module docstring for placeholders and limits."""

    def __init__(self, command: str, name: str = "command", kill_grace_s: float = KILL_GRACE_S) -> None:
        if not command.strip():
            raise ConfigError("training.agent_command is empty; set a command line or remove the key")
        self.command = command
        self.name = name
        self.kill_grace_s = kill_grace_s

    def propose(self, request: AgentRequest) -> AgentOutcome:
        """Run the command once in `request.workspace`; never raises for the agent's own failure."""
        workspace = request.workspace
        train = workspace / "train.py"
        before = read_text_or_none(train)
        (workspace / DESCRIPTION_FILE).unlink(missing_ok=True)  # a stale one must not describe this change
        prompt_file = prompt_path(workspace, request.experiment_id)
        prompt_file.parent.mkdir(parents=True, exist_ok=True)
        prompt_file.write_text(request.prompt, encoding="utf-8")
        command = substitute(self.command, request.prompt, prompt_file)
        env = {**os.environ, **request.env}
        with tempfile.TemporaryFile() as output:
            run = run_in_group(command, workspace, env, output, request.timeout_s, self.kill_grace_s)
            text = read_bounded(output)
        failure = failure_description(run, self.command, text)
        notes = [*run.notes, *([failure] if failure else [])]
        if notes:
            text += "".join(f"\n[mat] {note}" for note in notes) + "\n"
        written = take_description(workspace)
        description = failure or written or describe_train_change(before, read_text_or_none(train))
        return AgentOutcome(description, log=text, exit_code=run.exit_code, timed_out=run.timed_out)
