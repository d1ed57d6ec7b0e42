"""The vLLM engine: vLLM's own OpenAI server as a supervised child process on a private loopback port.

mat's app stays in front (the same key, limits, names and wire format as with transformers); this
engine forwards each generation to the child's `/v1/completions`, with the prompt as token ids (so
the chat template is applied once, here) and the LoRA adapter chosen by name: the child runs with
`--enable-lora --lora-modules adapter=<folder> --max-lora-rank R`. With `merge`, the adapter is
merged into a temporary copy of the base first and the child serves that, without LoRA.

The child starts in a session of its own, with SIGTERM as its parent-death signal, logs to a file
(its tail is shown when it fails to start), and is stopped with its whole process group on close.
Linux sends the parent-death signal when the *thread* that started the child ends, so create the
engine on a thread that lives as long as it (the main thread, as `mat serve` does).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import httpx
import orjson

from multiagenttrainer.errors import ServeError
from multiagenttrainer.processes import die_with_parent_hook
from multiagenttrainer.serve.engine import (
    ChatPrompt,
    Completion,
    Delta,
    EngineOptions,
    EngineUnavailable,
    Finished,
    FinishReason,
    ModelSpec,
    RequestRejected,
    SamplingParams,
    StreamEvent,
    tokenizer_source,
)
from multiagenttrainer.serve.text import render_chat

START_TIMEOUT_S = 900  # a large model's first load (weights, CUDA graphs) takes minutes
STOP_GRACE_S = 15
POLL_S = 0.5
LOG_TAIL_LINES = 20
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM's --max-lora-rank accepts
BASE_NAME, ADAPTER_NAME = "base", "adapter"  # the child's model names, private to this engine

Launcher = Callable[[ModelSpec, int], list[str]]


# --------------------------------------------------------------------------- the child's command line


def lora_rank(adapter: Path) -> int:
    """The adapter's rank `r` from its adapter_config.json (16 when it does not say)."""
    from multiagenttrainer.finetune.export import read_adapter_config

    rank = read_adapter_config(adapter).get("r", 16)
    return rank if isinstance(rank, int) and rank > 0 else 16


def max_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank value vLLM accepts that fits `rank`."""
    return next((r for r in LORA_RANKS if r >= rank), LORA_RANKS[-1])


def vllm_command(spec: ModelSpec, port: int) -> list[str]:
    """vLLM's OpenAI server for the spec on 127.0.0.1:port, with the adapter as a LoRA module."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.base]
    command += ["--served-model-name", BASE_NAME, "--host", "127.0.0.1", "--port", str(port)]
    if spec.adapter is not None and not spec.merge:
        command += ["--enable-lora", "--lora-modules", f"{ADAPTER_NAME}={spec.adapter}"]
        command += ["--max-lora-rank", str(max_lora_rank(lora_rank(spec.adapter)))]
    return command


def upstream_model(spec: ModelSpec) -> str:
    """The name the child serves the spec's model under."""
    return ADAPTER_NAME if spec.adapter is not None and not spec.merge else BASE_NAME


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --------------------------------------------------------------------------- the child process


def start_child(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start the server in a session of its own, output to log_path."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent_hook(signal.SIGTERM),
        )


def log_tail(log_path: Path) -> str:
    """The last lines of the child's log."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL_LINES:])


def wait_ready(process: subprocess.Popen[bytes], base_url: str, log_path: Path, timeout_s: float) -> None:
    """Return once the child answers GET /health; ServeError with its log tail if it exits or hangs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServeError(
                f"the model server exited with code {process.returncode} while loading; "
                f"the end of its log ({log_path}):\n{log_tail(log_path)}"
            )
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(POLL_S)
    raise ServeError(f"the model server did not answer within {timeout_s:.0f} s; its log: {log_path}")


def stop_child(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's process group, SIGKILL what is left after a grace period."""
    from multiagenttrainer.processes import stop_group

    stop_group(process.pid, process, grace_s=STOP_GRACE_S)


# --------------------------------------------------------------------------- answers from the child


def raise_for_answer(status: int, body: bytes) -> None:
    """RequestRejected for the child's 4xx (its message kept), EngineUnavailable for anything else."""
    if status < 400:
        return
    message = error_message(body)
    if 400 <= status < 500:
        raise RequestRejected(message)
    raise EngineUnavailable(f"the model server failed ({status}): {message}")


def error_message(body: bytes) -> str:
    """The message of an OpenAI error body, or the body's start."""
    try:
        data = orjson.loads(body)
        return str(data["error"]["message"] if isinstance(data.get("error"), dict) else data["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return body[:300].decode("utf-8", errors="replace")


def finish_reason(value: object) -> FinishReason:
    """OpenAI's finish_reason as ours ("length" stays, anything else is a stop)."""
    return "length" if value == "length" else "stop"


def completion_from(data: Any, prompt_tokens: int) -> Completion:
    """A Completion from the child's JSON answer; EngineUnavailable when it has another shape."""
    try:
        choice = data["choices"][0]
        used = int((data.get("usage") or {}).get("completion_tokens", 0))
        return Completion(
            str(choice["text"]), finish_reason(choice.get("finish_reason")), prompt_tokens, used
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise EngineUnavailable(f"the model server answered in an unexpected shape: {exc!r}") from exc


def sse_data(line: str) -> Any | None:
    """The JSON of a `data:` line (None for other lines and for [DONE])."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise EngineUnavailable(f"the model server sent a broken event: {payload[:100]!r}") from exc


# --------------------------------------------------------------------------- the engine


class VllmEngine:
    """vLLM's server in a child process, driven over HTTP on loopback; see the module docstring."""

    name = "vllm"

    def __init__(self, spec: ModelSpec, options: EngineOptions, launcher: Launcher = vllm_command) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.spec, self.workdir = spec, Path(tempfile.mkdtemp(prefix="mat-vllm-"))
        self.stopping = self.closed = False
        self._tokenizer_lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        try:
            served = self.prepare_spec(spec)
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(spec))
            self._vocab_size = int(AutoConfig.from_pretrained(served.base).vocab_size)
            self.start(served, launcher)
        except (OSError, ValueError) as exc:
            self.close()
            raise ServeError(f"cannot start vLLM for {spec.base!r}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def prepare_spec(self, spec: ModelSpec) -> ModelSpec:
        """The spec the child serves: the adapter merged into a temporary base copy when asked to."""
        if spec.adapter is None or not spec.merge:
            return spec
        from multiagenttrainer.finetune.export import merge_adapter

        merged = self.workdir / "merged"
        merged.mkdir()
        merge_adapter(spec.base, spec.adapter, merged)
        return ModelSpec(base=str(merged), name=spec.name, adapter=None)

    def start(self, served: ModelSpec, launcher: Launcher) -> None:
        """Start the child and wait until it answers; remember its context length."""
        port = free_port()
        self.base_url, self.log_path = f"http://127.0.0.1:{port}", self.workdir / "vllm.log"
        self.upstream = upstream_model(self.spec)
        self.process = start_child(launcher(served, port), self.log_path)
        wait_ready(self.process, self.base_url, self.log_path, START_TIMEOUT_S)
        self.client = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(None, connect=10))
        self._context_length = self.read_context_length()

    def read_context_length(self) -> int | None:
        """max_model_len from the child's /v1/models (None when it does not say)."""
        try:
            models = self.client.get("/v1/models").json()["data"]
            value = next(m.get("max_model_len") for m in models if m.get("id") == self.upstream)
        except (httpx.HTTPError, ValueError, KeyError, TypeError, StopIteration):
            return None
        return value if isinstance(value, int) else None

    @property
    def description(self) -> str:
        """`vllm (cuda; LoRA adapter via --enable-lora; log ...)`."""
        if self.spec.adapter is None:
            mode = "no adapter"
        else:
            mode = "adapter merged" if self.spec.merge else "LoRA adapter via --enable-lora"
        return f"vllm (cuda; {mode}; its log: {self.log_path})"

    @property
    def context_length(self) -> int | None:
        """The child's max_model_len."""
        return self._context_length

    @property
    def vocab_size(self) -> int:
        """The model config's vocab_size."""
        return self._vocab_size

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """Token ids with the local copy of the model's tokenizer."""
        with self._tokenizer_lock:  # a fast tokenizer may update its settings in place: one caller at a time
            ids: list[int] = self.tokenizer(text, add_special_tokens=special_tokens)["input_ids"]
        if not ids and self.tokenizer.bos_token_id is not None:
            ids = [self.tokenizer.bos_token_id]
        return ids

    def chat_prompt(self, messages: list[dict[str, str]]) -> ChatPrompt:
        """The tokenizer's chat template, or the plain format."""
        return render_chat(self.tokenizer, messages)

    def payload(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> dict[str, Any]:
        """The child's /v1/completions request for one generation."""
        body: dict[str, Any] = {
            "model": self.upstream,
            "prompt": prompt_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": list(params.stop) or None,
            "seed": params.seed,
            "min_tokens": params.min_tokens,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """A whole completion from the child."""
        self.check_open()
        try:
            response = self.client.post("/v1/completions", json=self.payload(prompt_ids, params, False))
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"the model server did not answer: {exc}") from exc
        raise_for_answer(response.status_code, response.content)
        try:
            data = response.json()
        except ValueError as exc:
            raise EngineUnavailable("the model server answered with something other than JSON") from exc
        return completion_from(data, len(prompt_ids))

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Generator[StreamEvent, None, None]:
        """Deltas relayed from the child's event stream; closing the iterator drops the connection."""
        self.check_open()
        payload = self.payload(prompt_ids, params, True)
        reason: FinishReason = "stop"
        used = 0
        try:
            with self.client.stream("POST", "/v1/completions", json=payload) as response:
                if response.status_code >= 400:
                    raise_for_answer(response.status_code, response.read())
                for line in response.iter_lines():
                    data = sse_data(line)
                    if data is None:
                        continue
                    if isinstance(data.get("error"), dict):
                        raise_for_answer(500, orjson.dumps(data))
                    for choice in data.get("choices") or []:
                        if choice.get("text"):
                            yield Delta(str(choice["text"]))
                        if choice.get("finish_reason"):
                            reason = finish_reason(choice["finish_reason"])
                    used = int((data.get("usage") or {}).get("completion_tokens", used))
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"the model server stopped answering: {exc}") from exc
        yield Finished(reason, len(prompt_ids), used)

    def check_open(self) -> None:
        """EngineUnavailable once closed or when the child has died."""
        if not self.healthy():
            raise EngineUnavailable("the model server is not running; restart `mat serve`")

    def healthy(self) -> bool:
        """Whether the child still runs and the engine takes requests."""
        return not self.stopping and self.process is not None and self.process.poll() is None

    def shutdown(self) -> None:
        """Refuse new requests; those in flight end when close() stops the child."""
        self.stopping = True

    def close(self) -> None:
        """Stop the child (its whole process group) and remove the temporary folder."""
        if self.closed:
            return
        self.stopping = self.closed = True
        if self.process is not None:
            stop_child(self.process)
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
