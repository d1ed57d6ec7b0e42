"""What log records reach the terminal from a `mat` process: mat's own as its `warning:`/`error:` lines,
other libraries' (urllib3, PyGithub, botocore) never, unless PREFECT_LOGGING_LEVEL asks for everything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

EMIT = """
import logging
from multiagenttrainer.cli.common import configure_console_logging

configure_console_logging()
logging.getLogger("urllib3.connectionpool").warning("Retrying (Retry(total=2)) after connection broken")
logging.getLogger("github.GithubRetry").warning("Rate limit hit, waiting")
logging.getLogger("botocore.credentials").error("noise from botocore")
logging.getLogger("multiagenttrainer.retry").warning("source 'acme': 502; trying again in 2 s")
logging.getLogger("multiagenttrainer.experiments.runner").error("could not record how run r ended: disk full")
logging.getLogger("multiagenttrainer.ingest").info("an info record stays off the terminal")
"""


def emitted(**env: str) -> subprocess.CompletedProcess[str]:
    environment = (
        {k: v for k, v in os.environ.items() if k != "PREFECT_LOGGING_LEVEL"} | env | {"NO_COLOR": "1"}
    )
    return subprocess.run(
        [sys.executable, "-c", EMIT],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_only_mats_own_records_reach_the_terminal_as_its_own_lines() -> None:
    result = emitted()
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "warning: source 'acme': 502; trying again in 2 s",
        "error: could not record how run r ended: disk full",
    ]


@pytest.mark.parametrize("level", ["DEBUG", "INFO"])
def test_a_verbose_prefect_logging_level_leaves_every_record_on(level: str) -> None:
    result = emitted(PREFECT_LOGGING_LEVEL=level)
    assert "Rate limit hit, waiting" in result.stderr and "noise from botocore" in result.stderr
