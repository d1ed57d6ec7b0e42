"""`mat serve` as the tests run it: the real entry point in a subprocess, its URL read from its output.

`ServeProcess.start(...)` runs `python -m multiagenttrainer.cli serve ARGS` with its output in a log
file, waits for the `serving http://HOST:PORT/v1` line and a healthy `/health`, and `stop(signal)`
ends it and returns the exit code. Nothing is left running: `close()` kills whatever is still there.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVING_LINE = re.compile(r"^serving (http://\S+)/v1 ", re.MULTILINE)
START_TIMEOUT_S = 180
STOP_TIMEOUT_S = 30


def serve_env(**extra: str) -> dict[str, str]:
    """The environment of a `mat serve` subprocess: offline hub, one torch thread, plain output."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def health(url: str) -> int:
    """The status of GET /health (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


class ServeProcess:
    """One `mat serve` subprocess and its log."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.args, self.log = args, log
        with log.open("wb") as handle:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "multiagenttrainer.cli", "serve", *args],
                cwd=ROOT,
                env=env or serve_env(),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        self.url = ""

    @classmethod
    def start(cls, args: list[str], log: Path, env: dict[str, str] | None = None) -> ServeProcess:
        """Start `mat serve ARGS` and wait until it answers /health with 200."""
        server = cls(args, log, env)
        try:
            server.wait_ready()
        except BaseException:
            server.close()
            raise
        return server

    @property
    def output(self) -> str:
        """Everything the server printed so far."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (`.../v1`)."""
        return f"{self.url}/v1"

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait for the `serving` line, then for /health to answer 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"mat serve exited with {self.process.returncode}:\n{self.output}")
            match = SERVING_LINE.search(self.output)
            if match and health(match.group(1)) == 200:
                self.url = match.group(1)
                return
            time.sleep(0.1)
        raise AssertionError(f"mat serve did not become ready in {timeout_s:.0f} s:\n{self.output}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Send `sig` and return the exit code (AssertionError if it does not exit in time)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            message = f"mat serve did not stop {timeout_s:.0f} s after {sig!r}:\n{self.output}"
            raise AssertionError(message) from None

    def close(self) -> None:
        """Kill the server if it still runs."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)
