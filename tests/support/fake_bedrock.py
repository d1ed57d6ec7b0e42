"""A small Bedrock Agent Runtime endpoint on 127.0.0.1 that speaks the `Retrieve` REST-JSON API.

moto does not implement bedrock-agent-runtime, so boto3 is pointed here with
AWS_ENDPOINT_URL_BEDROCK_AGENT_RUNTIME. `POST /knowledgebases/{id}/retrieve` serves the stored
results of a knowledge base page by page (numberOfResults per page, nextToken while more remain);
unknown ids get a 404 ResourceNotFoundException, and a knowledge base can be given an error
behaviour instead. Every request is recorded with its JSON body and Authorization header.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.support.http import LOOPBACK, ServerThread

DEFAULT_PAGE = 5  # what the service returns when numberOfResults is not given

# behaviour -> (HTTP status, error code, message), as the service would answer
ERRORS: dict[str, tuple[int, str, str]] = {
    "throttled": (429, "ThrottlingException", "Rate exceeded"),
    "denied": (403, "AccessDeniedException", "User is not authorized to perform: bedrock:Retrieve"),
    "invalid": (400, "ValidationException", "1 validation error detected: value at 'retrievalQuery.text'"),
}


def passage(
    text: str,
    location: dict[str, Any] | None = None,
    score: float = 0.5,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One retrieval result in the service's response shape."""
    result: dict[str, Any] = {"content": {"type": "TEXT", "text": text}, "score": score}
    if location is not None:
        result["location"] = location
    if metadata is not None:
        result["metadata"] = metadata
    return result


def s3(uri: str) -> dict[str, Any]:
    return {"type": "S3", "s3Location": {"uri": uri}}


def web(url: str) -> dict[str, Any]:
    return {"type": "WEB", "webLocation": {"url": url}}


@dataclass(frozen=True)
class RetrieveRequest:
    """One Retrieve call the endpoint received."""

    knowledge_base_id: str
    body: dict[str, Any]
    authorization: str | None

    @property
    def number_of_results(self) -> int | None:
        config = self.body.get("retrievalConfiguration", {}).get("vectorSearchConfiguration", {})
        value = config.get("numberOfResults")
        return int(value) if value is not None else None


@dataclass
class FakeBedrock:
    """The endpoint; use as a context manager."""

    knowledge_bases: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    behaviours: dict[str, str] = field(default_factory=dict)  # kb id -> a key of ERRORS
    requests: list[RetrieveRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ServerThread(self._make_httpd)

    @property
    def url(self) -> str:
        return self._server.url

    def _make_httpd(self) -> _Httpd:
        httpd = _Httpd((LOOPBACK, 0), _Handler)
        httpd.fake = self
        return httpd

    def start(self) -> FakeBedrock:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> FakeBedrock:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def retrieve(
        self, kb_id: str, body: dict[str, Any], authorization: str | None
    ) -> tuple[int, dict[str, str], Any]:
        with self._lock:
            self.requests.append(RetrieveRequest(kb_id, body, authorization))
        if kb_id in self.behaviours:
            status, code, message = ERRORS[self.behaviours[kb_id]]
            return status, {"x-amzn-ErrorType": code}, {"message": message}
        if kb_id not in self.knowledge_bases:
            message = f"Knowledge base with id {kb_id} does not exist"
            return 404, {"x-amzn-ErrorType": "ResourceNotFoundException"}, {"message": message}
        results = self.knowledge_bases[kb_id]
        start = int(body.get("nextToken", "offset-0").removeprefix("offset-"))
        size = RetrieveRequest(kb_id, body, None).number_of_results or DEFAULT_PAGE
        page: dict[str, Any] = {"retrievalResults": results[start : start + size]}
        if start + size < len(results):
            page["nextToken"] = f"offset-{start + size}"
        return 200, {}, page


class _Handler(BaseHTTPRequestHandler):
    server: _Httpd
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        parts = urlsplit(self.path).path.strip("/").split("/")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if len(parts) == 3 and parts[0] == "knowledgebases" and parts[2] == "retrieve":
            reply = self.server.fake.retrieve(unquote(parts[1]), body, self.headers.get("Authorization"))
        else:
            reply = (404, {"x-amzn-ErrorType": "UnknownOperationException"}, {"message": "unknown operation"})
        status, headers, payload = reply
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        return


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeBedrock
