"""Real git servers and fixture repositories on 127.0.0.1, for tests of git-backed sources.

- `GitHttpServer`: a stdlib HTTP server in front of `git http-backend` (smart HTTP). When given a
  token it demands it (Basic password or Bearer) and answers 401 otherwise, like GitHub does.
  Every request is logged with whether it carried an Authorization header.
- `GitDaemon`: `git daemon` serving git:// on a free loopback port.
- `RepoFactory`: small repositories (branches main and dev, a .gitignore, nested directories, a
  binary file) published as bare repos at `<root>/<owner>/<repo>.git`, with commits added later.

Import from other test packages with `from tests.support.git_servers import GitHttpServer`.
"""

from __future__ import annotations

import base64
import gzip
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.http import ServerThread

LOOPBACK = "127.0.0.1"
CGI_TIMEOUT_S = 30
START_TIMEOUT_S = 10
STOP_TIMEOUT_S = 5

# Author identity and an empty global config, so the developer's git settings never leak in.
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Fixture",
    "GIT_AUTHOR_EMAIL": "fixture@example.com",
    "GIT_COMMITTER_NAME": "Fixture",
    "GIT_COMMITTER_EMAIL": "fixture@example.com",
    "GIT_TERMINAL_PROMPT": "0",
}


def git_env() -> dict[str, str]:
    """The process environment plus an isolated git identity and config."""
    return {**os.environ, **GIT_ENV}


def git(*args: str, cwd: Path | None = None) -> str:
    """Run the git CLI and return its stdout (stripped); raises on failure."""
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(), capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, timeout_s: float = START_TIMEOUT_S) -> None:
    """Block until something accepts connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {LOOPBACK}:{port} after {timeout_s} s")


# --------------------------------------------------------------------------- smart HTTP server


@dataclass(frozen=True)
class RequestRecord:
    """One request the HTTP server received."""

    method: str
    path: str
    query: str
    authorization: bool  # whether any Authorization header was sent
    status: int
    command: str  # "refs" (ref advertisement or ls-refs), "fetch" (asks for objects) or "" (other)

    @property
    def is_fetch(self) -> bool:
        """Whether this request asked for objects, not just for the list of refs."""
        return self.command == "fetch"


def upload_pack_command(path: str, body: bytes) -> str:
    """What a smart-HTTP request asks for: "refs", "fetch" or "" (protocol v0 and v2)."""
    if path.endswith("/info/refs"):
        return "refs"
    if not path.endswith("/git-upload-pack"):
        return ""
    if b"command=ls-refs" in body:
        return "refs"
    if b"command=fetch" in body or b"want " in body:
        return "fetch"
    return ""


def presented_token(header: str | None) -> str | None:
    """The token in an Authorization header: the Basic password, or the Bearer/token value."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip()).decode()
        except ValueError:
            return None
        return decoded.partition(":")[2]
    if scheme.lower() in ("bearer", "token"):
        return value.strip()
    return None


def parse_cgi_response(output: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """Split CGI output into (status, headers, body)."""
    ends = [(i, sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := output.find(sep)) >= 0]
    _, separator = min(ends) if ends else (0, b"\r\n\r\n")
    head, _, body = output.partition(separator)
    status, headers = 200, []
    for line in head.decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.strip().split()[0])
        elif name:
            headers.append((name, value.strip()))
    return status, headers, body


class _GitHandler(BaseHTTPRequestHandler):
    server: _GitHttpd
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr noise
        return

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        header = self.headers.get("Authorization")
        body = self._read_body()
        plain = gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body
        command = upload_pack_command(parts.path, plain)
        if not self._authorized(header):
            status = self._send(
                401, [("WWW-Authenticate", 'Basic realm="mat-test-git"')], b"token required\n"
            )
        else:
            status = self._send(*self._run_backend(parts.path, parts.query, body))
        record = RequestRecord(self.command, parts.path, parts.query, header is not None, status, command)
        self.server.owner.record(record)

    def _authorized(self, header: str | None) -> bool:
        expected = self.server.owner.token
        return expected is None or presented_token(header) == expected

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def _run_backend(self, path: str, query: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        env = {
            **git_env(),
            "GIT_PROJECT_ROOT": str(self.server.owner.project_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }
        done = subprocess.run(
            [self.server.owner.backend],
            input=body,
            env=env,
            capture_output=True,
            timeout=CGI_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0 and not done.stdout:
            return 500, [], done.stderr
        return parse_cgi_response(done.stdout)

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> int:
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in ("content-length", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return status


class _GitHttpd(ThreadingHTTPServer):
    daemon_threads = True
    owner: GitHttpServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up mid-request (a refused token, a test's timeout) are not errors."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class GitHttpServer:
    """`git http-backend` behind a threaded HTTP server on 127.0.0.1; use as a context manager."""

    project_root: Path
    token: str | None = None
    requests: list[RequestRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.backend = str(Path(git("--exec-path")) / "git-http-backend")
        self._lock = threading.Lock()
        self._server = ServerThread(self._make_httpd, poll_interval_s=0.1, stop_timeout_s=STOP_TIMEOUT_S)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:PORT (repositories live at /<owner>/<repo>.git)."""
        return f"http://{LOOPBACK}:{self.port}"

    def _make_httpd(self) -> _GitHttpd:
        httpd = _GitHttpd((LOOPBACK, 0), _GitHandler)
        httpd.owner = self
        return httpd

    def start(self) -> GitHttpServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def record(self, request: RequestRecord) -> None:
        with self._lock:
            self.requests.append(request)

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    def requests_for(self, repo_path: str) -> list[RequestRecord]:
        """Logged requests whose path starts with `repo_path` (e.g. "/acme/widgets.git")."""
        with self._lock:
            return [r for r in self.requests if r.path.startswith(repo_path)]

    def __enter__(self) -> GitHttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- git daemon


@dataclass
class GitDaemon:
    """`git daemon` exporting every repository under `base_path` on a free loopback port."""

    base_path: Path
    port: int = 0
    _process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. git://127.0.0.1:PORT (repositories live at /<owner>/<repo>.git)."""
        return f"git://{LOOPBACK}:{self.port}"

    def start(self) -> GitDaemon:
        self.port = free_port()
        command = [
            "git", "daemon", "--reuseaddr", "--export-all", "--informative-errors",
            f"--listen={LOOPBACK}", f"--port={self.port}", f"--base-path={self.base_path}", "--timeout=30",
            str(self.base_path),
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command, env=git_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for_port(self.port)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=STOP_TIMEOUT_S)
        self._process = None

    def __enter__(self) -> GitDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- fixture repositories

# PNG signature, an IHDR-like chunk and NUL bytes: binary by any detector.
BINARY_BYTES = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4

BASE_FILES: dict[str, bytes] = {
    "README.md": b"# Widgets\n\nA tiny fixture repository.\n",
    ".gitignore": b"*.log\nbuild/\n",
    "src/widgets/__init__.py": b'"""Widgets."""\n',
    "src/widgets/core.py": b"def spin(n: int) -> int:\n    return n * 2\n",
    "src/widgets/deep/nested/leaf.py": b"LEAF = True\n",
    "docs/guide/intro.md": b"Intro to widgets.\n",
    "assets/logo.png": BINARY_BYTES,
}
DEV_FILES: dict[str, bytes] = {"src/widgets/experimental.py": b"def wobble() -> str:\n    return 'dev'\n"}


@dataclass
class FixtureRepo:
    """A published bare repository and the work tree its commits are made in."""

    slug: str  # owner/name
    bare: Path
    work: Path

    @property
    def path(self) -> str:
        """The URL path the servers expose it at: /owner/name.git."""
        return f"/{self.slug}.git"

    def head(self, branch: str = "main") -> str:
        """The SHA `branch` points to in the published repository."""
        return git("rev-parse", f"refs/heads/{branch}", cwd=self.bare)

    def set_default_branch(self, branch: str) -> None:
        """Point the published repository's HEAD (its default branch) at `branch`."""
        git("symbolic-ref", "HEAD", f"refs/heads/{branch}", cwd=self.bare)

    def commit(self, files: dict[str, bytes], message: str = "change", branch: str = "main") -> str:
        """Write `files` on `branch`, commit, publish, and return the new SHA."""
        git("checkout", "-q", branch, cwd=self.work)
        write_files(self.work, files)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", message, cwd=self.work)
        git("push", "-q", "origin", branch, cwd=self.work)
        return self.head(branch)


def write_files(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


class RepoFactory:
    """Creates fixture repositories published under `root/<owner>/<name>.git`."""

    def __init__(self, root: Path, scratch: Path) -> None:
        self.root = root
        self.scratch = scratch
        self._count = 0
        self._lock = threading.Lock()

    def create(self, slug: str | None = None) -> FixtureRepo:
        """A new repository (unique name unless `slug` is given) with branches main and dev."""
        slug = slug or self._unique_slug()
        bare = self.root / f"{slug}.git"
        work = self.scratch / slug
        git("init", "-q", "--bare", "-b", "main", str(bare))
        git("init", "-q", "-b", "main", str(work))
        git("remote", "add", "origin", str(bare), cwd=work)
        write_files(work, BASE_FILES)
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", "initial", cwd=work)
        git("push", "-q", "origin", "main", cwd=work)
        git("checkout", "-q", "-b", "dev", cwd=work)
        write_files(work, DEV_FILES)
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", "dev work", cwd=work)
        git("push", "-q", "origin", "dev", cwd=work)
        git("checkout", "-q", "main", cwd=work)
        return FixtureRepo(slug, bare, work)

    def _unique_slug(self) -> str:
        with self._lock:
            self._count += 1
            return f"acme/widgets-{self._count}"


def files_at_commit(bare: Path, commit: str) -> dict[str, bytes]:
    """Every file in `commit` of the repository at `bare`, read from the object store."""
    from dulwich.repo import Repo

    with Repo(str(bare)) as repo:
        tree = repo[commit.encode()].tree  # type: ignore[attr-defined]
        return {
            entry.path.decode(): repo[entry.sha].data  # type: ignore[attr-defined]
            for entry in repo.object_store.iter_tree_contents(tree)
        }
