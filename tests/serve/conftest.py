"""Fixtures for `mat serve`: tiny Llamas (with and without a chat template), a finished fine-tune job,
and `mat serve` processes on free 127.0.0.1 ports, driven with the official openai client."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.support.mat_serve import ServeProcess, serve_env
from tests.support.tiny_model import (
    CHATML_TEMPLATE,
    build_tiny_model,
    corpus_dir,
    tiny_model_dir,
    train_tiny_job,
)

__all__ = ["corpus_dir", "tiny_model_dir"]  # session fixtures from tests/support

KEY_ENV = "SERVE_TEST_KEY"
API_KEY = "sk-test-7f3a9c41d2"  # a value made up for these tests
MAX_TOKENS = 64
MAX_BODY_BYTES = 4096
MODEL_NAME = "tiny"


def write_config(folder: Path, serve: dict[str, Any], finetuner: dict[str, Any] | None = None) -> Path:
    """mat.yaml in `folder` with this `serve:` section (and a finetuner section when given)."""
    document: dict[str, Any] = {"serve": serve}
    if finetuner is not None:
        document["finetuner"] = finetuner
    path = folder / "mat.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with a ChatML-style chat template in its tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-chat-llama"), chat_template=CHATML_TEMPLATE)


class Servers:
    """The session's `mat serve` processes, started together: their loading overlaps the job's training.

    - main: the tiny Llama as MODEL_NAME, with a bearer key (KEY_ENV) and small limits;
    - interruptible: the tiny Llama without a key or config limits, for the Ctrl-C test;
    - job: `--job` of a finished fine-tune job, 2 requests at a time.
    """

    def __init__(self, folder: Path, tiny_model: Path, chat_model: Path, corpus: Path) -> None:
        self.started: list[ServeProcess] = []
        try:
            self.start_all(folder, tiny_model, chat_model, corpus)
        except BaseException:
            self.close()
            raise

    def start(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> ServeProcess:
        server = ServeProcess(args, log, env)
        self.started.append(server)
        return server

    def start_all(self, folder: Path, tiny_model: Path, chat_model: Path, corpus: Path) -> None:
        config = write_config(
            folder, {"api_key_env": KEY_ENV, "max_tokens": MAX_TOKENS, "max_body_bytes": MAX_BODY_BYTES}
        )
        main_args = ["--model", str(tiny_model), "--name", MODEL_NAME, "--port", "0", "--config", str(config)]
        self.main = self.start(main_args, folder / "main.log", serve_env(**{KEY_ENV: API_KEY}))
        (folder / "plain").mkdir()
        plain = write_config(folder / "plain", {})
        plain_args = ["--model", str(tiny_model), "--port", "0", "--config", str(plain)]
        self.interruptible = self.start(plain_args, folder / "interruptible.log")
        self.job_config, self.job = train_tiny_job(folder / "job", chat_model, corpus)
        document = yaml.safe_load(self.job_config.read_text(encoding="utf-8"))
        document["serve"] = {"max_concurrent_requests": 2, "max_tokens": 120}
        job_serve_config = folder / "job" / "serve.yaml"
        job_serve_config.write_text(yaml.safe_dump(document), encoding="utf-8")
        job_args = ["--job", self.job.id, "--config", str(job_serve_config), "--port", "0"]
        self.job_server = self.start(job_args, folder / "job.log")

    def close(self) -> None:
        """Kill whatever still runs."""
        for server in self.started:
            server.close()


@pytest.fixture(scope="session")
def servers(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, chat_model_dir: Path, corpus_dir: Path
) -> Iterator[Servers]:
    """Every server of the session, starting; each fixture below waits for its own."""
    started = Servers(tmp_path_factory.mktemp("servers"), tiny_model_dir, chat_model_dir, corpus_dir)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture(scope="session")
def served(servers: Servers) -> Iterator[ServeProcess]:
    """The main server, ready; stopped with SIGTERM at the end (exit code 0)."""
    servers.main.wait_ready()
    yield servers.main
    assert servers.main.stop(signal.SIGTERM) == 0, servers.main.output


@pytest.fixture
def client(served: ServeProcess) -> openai.OpenAI:
    """The openai client for the served tiny model, with the right key and no retries."""
    return openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def finished_job(servers: Servers) -> tuple[Path, Any]:
    """A completed open-source fine-tune job (3 LoRA steps on the chat-template Llama): (mat.yaml, record)."""
    return servers.job_config, servers.job


@pytest.fixture(scope="session")
def job_server(servers: Servers) -> ServeProcess:
    """`mat serve --job ID` for the finished job, ready."""
    servers.job_server.wait_ready()
    return servers.job_server
