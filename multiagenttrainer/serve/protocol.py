"""OpenAI's wire format: request models, the checks OpenAI clients expect, and response bodies.

Requests are validated with pydantic (a wrong type or range is a 422); options this server does not
implement are refused with a 400 that names them, rather than silently ignored (`n` > 1, `logprobs`,
`echo`, tools, penalties...). Unknown fields are ignored, as clients send fields of newer API
versions. Bodies are plain dicts: ids (`cmpl-...`, `chatcmpl-...`), `object`, `created`, `model`,
`choices`, `usage`; stream chunks are server-sent events ending with `data: [DONE]`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from multiagenttrainer.serve.engine import Completion, FinishReason

MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256  # held-back text is checked against every stop at each token
RequestT = TypeVar("RequestT", bound=BaseModel)
OPENAI_DEFAULT_COMPLETION_TOKENS = 16  # what OpenAI's legacy completions endpoint generates by default


class ApiError(Exception):
    """An error answered in OpenAI's shape: `{"error": {"message", "type", "code", "param"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body of the answer."""
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "code": code, "param": param}}


# --------------------------------------------------------------------------- requests


class Lenient(BaseModel):
    """Unknown fields are ignored: clients send fields from newer API versions."""

    model_config = ConfigDict(extra="ignore")


class StreamOptions(Lenient):
    include_usage: bool = False


class GenerationRequest(Lenient):
    """The fields completions and chat completions share."""

    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    min_tokens: int | None = Field(None, ge=0, description="vLLM's extension: generate at least this many")
    max_tokens: int | None = Field(None, ge=1)


class CompletionRequest(GenerationRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | None = None
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class ContentPart(Lenient):
    type: str
    text: str | None = None


class ChatMessage(Lenient):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatRequest(GenerationRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None


def parse_request(raw: bytes, model: type[RequestT]) -> RequestT:
    """The body as `model`: 400 when it is not JSON, 422 listing what does not validate."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_request")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(422, validation_message(exc), code="invalid_request", param=first_param(exc)) from exc


def validation_message(exc: ValidationError) -> str:
    """`field: problem` per invalid field (the first five); a union's alternatives make one problem."""
    by_field: dict[str, list[dict[str, Any]]] = {}
    for error in exc.errors():
        by_field.setdefault(dotted(error["loc"]) or "body", []).append(dict(error))
    problems = [f"{field}: {describe(errors)}" for field, errors in list(by_field.items())[:5]]
    return "invalid request: " + "; ".join(problems)


def describe(errors: list[dict[str, Any]]) -> str:
    """One field's problem: pydantic's message, or the wrong type when no alternative of a union fits."""
    if len(errors) == 1:
        return str(errors[0]["msg"])
    return f"has the wrong type ({type(errors[0]['input']).__name__})"


def first_param(exc: ValidationError) -> str | None:
    """The dotted path of the first invalid field."""
    errors = exc.errors()
    return dotted(errors[0]["loc"]) or None if errors else None


UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def dotted(loc: tuple[Any, ...]) -> str:
    """A pydantic location as `messages.0.content`, without the names of union alternatives."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and (p in UNION_TAGS or "[" in p))]
    return ".".join(parts)


# --------------------------------------------------------------------------- unsupported options


def unsupported(param: str, why: str) -> ApiError:
    """A 400 naming an option this server does not implement."""
    return ApiError(400, f"{param}: {why}", code="unsupported_parameter", param=param)


def check_common(request: GenerationRequest) -> None:
    """Refuse the shared options this server does not implement."""
    if request.n not in (None, 1):
        raise unsupported("n", f"n={request.n} is not supported; this server returns one choice, send n=1")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name):
            raise unsupported(name, "penalties are not supported; leave it unset or 0")
    if request.logit_bias:
        raise unsupported("logit_bias", "logit_bias is not supported")
    stops = stop_sequences(request)
    if len(stops) > MAX_STOP_SEQUENCES or any(len(stop) > MAX_STOP_CHARS for stop in stops):
        why = f"at most {MAX_STOP_SEQUENCES} stop sequences of up to {MAX_STOP_CHARS} characters each"
        raise ApiError(400, f"stop: {why}", param="stop")


def check_completion(request: CompletionRequest) -> None:
    """Refuse completion options this server does not implement."""
    check_common(request)
    if request.best_of not in (None, 1):
        raise unsupported("best_of", "best_of is not supported; send best_of=1")
    if request.echo:
        raise unsupported("echo", "echo is not supported")
    if request.logprobs is not None:
        raise unsupported("logprobs", "logprobs are not supported")
    if request.suffix:
        raise unsupported("suffix", "suffix (insertion) is not supported")


def check_chat(request: ChatRequest) -> None:
    """Refuse chat options this server does not implement."""
    check_common(request)
    if request.logprobs or request.top_logprobs:
        raise unsupported("logprobs", "logprobs are not supported")
    if request.tools or request.functions or request.tool_choice not in (None, "none"):
        raise unsupported("tools", "tools and function calling are not supported")
    if request.response_format and request.response_format.get("type", "text") != "text":
        raise unsupported("response_format", "only {'type': 'text'} is supported")


def stop_sequences(request: GenerationRequest) -> tuple[str, ...]:
    """The request's stop sequences (empty ones dropped)."""
    stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
    return tuple(s for s in stop if s)


def prompt_input(request: CompletionRequest) -> str | list[int]:
    """The one prompt of a completion request, text or token ids; 400 for batches of prompts."""
    prompt = request.prompt
    if prompt is None:
        return ""
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        if not prompt and isinstance(prompt, list):
            raise ApiError(400, "prompt: an empty list; send text or at least one token id", param="prompt")
        return prompt  # type: ignore[return-value]  # a list of ints here
    if len(prompt) == 1:
        return str(prompt[0])
    raise unsupported("prompt", f"{len(prompt)} prompts in one request; send one prompt per request")


def chat_messages(request: ChatRequest) -> list[dict[str, str]]:
    """The messages as {role, content} with text content; 400 for roles and parts without text."""
    return [plain_message(index, message) for index, message in enumerate(request.messages)]


CHAT_ROLES = ("system", "developer", "user", "assistant")


def plain_message(index: int, message: ChatMessage) -> dict[str, str]:
    """One message as {role, content}, its text parts joined."""
    if message.role not in CHAT_ROLES:
        why = f"role {message.role!r} is not supported; use one of {', '.join(CHAT_ROLES)}"
        raise unsupported(f"messages.{index}.role", why)
    content = message.content
    if isinstance(content, list):
        if any(part.type != "text" or part.text is None for part in content):
            raise unsupported(f"messages.{index}.content", "only text content parts are supported")
        content = "".join(part.text or "" for part in content)
    return {"role": message.role, "content": content or ""}


# --------------------------------------------------------------------------- responses


def new_id(prefix: str) -> str:
    """An OpenAI-style id: `cmpl-...`, `chatcmpl-...`."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """`created`: seconds since the epoch."""
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The usage object."""
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


def completion_body(rid: str, created: int, model: str, result: Completion) -> dict[str, Any]:
    """A text_completion object."""
    choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(result.prompt_tokens, result.completion_tokens),
    }


def chat_body(rid: str, created: int, model: str, result: Completion) -> dict[str, Any]:
    """A chat.completion object."""
    message = {"role": "assistant", "content": result.text}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": result.finish_reason}
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(result.prompt_tokens, result.completion_tokens),
    }


def completion_chunk(
    rid: str, created: int, model: str, text: str, finish: FinishReason | None = None
) -> dict[str, Any]:
    """One streamed text_completion chunk."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def chat_chunk(
    rid: str, created: int, model: str, delta: dict[str, str], finish: FinishReason | None = None
) -> dict[str, Any]:
    """One streamed chat.completion.chunk."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event carrying JSON."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class ChunkWriter:
    """The chunks of one streamed answer, completion or chat, sharing its id, time and model."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.rid, self.created = new_id("chatcmpl" if chat else "cmpl"), now()

    def opening(self) -> list[dict[str, Any]]:
        """What precedes the text: the assistant's role, for chat."""
        return (
            [chat_chunk(self.rid, self.created, self.model, {"role": "assistant", "content": ""})]
            if self.chat
            else []
        )

    def text(self, text: str) -> dict[str, Any]:
        """A chunk of generated text."""
        if self.chat:
            return chat_chunk(self.rid, self.created, self.model, {"content": text})
        return completion_chunk(self.rid, self.created, self.model, text)

    def finish(self, reason: FinishReason) -> dict[str, Any]:
        """The chunk that carries finish_reason."""
        if self.chat:
            return chat_chunk(self.rid, self.created, self.model, {}, reason)
        return completion_chunk(self.rid, self.created, self.model, "", reason)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The extra last chunk `stream_options.include_usage` asks for: no choices, the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.rid,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(prompt_tokens, completion_tokens),
        }
