"""The Server agent's tools: start `mat serve` for the request's model, time it (openai client), stop it.

The server is `mat serve --job JOB` run as a child process (python -m multiagenttrainer.cli serve) in a
session of its own, on a free port (`--port 0`), with its output in `<request>/serve.log`; it is ready
when it has printed its URL and answers /health. endpoint.json records its URL and process while it
runs, so `mat request status` shows it and `mat request stop ID` ends it (only after checking that the
process is still that server). It is meant to outlive `mat request run`, so it is not tied to the
process that started it; every way out that does not leave it serving stops it.

Timing: one warm-up request, then `request.measure_requests` completions of exactly N tokens
(`min_tokens` = `max_tokens` = N, greedy) on held-out prompts, one at a time: p50 and p95 latency
(nearest rank) and generated tokens per second over all of them.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from multiagenttrainer.clock import now_iso
from multiagenttrainer.config import Config
from multiagenttrainer.errors import ServeError
from multiagenttrainer.processes import pid_alive, signal_group, start_in_session, wait_gone
from multiagenttrainer.request.estimates import percentile
from multiagenttrainer.request.store import ENDPOINT_FILE, Endpoint, read_endpoint, write_endpoint

SERVING_LINE = re.compile(r"^serving (http://\S+)/v1 ", re.MULTILINE)
START_TIMEOUT_S = 600.0  # a large model loads for minutes
STOP_GRACE_S = 15.0
REQUEST_TIMEOUT_S = 300.0
PROMPT_CHARS = 160
LOG_TAIL_CHARS = 1500
SERVE_CONFIG = "serve.yaml"
SERVE_LOG = "serve.log"


@dataclass
class SpeedReport:
    """What the Server agent measured through the endpoint."""

    url: str
    model: str
    requests: int
    latency_tokens: int
    p50_ms: float
    p95_ms: float
    tokens_per_s: float
    serving: bool  # still running after `mat request run`

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- starting and stopping


def write_serve_config(cfg: Config, folder: Path) -> Path:
    """serve.yaml: the request's job store and the `serve:` section on a free port."""
    document = {
        "finetuner": {"jobs_dir": str(folder / "jobs")},
        "serve": {**cfg.serve.model_dump(mode="json"), "port": 0},
    }
    path = folder / SERVE_CONFIG
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def serve_command(job_id: str, config: Path, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "multiagenttrainer.cli",
        "serve",
        "--job",
        job_id,
        "--config",
        str(config),
        "--port",
        "0",
        "--name",
        name,
        "--no-access-log",
    ]


def start_server(cfg: Config, folder: Path, job_id: str, name: str) -> Endpoint:
    """Start `mat serve` for the job and wait until it answers; endpoint.json is written."""
    log = folder / SERVE_LOG
    with log.open("wb") as output:
        process = start_in_session(
            serve_command(job_id, write_serve_config(cfg, folder), name),
            folder,
            output,
            {**os.environ, "NO_COLOR": "1"},
            contained=False,
        )
    endpoint = Endpoint(url="", model=name, pid=process.pid, log=str(log), started_at=now_iso())
    write_endpoint(folder, endpoint)
    try:
        url = wait_ready(process.pid, log, START_TIMEOUT_S, lambda: process.poll() is not None)
    except BaseException:
        stop_server(folder)
        process.wait()
        raise
    endpoint = Endpoint(f"{url}/v1", name, process.pid, str(log), endpoint.started_at)
    write_endpoint(folder, endpoint)
    return endpoint


def wait_ready(pid: int, log: Path, timeout_s: float, exited: Any) -> str:
    """The server's URL once it printed it and /health answers 200; ServeError with its log otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(encoding="utf-8", errors="replace")
        if exited():
            raise ServeError(
                f"mat serve exited before it was ready; the end of {log}:\n{text[-LOG_TAIL_CHARS:]}"
            )
        match = SERVING_LINE.search(text)
        if match and health(match.group(1)) == 200:
            return match.group(1)
        time.sleep(0.2)
    raise ServeError(f"mat serve did not answer within {timeout_s:.0f} s; see {log}")


def health(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def is_mat_server(pid: int) -> bool:
    """Whether `pid` still runs `mat serve` (a recorded pid may belong to another process by now)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid_alive(pid) and not Path("/proc/self").exists()  # without /proc, trust the record
    return b"multiagenttrainer.cli" in words and b"serve" in words


def stop_server(folder: Path) -> bool:
    """Stop the request's server (its whole process group) and forget it; whether one was running."""
    endpoint = read_endpoint(folder)
    if endpoint is None:
        return False
    running = pid_alive(endpoint.pid) and is_mat_server(endpoint.pid)
    if running:
        signal_group(endpoint.pid, signal.SIGTERM)
        if not wait_gone(endpoint.pid, STOP_GRACE_S):
            signal_group(endpoint.pid, signal.SIGKILL)
            wait_gone(endpoint.pid, STOP_GRACE_S)
    (folder / ENDPOINT_FILE).unlink(missing_ok=True)
    return running


# --------------------------------------------------------------------------- timing


def api_key(cfg: Config) -> str:
    """The key the server wants (serve.api_key_env), or a placeholder when it wants none."""
    variable = cfg.serve.api_key_env
    return os.environ.get(variable, "") if variable else "no-key"


def measure(endpoint: Endpoint, key: str, prompts: list[str], tokens: int, requests: int) -> SpeedReport:
    """Time `requests` completions of exactly `tokens` tokens through the openai client."""
    import openai

    client = openai.OpenAI(
        base_url=endpoint.url, api_key=key or "no-key", max_retries=0, timeout=REQUEST_TIMEOUT_S
    )
    prompts = [p[-PROMPT_CHARS:] for p in prompts if p.strip()] or ["def "]
    timings, generated = [], 0
    try:
        for index in range(requests + 1):
            started = time.perf_counter()
            answer = client.completions.create(
                model=endpoint.model,
                prompt=prompts[index % len(prompts)],
                max_tokens=tokens,
                temperature=0,
                extra_body={"min_tokens": tokens},
            )
            if index:  # the first request warms the server up
                timings.append(time.perf_counter() - started)
                generated += answer.usage.completion_tokens if answer.usage else 0
    except openai.OpenAIError as exc:
        raise ServeError(f"the served model at {endpoint.url} did not answer: {exc}") from exc
    return SpeedReport(
        url=endpoint.url,
        model=endpoint.model,
        requests=requests,
        latency_tokens=tokens,
        p50_ms=round(percentile(timings, 50) * 1000, 1),
        p95_ms=round(percentile(timings, 95) * 1000, 1),
        tokens_per_s=round(generated / sum(timings), 2),
        serving=True,
    )
