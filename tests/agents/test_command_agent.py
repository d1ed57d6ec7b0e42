"""CommandAgent runs real commands (bash, the test agents under tests/assets/agents) in a workspace."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from multiagenttrainer.agents import CommandAgent, describe_train_change
from multiagenttrainer.agents.command import LOG_HEAD_BYTES, LOG_TAIL_BYTES, substitute
from multiagenttrainer.errors import ConfigError
from tests.agents.helpers import asset, process_gone, request_for

TRICKY_PROMPT = (
    "It's \"quoted\" and 'single-quoted'; $HOME ${PATH} `whoami` $(echo no) \\ back\\slash\n"
    "second line\twith a tab; {prompt_file} and {prompt} stay literal; 100% & | > < * ?\n"
)


def files_of(workspace: Path) -> dict[str, bytes]:
    return {str(p.relative_to(workspace)): p.read_bytes() for p in workspace.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- placeholders


def test_prompt_with_quotes_newlines_and_dollars_reaches_the_agent_unchanged(
    workspace: Path, tmp_path: Path
) -> None:
    received = tmp_path / "received.txt"
    agent = CommandAgent(f"printf %s {{prompt}} > {shlex.quote(str(received))}")
    outcome = agent.propose(request_for(workspace, prompt=TRICKY_PROMPT))
    assert outcome.exit_code == 0, outcome.log
    assert received.read_text() == TRICKY_PROMPT


@pytest.mark.parametrize("quote", ['"', "'"])
def test_a_placeholder_the_user_quoted_is_still_passed_as_one_argument(
    workspace: Path, tmp_path: Path, quote: str
) -> None:
    received = tmp_path / "received.txt"
    agent = CommandAgent(f"printf '%s|' {quote}{{prompt}}{quote} > {shlex.quote(str(received))}")
    agent.propose(request_for(workspace, prompt=TRICKY_PROMPT))
    assert received.read_text() == TRICKY_PROMPT + "|"


def test_prompt_file_holds_the_prompt_in_the_run_directory_outside_the_git_tree(
    workspace: Path, tmp_path: Path
) -> None:
    copy, where = tmp_path / "copy.txt", tmp_path / "where.txt"
    agent = CommandAgent(
        f"cat {{prompt_file}} > {shlex.quote(str(copy))}; printf %s {{prompt_file}} > {where}"
    )
    outcome = agent.propose(request_for(workspace, experiment_id=7, prompt=TRICKY_PROMPT))
    assert outcome.exit_code == 0, outcome.log
    assert copy.read_text() == TRICKY_PROMPT
    prompt_file = Path(where.read_text())
    assert prompt_file == workspace.resolve().parent / "prompts" / "exp-007.md"
    assert not prompt_file.is_relative_to(workspace.resolve())


def test_substitution_is_one_pass_so_a_prompt_naming_a_placeholder_is_not_expanded(tmp_path: Path) -> None:
    line = substitute("run {prompt} {prompt_file}", "say {prompt_file}", tmp_path / "p.md")
    assert line == f"run 'say {{prompt_file}}' {tmp_path / 'p.md'}"


def test_agent_gets_the_environment_plus_the_request_env(workspace: Path, tmp_path: Path) -> None:
    received = tmp_path / "env.txt"
    agent = CommandAgent(f'printf "%s %s" "$MAT_AGENT_TEST" "$PWD" > {received}')
    agent.propose(request_for(workspace, env={"MAT_AGENT_TEST": "from-request"}))
    assert received.read_text() == f"from-request {workspace}"


def test_an_empty_command_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="agent_command is empty"):
        CommandAgent("   ")


# ---------------------------------------------------------------- exit codes and output


def test_exit_code_and_both_output_streams_come_back_without_raising(workspace: Path) -> None:
    outcome = CommandAgent("echo to-stdout; echo to-stderr >&2; exit 3").propose(request_for(workspace))
    assert (outcome.exit_code, outcome.timed_out) == (3, False)
    assert "to-stdout" in outcome.log and "to-stderr" in outcome.log
    assert outcome.description == "no change"


def test_a_missing_executable_says_which_and_how_to_fix_it(workspace: Path) -> None:
    outcome = CommandAgent("no-such-agent-xyz -p {prompt}").propose(request_for(workspace))
    assert outcome.exit_code == 127
    expected = "agent command not found: no-such-agent-xyz; install it or set training.agent_command"
    assert outcome.description == expected
    assert expected in outcome.log


def test_stdin_is_closed_so_an_agent_reading_it_does_not_wait(workspace: Path) -> None:
    started = time.monotonic()
    outcome = CommandAgent("cat; echo read-all").propose(request_for(workspace, timeout_s=20))
    assert outcome.exit_code == 0 and "read-all" in outcome.log
    assert time.monotonic() - started < 10


def test_a_huge_output_is_kept_as_head_and_tail(workspace: Path) -> None:
    command = "echo FIRST-LINE; head -c 2000000 /dev/zero | tr '\\0' x; echo; echo LAST-LINE"
    outcome = CommandAgent(command).propose(request_for(workspace))
    assert outcome.log.startswith("FIRST-LINE")
    assert "LAST-LINE" in outcome.log and "bytes of agent output omitted" in outcome.log
    assert len(outcome.log) < LOG_HEAD_BYTES + LOG_TAIL_BYTES + 200


# ---------------------------------------------------------------- timeouts and process groups


def read_pids(pid_file: Path) -> list[int]:
    return [int(pid) for pid in pid_file.read_text().split()]


def test_timeout_stops_the_agent_and_its_children(workspace: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    agent = CommandAgent(f"{asset('hang.py')}", kill_grace_s=2)
    started = time.monotonic()
    outcome = agent.propose(request_for(workspace, timeout_s=2, env={"MAT_TEST_PID_FILE": str(pid_file)}))
    elapsed = time.monotonic() - started
    assert outcome.timed_out and outcome.exit_code != 0
    assert "timeout" in outcome.log
    parent, child = read_pids(pid_file)
    assert process_gone(parent) and process_gone(child)
    assert elapsed < 2 + 2 + 5


def test_an_agent_that_ignores_sigterm_is_killed_after_the_grace_period(
    workspace: Path, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pids"
    agent = CommandAgent(f"{asset('hang.py')} --ignore-term", kill_grace_s=0.5)
    outcome = agent.propose(request_for(workspace, timeout_s=1.5, env={"MAT_TEST_PID_FILE": str(pid_file)}))
    assert outcome.timed_out
    assert all(process_gone(pid) for pid in read_pids(pid_file))


def test_processes_left_running_after_the_agent_exits_are_stopped(workspace: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "background.pid"
    outcome = CommandAgent(f"sleep 300 & echo $! > {pid_file}; exit 0").propose(request_for(workspace))
    assert (outcome.exit_code, outcome.timed_out) == (0, False)
    assert process_gone(int(pid_file.read_text()))
    assert "left processes running" in outcome.log


# ---------------------------------------------------------------- descriptions


def test_description_comes_from_the_file_the_agent_wrote_which_is_then_removed(workspace: Path) -> None:
    outcome = CommandAgent(asset("edit_constant.py")).propose(request_for(workspace))
    assert outcome.exit_code == 0, outcome.log
    assert outcome.description == "set LEARNING_RATE to 1e-3"
    assert not (workspace / ".mat-description").exists()
    assert "LEARNING_RATE = 1e-3  # peak AdamW learning rate" in (workspace / "train.py").read_text()


def test_description_is_made_one_tsv_safe_line(workspace: Path) -> None:
    command = "printf '  lower\\tthe   LR  \\nmore\\n' > .mat-description"
    assert CommandAgent(command).propose(request_for(workspace)).description == "lower the LR"


def test_a_stale_description_file_does_not_describe_a_later_change(workspace: Path) -> None:
    (workspace / ".mat-description").write_text("left over from an earlier experiment\n")
    outcome = CommandAgent(asset("noop.py")).propose(request_for(workspace))
    assert outcome.description == "no change"
    assert not (workspace / ".mat-description").exists()


def test_description_from_the_diff_names_changed_constants(workspace: Path) -> None:
    command = f"EDIT_CONSTANT_VALUE=6e-3 {asset('edit_constant.py')} && rm .mat-description"
    outcome = CommandAgent(command).propose(request_for(workspace))
    assert outcome.description == "LEARNING_RATE 3e-3 -> 6e-3"


def test_description_from_the_diff_counts_lines_of_other_edits(workspace: Path) -> None:
    outcome = CommandAgent(f"{asset('break_train.py')} && rm .mat-description").propose(
        request_for(workspace)
    )
    assert outcome.description == "edited train.py (+3 -0 lines)"


def test_noop_agent_changes_nothing(workspace: Path) -> None:
    before = files_of(workspace)
    outcome = CommandAgent(asset("noop.py")).propose(request_for(workspace))
    assert (outcome.description, outcome.exit_code) == ("no change", 0)
    assert files_of(workspace) == before


def test_edit_prepare_agent_edits_both_files(workspace: Path) -> None:
    before = files_of(workspace)
    CommandAgent(asset("edit_prepare.py")).propose(request_for(workspace))
    after = files_of(workspace)
    assert {name for name in after if after[name] != before.get(name)} == {"prepare.py", "train.py"}
    assert b"EVAL_BYTES = 1_024" in after["prepare.py"]


BEFORE = "A = 1  # a\nLEARNING_RATE = 3e-3  # lr\nN_LAYER = 2\n\n\ndef f():\n    return A\n"


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (BEFORE, "no change"),
        (
            BEFORE.replace("3e-3", "1e-3").replace("N_LAYER = 2", "N_LAYER = 3"),
            "LEARNING_RATE 3e-3 -> 1e-3, N_LAYER 2 -> 3",
        ),
        (BEFORE.replace("return A", "return A + 1"), "edited train.py (+1 -1 lines)"),
        (
            BEFORE.replace("3e-3", "1e-3").replace("return A", "x = A\n    return x"),
            "LEARNING_RATE 3e-3 -> 1e-3; edited train.py (+2 -1 lines)",
        ),
        (BEFORE + "def broken(:\n", "edited train.py (+1 -0 lines)"),
    ],
)
def test_describe_train_change(after: str, expected: str) -> None:
    assert describe_train_change(BEFORE, after) == expected
