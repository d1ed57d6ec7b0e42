"""A test HTTP server on 127.0.0.1, served from a background thread, shared by the fake servers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer

LOOPBACK = "127.0.0.1"


class ServerThread:
    """Starts `make()` (a server bound to a free loopback port) in a thread; stop() shuts it down."""

    def __init__(
        self,
        make: Callable[[], ThreadingHTTPServer],
        poll_interval_s: float = 0.05,
        stop_timeout_s: float = 5.0,
    ) -> None:
        self._make = make
        self._poll_interval_s = poll_interval_s
        self._stop_timeout_s = stop_timeout_s
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self._httpd = self._make()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": self._poll_interval_s}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=self._stop_timeout_s)
        self._httpd = self._thread = None
