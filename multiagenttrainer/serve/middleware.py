"""The HTTP app's outer layers, as plain ASGI middleware: the bearer key, then the body-size limit.

Both answer before the body is read: a request without the key gets 401 whatever it sends, and a
body over the limit gets 413 as soon as its Content-Length (or the bytes read so far, for a chunked
body) says so. The key is compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from multiagenttrainer.serve.protocol import ApiError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})  # answered without the key, for load balancers and probes


async def send_error(send: Send, error: ApiError) -> None:
    """Answer an ApiError as JSON."""
    headers = [(b"content-type", b"application/json")]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(error.body())})


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a request header, or None."""
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return None


def bearer_matches(value: bytes | None, key: bytes) -> bool:
    """Whether an Authorization header carries exactly this bearer key (constant-time comparison)."""
    scheme, _, token = (value or b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)


class BearerAuth:
    """401 for every request outside OPEN_PATHS that lacks `Authorization: Bearer <key>`."""

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app = app
        self.key = key.encode("utf-8") if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.key is None or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        if bearer_matches(header(scope, b"authorization"), self.key):
            return await self.app(scope, receive, send)
        await send_error(send, ApiError(
            401,
            "missing or wrong API key; send it as `Authorization: Bearer <key>`",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        ))  # fmt: skip


def too_large(limit: int) -> ApiError:
    """413 naming the limit and the setting that raises it."""
    return ApiError(
        413,
        f"the request body is over this server's limit of {limit} bytes (serve.max_body_bytes)",
        code="request_too_large",
    )


class BodyLimit:
    """Reads the body up to `limit` bytes (413 beyond it), then hands it on to the app."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            error = (
                too_large(self.limit) if declared.isdigit() else ApiError(400, "bad Content-Length header")
            )
            return await send_error(send, error)
        body, complete = await read_body(receive, self.limit)
        if not complete:
            return await send_error(send, too_large(self.limit))
        await self.app(scope, replay(body, receive), send)


async def read_body(receive: Receive, limit: int) -> tuple[bytes, bool]:
    """The request body and True, or what was read and False once it passes `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True  # the client went away; the app sees an empty body
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"", False
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), True


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive callable that gives the buffered body once, then passes through (disconnects)."""
    delivered = False

    async def receive_again() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive_again
