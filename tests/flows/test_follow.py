"""How `--deployment` reports a flow run that did not complete: the message and the exit code mat would
give the same failure in-process (2 for a configuration error, 1 otherwise)."""

from __future__ import annotations

import uuid

import pytest
from prefect.client.schemas.objects import FlowRun, State
from prefect.states import Cancelled, Crashed, Failed

from multiagenttrainer.cli.follow import error_of

RAISED = "Flow run encountered an exception: "  # how Prefect words a flow run that raised


def ended(state: State) -> FlowRun:
    return FlowRun(flow_id=uuid.uuid4(), name="nimble-fox", state=state)


@pytest.mark.parametrize(
    ("state", "message", "code"),
    [
        (
            Failed(message=f"{RAISED}ConfigError: sources[0].path: missing (mat.yaml:3)"),
            "sources[0].path: missing (mat.yaml:3)",
            2,
        ),
        (
            Failed(message=f"{RAISED}IngestIncomplete: 1 of 2 sources failed"),
            "1 of 2 sources failed",
            1,
        ),
        (
            Failed(message=f"{RAISED}ZeroDivisionError: division by zero"),
            "flow run nimble-fox failed: ZeroDivisionError: division by zero",
            1,
        ),
        (
            Crashed(message="Flow run infrastructure exited with non-zero status code -9."),
            "flow run nimble-fox crashed: Flow run infrastructure exited with non-zero status code -9.",
            1,
        ),
        (
            Cancelled(message="cancelled from mat (Ctrl-C)"),
            "flow run nimble-fox cancelled: cancelled from mat (Ctrl-C)",
            1,
        ),
    ],
)
def test_a_flow_run_that_did_not_complete_is_one_line_and_the_in_process_exit_code(
    state: State, message: str, code: int
) -> None:
    assert error_of(ended(state)) == (message, code)
