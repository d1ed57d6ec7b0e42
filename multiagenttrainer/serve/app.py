"""The HTTP app: OpenAI's endpoints over one engine, with the server's limits.

    GET  /health                 200 while the engine takes requests, 503 otherwise (no key needed)
    GET  /v1/models[/ID]         the one served model
    POST /v1/completions         text in, text out; `stream: true` for server-sent events
    POST /v1/chat/completions    messages in (chat template or plain format), a message out

A request passes, in order: the bearer key (401), the body size (413), JSON and schema (400/422),
the model name (404), unsupported options (400), the concurrency limit (429), the token limits
(400), then the engine, called from worker threads. Engine failures become 400 (the request),
503 (the engine is gone or stopping) or, for anything unforeseen, a 500 that says only that; the
error is logged on the server. Every error body is OpenAI's `{"error": {...}}`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from multiagenttrainer.errors import ServeError
from multiagenttrainer.serve.engine import (
    Delta,
    Engine,
    RequestRejected,
    SamplingParams,
    StreamEvent,
)
from multiagenttrainer.serve.middleware import ASGIApp, BearerAuth, BodyLimit
from multiagenttrainer.serve.protocol import (
    OPENAI_DEFAULT_COMPLETION_TOKENS,
    SSE_DONE,
    ApiError,
    ChatRequest,
    ChunkWriter,
    CompletionRequest,
    GenerationRequest,
    chat_body,
    chat_messages,
    check_chat,
    check_completion,
    completion_body,
    error_body,
    now,
    parse_request,
    prompt_input,
    sse,
    stop_sequences,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
EXTRA_THREADS = 4  # worker threads beyond the request limit, for tokenizing and the like
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class ServeSettings:
    """The served name and the limits (from the `serve:` section and the command line)."""

    model_name: str
    api_key: str | None = None
    max_tokens: int = 1024
    max_body_bytes: int = 1_048_576
    max_concurrent_requests: int = 32


class Admission:
    """Counts generation requests in flight (on the event loop, so no lock) and refuses past the limit."""

    def __init__(self, limit: int) -> None:
        self.limit, self.active = limit, 0

    def enter(self) -> None:
        """Take a place, or raise 429."""
        if self.active >= self.limit:
            raise ApiError(
                429,
                f"too many requests at once (limit {self.limit}, serve.max_concurrent_requests); "
                "retry shortly",
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        self.active += 1

    def leave(self) -> None:
        """Give the place back."""
        self.active -= 1


class ServeState:
    """What the handlers share: the engine, the settings, admission and the worker-thread limiter."""

    def __init__(self, engine: Engine, settings: ServeSettings) -> None:
        self.engine, self.settings = engine, settings
        self.admission = Admission(settings.max_concurrent_requests)
        self.started = now()
        self._limiter: anyio.CapacityLimiter | None = None

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """Run an engine call in a worker thread, its failures translated into API errors."""
        if self._limiter is None:  # created on the event loop, at first use
            self._limiter = anyio.CapacityLimiter(self.settings.max_concurrent_requests + EXTRA_THREADS)
        try:
            return await anyio.to_thread.run_sync(function, *args, limiter=self._limiter)
        except RequestRejected as exc:
            raise ApiError(400, str(exc)) from exc
        except ServeError as exc:  # EngineUnavailable and any other engine-side failure
            raise ApiError(503, str(exc), type="server_error", code="engine_unavailable") from exc
        except Exception as exc:
            logger.error("request failed in the engine: %s: %s", type(exc).__name__, exc)
            raise ApiError(
                500, "the engine failed on this request; see the server log", "server_error"
            ) from exc

    def check_model(self, model: str) -> None:
        """404 unless the request names the served model."""
        if model != self.settings.model_name:
            raise ApiError(
                404,
                f"model {model!r} is not served here; this server serves {self.settings.model_name!r}",
                code="model_not_found",
                param="model",
            )

    def checked_ids(self, ids: list[int]) -> list[int]:
        """Token ids given as the prompt, when the model has them all; 400 otherwise."""
        size = self.engine.vocab_size
        if any(i < 0 or i >= size for i in ids):
            raise ApiError(400, f"prompt: token ids must be in 0..{size - 1} for this model", param="prompt")
        return ids

    def sampling(
        self,
        request: GenerationRequest,
        requested: int | None,
        prompt_len: int,
        default: int,
        stops: tuple[str, ...],
    ) -> SamplingParams:
        """The request's settings after the token limits: serve.max_tokens and the model's context."""
        max_tokens = self.checked_max_tokens(requested, prompt_len, default)
        min_tokens = request.min_tokens or 0
        if min_tokens > max_tokens:
            raise ApiError(
                400, f"min_tokens ({min_tokens}) is over max_tokens ({max_tokens})", param="min_tokens"
            )
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            stop=stop_sequences(request) + stops,
            seed=request.seed,
            min_tokens=min_tokens,
        )

    def checked_max_tokens(self, requested: int | None, prompt_len: int, default: int) -> int:
        """max_tokens (or the default) within serve.max_tokens and the room the prompt leaves."""
        limit = self.settings.max_tokens
        if requested is not None and requested > limit:
            raise ApiError(
                400,
                f"max_tokens {requested} is over this server's limit of {limit} (serve.max_tokens)",
                code="max_tokens_exceeded",
                param="max_tokens",
            )
        context = self.engine.context_length
        room = None if context is None else context - prompt_len
        max_tokens = requested or (default if room is None else min(default, room))
        if room is not None and max_tokens > room:
            raise ApiError(
                400,
                f"this model's context is {context} tokens; the prompt has {prompt_len}, leaving room for "
                f"{max(room, 0)} generated tokens, not {max_tokens}; shorten the prompt or lower max_tokens",
                code="context_length_exceeded",
                param="max_tokens" if room > 0 else "prompt",
            )
        return max_tokens

    async def answer(
        self, writer: ChunkWriter, ids: list[int], params: SamplingParams, stream: bool, usage: bool
    ) -> Response:
        """Generate, as one JSON body or as server-sent events; the admission place is held meanwhile."""
        if stream:
            return AdmittedStream(stream_events(self, writer, ids, params, usage), self.admission)
        try:
            result = await self.call(self.engine.generate, ids, params)
        finally:
            self.admission.leave()
        build = chat_body if writer.chat else completion_body
        return json_response(build(writer.rid, writer.created, writer.model, result))


class AdmittedStream(StreamingResponse):
    """A server-sent event stream that gives its admission place back when it ends, however it ends."""

    def __init__(self, events: AsyncIterator[bytes], admission: Admission) -> None:
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self.admission = admission

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.admission.leave()


async def stream_events(
    state: ServeState, writer: ChunkWriter, ids: list[int], params: SamplingParams, usage: bool
) -> AsyncIterator[bytes]:
    """The chunks of a streamed answer, then `data: [DONE]`; an error mid-way is sent as an error event."""
    events: Generator[StreamEvent, None, None] = state.engine.stream(ids, params)
    try:
        for chunk in writer.opening():
            yield sse(chunk)
        while (event := await state.call(next, events, None)) is not None:
            if isinstance(event, Delta):
                yield sse(writer.text(event.text))
                continue
            yield sse(writer.finish(event.finish_reason))
            if usage:
                yield sse(writer.usage(event.prompt_tokens, event.completion_tokens))
        yield SSE_DONE
    except ApiError as exc:
        yield sse(exc.body())
    finally:
        events.close()  # not running (the call above has returned): stops the generation


def json_response(
    body: dict[str, Any], status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A JSON answer."""
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def serve_state(request: Request) -> ServeState:
    """The state create_app attached to the app."""
    state: ServeState = request.app.state.serve
    return state


# --------------------------------------------------------------------------- endpoints


async def health(request: Request) -> Response:
    """200 with the model and engine while the engine takes requests, else 503."""
    state = serve_state(request)
    healthy = state.engine.healthy()
    body = {"status": "ok" if healthy else "unavailable", "model": state.settings.model_name}
    return json_response({**body, "engine": state.engine.name}, 200 if healthy else 503)


def model_card(state: ServeState) -> dict[str, Any]:
    """The served model as an OpenAI model object."""
    name, context = state.settings.model_name, state.engine.context_length
    return {
        "id": name,
        "object": "model",
        "created": state.started,
        "owned_by": "mat",
        "max_model_len": context,
    }


async def list_models(request: Request) -> Response:
    """The one served model."""
    return json_response({"object": "list", "data": [model_card(serve_state(request))]})


async def get_model(request: Request) -> Response:
    """The served model by name, or 404."""
    state = serve_state(request)
    state.check_model(request.path_params["model"])
    return json_response(model_card(state))


async def completions(request: Request) -> Response:
    """POST /v1/completions."""
    state = serve_state(request)
    body = parse_request(await request.body(), CompletionRequest)
    state.check_model(body.model)
    check_completion(body)
    prompt = prompt_input(body)
    state.admission.enter()
    try:
        ids = (
            state.checked_ids(prompt)
            if isinstance(prompt, list)
            else await state.call(state.engine.encode, prompt)
        )
        default = min(OPENAI_DEFAULT_COMPLETION_TOKENS, state.settings.max_tokens)
        params = state.sampling(body, body.max_tokens, len(ids), default, ())
    except BaseException:
        state.admission.leave()
        raise
    usage = bool(body.stream_options and body.stream_options.include_usage)
    return await state.answer(ChunkWriter(False, body.model), ids, params, bool(body.stream), usage)


async def chat_completions(request: Request) -> Response:
    """POST /v1/chat/completions."""
    state = serve_state(request)
    body = parse_request(await request.body(), ChatRequest)
    state.check_model(body.model)
    check_chat(body)
    messages = chat_messages(body)
    state.admission.enter()
    try:
        prompt = await state.call(state.engine.chat_prompt, messages)
        ids = await state.call(state.engine.encode, prompt.text, not prompt.templated)
        requested = body.max_completion_tokens or body.max_tokens
        params = state.sampling(body, requested, len(ids), state.settings.max_tokens, prompt.stops)
    except BaseException:
        state.admission.leave()
        raise
    usage = bool(body.stream_options and body.stream_options.include_usage)
    return await state.answer(ChunkWriter(True, body.model), ids, params, bool(body.stream), usage)


# --------------------------------------------------------------------------- errors and assembly


async def api_error(request: Request, exc: Exception) -> Response:
    """An ApiError as OpenAI's error body."""
    assert isinstance(exc, ApiError)
    return json_response(exc.body(), exc.status, exc.headers)


ROUTES_HINT = "GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions"


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404/405 as OpenAI's error body."""
    assert isinstance(exc, HTTPException)
    what = "no such endpoint" if exc.status_code == 404 else str(exc.detail).lower()
    message = f"{request.method} {request.url.path}: {what}; this server answers {ROUTES_HINT}"
    code = "not_found" if exc.status_code == 404 else "method_not_allowed"
    return json_response(error_body(message, "invalid_request_error", code), exc.status_code, exc.headers)


def create_app(engine: Engine, settings: ServeSettings) -> ASGIApp:
    """The ASGI app: the key check outside, then the body limit, then the endpoints."""
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: api_error, HTTPException: http_error})
    app.state.serve = ServeState(engine, settings)
    return BearerAuth(BodyLimit(app, settings.max_body_bytes), settings.api_key)
