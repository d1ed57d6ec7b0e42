"""Running `mat serve`: listen, load the model with the chosen engine, serve until a signal.

The port is bound before the model loads, so a busy port fails in a second, not after a minute
of loading; port 0 takes any free port and the printed URL names it. uvicorn serves the app on
that socket and owns SIGINT and SIGTERM while it runs: the first one stops the engine's
generations at their next token, lets open connections finish for a few seconds, and returns
(re-raising the signal, so the caller can exit 130 for Ctrl-C and 0 for SIGTERM). The engine is
closed on every way out, including any process it started.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import uvicorn

from multiagenttrainer.config import ServeConfig
from multiagenttrainer.errors import ConfigError, ServeError
from multiagenttrainer.serve.app import ServeSettings, create_app
from multiagenttrainer.serve.engine import EngineOptions, ModelSpec, choose_engine, make_engine
from multiagenttrainer.serve.middleware import ASGIApp

GRACEFUL_SHUTDOWN_S = 3
LISTEN_BACKLOG = 2048

Report = Callable[[str], None]


@dataclass(frozen=True)
class ServeOptions:
    """Command-line choices on top of the `serve:` section."""

    engine: str = "auto"
    engine_options: EngineOptions = EngineOptions()
    access_log: bool = True


# --------------------------------------------------------------------------- listening


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; ServeError naming the fix when that is not possible."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise ServeError(bind_error_message(host, port, exc)) from exc
    sock.set_inheritable(True)
    return sock


def bind_error_message(host: str, port: int, exc: OSError) -> str:
    """What went wrong binding host:port, and what to do about it."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use; choose another with --port "
            "(--port 0 picks a free one) or stop what listens there"
        )
    if exc.errno == errno.EACCES:
        return f"no permission to listen on port {port}; use a port above 1023"
    reason = exc.strerror or str(exc)
    return f"cannot listen on {host}:{port} ({reason}); use an address of this machine, such as 127.0.0.1"


def socket_url(sock: socket.socket) -> str:
    """http://host:port of a bound socket (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_from_env(cfg: ServeConfig) -> str | None:
    """The bearer key from the variable `serve.api_key_env` names; ConfigError when it is unset."""
    if cfg.api_key_env is None:
        return None
    key = os.environ.get(cfg.api_key_env, "").strip()
    if not key:
        raise ConfigError(
            f"serve.api_key_env: the variable {cfg.api_key_env} is not set; export the key in it, "
            "or remove api_key_env to serve without a key"
        )
    return key


# --------------------------------------------------------------------------- serving


class SignalAwareServer(uvicorn.Server):
    """uvicorn's server, also telling the engine to stop generating as soon as a signal arrives."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.on_exit()
        super().handle_exit(sig, frame)


def run_app(app: ASGIApp, sock: socket.socket, on_exit: Callable[[], None], access_log: bool) -> None:
    """Serve the app on the socket until SIGINT or SIGTERM."""
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=access_log,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        server_header=False,
    )
    if access_log:
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    SignalAwareServer(config, on_exit).run(sockets=[sock])


def serve_model(
    spec: ModelSpec, cfg: ServeConfig, options: ServeOptions, report: Report, api_key: str | None
) -> None:
    """Bind, load, print where the model is served, serve until a signal; then close the engine."""
    sock = bind_socket(cfg.host, cfg.port)
    try:
        engine_name, reason = choose_engine(options.engine, options.engine_options)
        adapter = f" with adapter {spec.adapter}" if spec.adapter else ""
        report(f"loading {spec.base}{adapter} with {engine_name} ({reason})")
        engine = make_engine(engine_name, spec, options.engine_options)
        try:
            settings = ServeSettings(
                model_name=spec.name,
                api_key=api_key,
                max_tokens=cfg.max_tokens,
                max_body_bytes=cfg.max_body_bytes,
                max_concurrent_requests=cfg.max_concurrent_requests,
            )
            app = create_app(engine, settings)
            report_ready(report, engine.description, spec.name, socket_url(sock), cfg.host, api_key)
            run_app(app, sock, engine.shutdown, options.access_log)
        finally:
            engine.close()
    finally:
        sock.close()


def report_ready(report: Report, description: str, name: str, url: str, host: str, key: str | None) -> None:
    """The start-up banner: engine, model name, URL, and a warning for an open, unprotected address."""
    report(f"engine: {description}")
    report(f"model: {name}")
    report(f"serving {url}/v1 ({'bearer key required' if key else 'no key'}; Ctrl-C to stop)")
    if not is_loopback(host) and key is None:
        report(
            f"warning: listening on {host} without an API key: anyone who can reach this port can use "
            "the model; set serve.api_key_env"
        )
