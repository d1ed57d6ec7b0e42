"""`mat serve` on the tiny Llama, driven with the official openai client as a user would."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
import urllib.parse
from pathlib import Path

import openai
import pytest

from tests.serve.conftest import API_KEY, MAX_BODY_BYTES, MAX_TOKENS, MODEL_NAME, Servers
from tests.support.mat_serve import ServeProcess, health

pytestmark = pytest.mark.integration

PROMPT = "def handler_1_2(request, limit=2):\n"


def raw_request(
    url: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, object]]:
    """Send one request with http.client; (status, JSON body)."""
    parsed = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


# --------------------------------------------------------------------------- the endpoints


def test_models_and_health(served: ServeProcess, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    assert health(served.url) == 200  # no key needed for the probe
    banner = served.output
    assert "engine: transformers (cpu, 1 thread; no adapter)" in banner
    assert f"model: {MODEL_NAME}" in banner and "bearer key required" in banner


def test_completion(client: openai.OpenAI) -> None:
    result = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0)
    assert result.object == "text_completion" and result.id.startswith("cmpl-") and result.created > 0
    assert result.model == MODEL_NAME and len(result.choices) == 1
    choice = result.choices[0]
    assert choice.finish_reason in ("length", "stop") and choice.text
    assert result.usage is not None and result.usage.prompt_tokens > 0
    assert result.usage.completion_tokens <= 12
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens


def test_streamed_completion_matches_the_plain_one(client: openai.OpenAI) -> None:
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=20, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt=PROMPT,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage == plain.usage
    assert len({c.id for c in chunks}) == 1


def test_stop_sequence_ends_the_text_before_it(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=30, temperature=0)
    text = full.choices[0].text
    stop = text[6:9]
    expected = text[: text.index(stop)]
    cut = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == expected and cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=30, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected


def test_sampling_with_a_seed_repeats(client: openai.OpenAI) -> None:
    def sample() -> str:
        result = client.completions.create(
            model=MODEL_NAME, prompt=PROMPT, max_tokens=16, temperature=0.9, top_p=0.95, seed=7
        )
        return result.choices[0].text

    assert sample() == sample()


def test_chat_uses_the_plain_format_without_a_template(client: openai.OpenAI, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "list items"}]
    result = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0)
    assert result.object == "chat.completion" and result.id.startswith("chatcmpl-")
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].finish_reason in ("length", "stop")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = tokenizer("System: Be brief.\nUser: list items\nAssistant:")["input_ids"]
    assert result.usage is not None and result.usage.prompt_tokens == len(expected)


def test_streamed_chat(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hello"}]
    plain = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0, stream=True
        )
    )
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


# --------------------------------------------------------------------------- refusals


def test_a_wrong_or_missing_key_is_refused(served: ServeProcess) -> None:
    wrong = openai.OpenAI(base_url=served.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    status, body = raw_request(served.url, "GET", "/v1/models")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"  # type: ignore[index]
    assert API_KEY not in served.output


def test_max_tokens_over_the_limit_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match=f"limit of {MAX_TOKENS}"):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=MAX_TOKENS + 1)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=MODEL_NAME, prompt="handler " * 80, max_tokens=MAX_TOKENS)


def test_a_body_over_the_limit_is_a_413(served: ServeProcess, client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model=MODEL_NAME, prompt="x" * (MAX_BODY_BYTES + 1), max_tokens=1)
    assert caught.value.status_code == 413
    # a chunked body (no Content-Length) is cut off as well
    chunks = (b"x" * 1024 for _ in range(8))
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    status, body = raw_request(served.url, "POST", "/v1/completions", chunks, headers)  # type: ignore[arg-type]
    assert status == 413 and "serve.max_body_bytes" in body["error"]["message"]  # type: ignore[index]


def test_bad_requests_get_openai_error_bodies(served: ServeProcess, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="n=2"):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1, n=2)
    with pytest.raises(openai.UnprocessableEntityError, match="temperature"):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1, temperature=5)
    with pytest.raises(openai.BadRequestError, match="role 'tool'"):
        client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}], max_tokens=1
        )
    headers = {"Authorization": f"Bearer {API_KEY}"}
    for body, status in (
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (b'{"model": "tiny", "prompt": [99999]}', 400),
    ):
        got, answer = raw_request(served.url, "POST", "/v1/completions", body, headers)
        assert got == status and set(answer["error"]) == {"message", "type", "code", "param"}  # type: ignore[arg-type]
    got, answer = raw_request(served.url, "GET", "/v1/nothing", headers=headers)
    assert got == 404 and "POST /v1/completions" in answer["error"]["message"]  # type: ignore[index]
    assert "Traceback" not in served.output


def test_token_id_prompts_are_accepted(client: openai.OpenAI) -> None:
    result = client.completions.create(model=MODEL_NAME, prompt=[5, 6, 7], max_tokens=3, temperature=0)
    assert result.usage is not None and result.usage.prompt_tokens == 3


# --------------------------------------------------------------------------- load


def test_sixteen_concurrent_clients_all_succeed(served: ServeProcess) -> None:
    results: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(16)

    def one_client(index: int) -> None:
        client = openai.OpenAI(base_url=served.base_url, api_key=API_KEY, max_retries=0, timeout=120)
        start.wait()
        try:
            if index % 2:
                chunks = client.completions.create(
                    model=MODEL_NAME, prompt=f"{PROMPT}{index}", max_tokens=16, stream=True
                )
                results.append("".join(c.choices[0].text for c in chunks if c.choices))
            else:
                messages = [{"role": "user", "content": f"request {index}"}]
                answer = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16)
                results.append(answer.choices[0].message.content or "")
        except BaseException as exc:  # collected, reported below
            errors.append(exc)

    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not errors, errors
    assert len(results) == 16
    assert health(served.url) == 200


# --------------------------------------------------------------------------- start and stop


def test_a_busy_port_is_a_clear_error(served: ServeProcess, tiny_model_dir: Path, tmp_path: Path) -> None:
    port = urllib.parse.urlparse(served.url).port
    server = ServeProcess(["--model", str(tiny_model_dir), "--port", str(port)], tmp_path / "busy.log")
    try:
        code = server.process.wait(timeout=120)
    finally:
        server.close()
    assert code == 1, server.output
    assert f"port {port} on 127.0.0.1 is already in use" in server.output
    assert "--port 0 picks a free one" in server.output and "Traceback" not in server.output


def test_ctrl_c_stops_the_server_during_a_stream(servers: Servers, tiny_model_dir: Path) -> None:
    server = servers.interruptible
    server.wait_ready()
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    stream = client.completions.create(
        model=tiny_model_dir.name, prompt=PROMPT, max_tokens=100, stream=True, extra_body={"min_tokens": 100}
    )
    next(iter(stream))  # the stream is running
    started = time.monotonic()
    code = server.stop(signal.SIGINT, timeout_s=15)
    assert code == 130, server.output
    assert time.monotonic() - started < 10
    assert "stopped" in server.output and "Traceback" not in server.output
