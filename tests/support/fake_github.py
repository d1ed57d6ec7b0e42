"""A small fake of the GitHub REST API on 127.0.0.1, enough for PyGithub to list an organisation.

Endpoints: GET /orgs/{org}, GET /orgs/{org}/repos (type, per_page, page, RFC 8288 Link headers),
GET /rate_limit and GET /user. A request with an `Authorization: token X` header must carry the
server's token (401 "Bad credentials" otherwise); anonymous requests see public repositories only.
Organisations can be given a behaviour (a rate limit, a 403, a 502) instead of an answer, and every
request is recorded for assertions.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from tests.support.http import LOOPBACK, ServerThread

DOCS = "https://docs.github.com/rest"
PRIMARY_LIMIT_MESSAGE = (
    "API rate limit exceeded for 127.0.0.1. (But here's the good news: Authenticated requests get a "
    "higher rate limit. Check out the documentation for more details.)"
)
SECONDARY_LIMIT_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."
)
RATE_LIMIT_RESET_S = 3 * 3600  # "far ahead" for the primary limit
RETRY_AFTER_S = 3600  # for the secondary limit
SHORT_RESET_S = 1  # a limit that PyGithub may wait out


@dataclass
class FakeRepo:
    """One repository as the fake API reports it."""

    name: str
    clone_url: str
    private: bool = False
    default_branch: str = "main"
    archived: bool = False
    size: int = 12  # KB, as GitHub reports it; 0 means empty
    full_name: str | None = None  # what the API calls it; `<org>/<name>` unless a test says otherwise


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake received."""

    method: str
    path: str
    query: dict[str, str]
    authorization: str | None


Reply = tuple[int, dict[str, str], Any]


@dataclass
class FakeGithub:
    """The fake API server; use as a context manager. `token` is the only token it accepts."""

    token: str = "ghp_fake_token_0123456789"
    orgs: dict[str, list[FakeRepo]] = field(default_factory=dict)
    behaviours: dict[str, str] = field(default_factory=dict)  # org -> a key of BEHAVIOURS
    requests: list[RecordedRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._server = ServerThread(self._make_httpd)
        self._short_limit_served: set[str] = set()

    @property
    def url(self) -> str:
        return self._server.url

    def _make_httpd(self) -> _Httpd:
        httpd = _Httpd((LOOPBACK, 0), _Handler)
        httpd.fake = self
        return httpd

    def start(self) -> FakeGithub:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> FakeGithub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def requests_to(self, path: str) -> list[RecordedRequest]:
        """Recorded requests for exactly this path (query ignored)."""
        with self._lock:
            return [r for r in self.requests if r.path == path]

    # ------------------------------------------------------------------ answers

    def answer(self, path: str, query: dict[str, str], authorization: str | None) -> Reply:
        if authorization is not None and authorization != f"token {self.token}":
            return 401, {}, {"message": "Bad credentials", "documentation_url": DOCS, "status": "401"}
        parts = path.strip("/").split("/")
        if parts == ["rate_limit"]:
            return 200, {}, self._rate_limit()
        if parts == ["user"]:
            return self._user(authorization)
        if len(parts) in (2, 3) and parts[0] == "orgs" and parts[2:] in ([], ["repos"]):
            return self._org(
                parts[1], listing=len(parts) == 3, query=query, authenticated=authorization is not None
            )
        return 404, {}, {"message": "Not Found", "documentation_url": DOCS, "status": "404"}

    def _org(self, org: str, *, listing: bool, query: dict[str, str], authenticated: bool) -> Reply:
        behaviour = self.behaviours.get(org)
        if behaviour is not None:
            reply = BEHAVIOURS[behaviour](self, org)
            if reply is not None:
                return reply
        if org not in self.orgs:
            return 404, {}, {"message": "Not Found", "documentation_url": DOCS, "status": "404"}
        if not listing:
            return 200, {}, self._org_json(org)
        return self._repos_page(org, query, authenticated)

    def _repos_page(self, org: str, query: dict[str, str], authenticated: bool) -> Reply:
        kind = query.get("type", "all")
        repos = [r for r in self.orgs[org] if authenticated or not r.private]
        repos = [r for r in repos if kind == "all" or (kind == "private") == r.private]
        per_page = min(100, int(query.get("per_page", "30")))
        page = int(query.get("page", "1"))
        last = max(1, -(-len(repos) // per_page))
        body = [self._repo_json(org, r) for r in repos[(page - 1) * per_page : page * per_page]]
        headers = {"Link": self._link_header(f"/orgs/{org}/repos", query, page, last)} if last > 1 else {}
        return 200, headers, body

    def _link_header(self, path: str, query: dict[str, str], page: int, last: int) -> str:
        def link(number: int, rel: str) -> str:
            return f'<{self.url}{path}?{urlencode({**query, "page": str(number)})}>; rel="{rel}"'

        links = [link(page + 1, "next"), link(last, "last")] if page < last else []
        links += [link(page - 1, "prev"), link(1, "first")] if page > 1 else []
        return ", ".join(links)

    def _org_json(self, org: str) -> dict[str, Any]:
        return {
            "login": org,
            "id": abs(hash(org)) % 10**6,
            "url": f"{self.url}/orgs/{org}",
            "repos_url": f"{self.url}/orgs/{org}/repos",
            "html_url": f"https://github.example.test/{org}",
            "type": "Organization",
        }

    def _repo_json(self, org: str, repo: FakeRepo) -> dict[str, Any]:
        return {
            "id": abs(hash((org, repo.name))) % 10**8,
            "name": repo.name,
            "full_name": repo.full_name or f"{org}/{repo.name}",
            "owner": {"login": org, "id": 1, "type": "Organization"},
            "private": repo.private,
            "visibility": "private" if repo.private else "public",
            "html_url": f"https://github.example.test/{org}/{repo.name}",
            "url": f"{self.url}/repos/{org}/{repo.name}",
            "clone_url": repo.clone_url,
            "default_branch": repo.default_branch,
            "archived": repo.archived,
            "fork": False,
            "size": repo.size,
        }

    def _rate_limit(self) -> dict[str, Any]:
        core = {"limit": 5000, "remaining": 4999, "reset": int(time.time()) + 3600, "used": 1}
        return {"resources": {"core": core, "search": core}, "rate": core}

    def _user(self, authorization: str | None) -> Reply:
        if authorization is None:
            return 401, {}, {"message": "Requires authentication", "documentation_url": DOCS, "status": "401"}
        return 200, {}, {"login": "mat-bot", "id": 7, "type": "User"}

    # ------------------------------------------------------------------ behaviours

    def _primary_limit(self, org: str) -> Reply:
        headers = {
            "X-RateLimit-Limit": "60",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Used": "60",
            "X-RateLimit-Reset": str(int(time.time()) + RATE_LIMIT_RESET_S),
        }
        return 403, headers, {"message": PRIMARY_LIMIT_MESSAGE, "documentation_url": DOCS}

    def _short_primary_limit(self, org: str) -> Reply | None:
        """A primary limit that resets in about a second, served once; then normal answers."""
        with self._lock:
            if org in self._short_limit_served:
                return None
            self._short_limit_served.add(org)
        reply = self._primary_limit(org)
        reply[1]["X-RateLimit-Reset"] = str(int(time.time()) + SHORT_RESET_S)
        return reply

    def _secondary_limit(self, org: str) -> Reply:
        return (
            403,
            {"Retry-After": str(RETRY_AFTER_S)},
            {"message": SECONDARY_LIMIT_MESSAGE, "documentation_url": DOCS},
        )

    def _forbidden(self, org: str) -> Reply:
        return (
            403,
            {},
            {"message": "Resource not accessible by personal access token", "documentation_url": DOCS},
        )

    def _bad_gateway(self, org: str) -> Reply:
        return 502, {}, {"message": "Server Error"}


BEHAVIOURS: dict[str, Callable[[FakeGithub, str], Reply | None]] = {
    "rate_limited": FakeGithub._primary_limit,
    "briefly_rate_limited": FakeGithub._short_primary_limit,
    "secondary_rate_limited": FakeGithub._secondary_limit,
    "forbidden": FakeGithub._forbidden,
    "bad_gateway": FakeGithub._bad_gateway,
}


class _Handler(BaseHTTPRequestHandler):
    server: _Httpd
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query))
        authorization = self.headers.get("Authorization")
        self.server.fake.record(RecordedRequest("GET", parts.path, query, authorization))
        status, headers, body = self.server.fake.answer(parts.path, query, authorization)
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json; charset=utf-8", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        return


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeGithub
