"""The `mat` command's entry point: light, so that a Ctrl-C while the command line itself is still being
loaded (its imports take about half a second) also ends in one line and exit code 130."""

from __future__ import annotations

import sys

from multiagenttrainer.errors import INTERRUPTED_MESSAGE


def main() -> None:
    """Console-script entry point: load the command line, then run it (multiagenttrainer.cli.main)."""
    try:
        from multiagenttrainer.cli import main as run_command
    except KeyboardInterrupt:
        print(INTERRUPTED_MESSAGE, file=sys.stderr)
        raise SystemExit(130) from None
    run_command()
