"""What the fake engine servers (:mod:`tests.fakes.vllm_server`, :mod:`tests.fakes.triton_server`,
:mod:`tests.fakes.mii_server`) share: the listener lifecycle on 127.0.0.1 and the request-handler plumbing.

* :class:`Listener`: one socket bound to a fixed port (port 0 the first time, the same port after) that
  can stop listening, so connects are *refused*, and listen again; one ``serve_forever`` daemon thread per
  listening period, plus one daemon thread per request (``ThreadingHTTPServer``).
* :class:`FakeServer`: ``start(loading=...)`` / ``stop()`` / ``begin_loading()`` / ``finish_loading()`` /
  ``with`` over a fake's listeners, its ``lock`` and its ``requests`` record.
* :class:`FakeHandler`: quiet logging, ``do_GET``/``do_POST`` -> ``_dispatch(method)``, ``_send``, ``_body``.
* :func:`refused`: whether a TCP connect to a local port is refused (tests of the loading phase).
"""

from __future__ import annotations

import socket
import socketserver
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

LOCALHOST = "127.0.0.1"


class FakeHttpServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` with daemon request threads that knows the fake it serves."""

    daemon_threads = True
    allow_reuse_address = True
    fake: Any


ServerFactory = Callable[[tuple[str, int]], socketserver.TCPServer]
"""Builds an unbound, unactivated server (``bind_and_activate=False``) for an address."""


def http_factory(server_cls: type[FakeHttpServer], handler: type[BaseHTTPRequestHandler], fake: Any) -> ServerFactory:
    """A :data:`ServerFactory` for an HTTP listener whose requests ``handler`` serves for ``fake``."""

    def build(address: tuple[str, int]) -> FakeHttpServer:
        server = server_cls(address, handler, bind_and_activate=False)
        server.fake = fake
        return server

    return build


class Listener:
    """A server bound to a fixed 127.0.0.1 port that can stop listening (refuse) and listen again."""

    def __init__(self, factory: ServerFactory, name: str) -> None:
        self.factory, self.name = factory, name
        """``name`` prefixes the serve thread's name (``{name}-{port}``)."""
        self.port = 0
        self.server: socketserver.TCPServer | None = None
        self.thread: threading.Thread | None = None
        self.listening = False

    def bind(self) -> None:
        """Bind (port 0 the first time, the same port afterwards) without listening: connects are refused."""
        if self.server is not None:
            return
        server = self.factory((LOCALHOST, self.port))
        try:
            server.server_bind()
        except OSError:
            server.server_close()
            raise
        self.server = server
        self.port = server.server_address[1]

    def listen(self) -> None:
        self.bind()
        if self.listening:
            return
        assert self.server is not None
        self.server.server_activate()
        self.listening = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name=f"{self.name}-{self.port}", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving, join the serve thread and close the socket."""
        server, self.server = self.server, None
        if server is None:
            return
        if self.listening:
            server.shutdown()
            self.listening = False
        if self.thread is not None:
            self.thread.join(timeout=5)
            self.thread = None
        server.server_close()

    def rebind(self) -> None:
        """Restart into the loading phase: close, then bind the same port without listening."""
        self.close()
        self.bind()


class FakeServer:
    """Lifecycle of a fake engine made of :class:`Listener` s. Subclasses call ``super().__init__()`` and
    return their listeners from :meth:`listeners`. Use :meth:`start` / :meth:`stop` (or a ``with`` block)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Any] = []
        """What every request served looked like (a tuple per request, per fake), for assertions."""

    def listeners(self) -> tuple[Listener, ...]:
        raise NotImplementedError

    def record(self, *request: Any) -> None:
        """Append one request to :attr:`requests` (takes :attr:`lock`)."""
        with self.lock:
            self.requests.append(request)

    def start(self, *, loading: bool = False) -> Self:
        """Bind every listener; listen unless ``loading`` (then connects are refused until
        :meth:`finish_loading`)."""
        for listener in self.listeners():
            listener.bind()
        if not loading:
            self.finish_loading()
        return self

    def finish_loading(self) -> None:
        """The engine is up: start listening and serving."""
        for listener in self.listeners():
            listener.listen()

    def begin_loading(self) -> None:
        """Model (re)load: keep the ports bound but stop listening, so connects are refused."""
        for listener in self.listeners():
            listener.rebind()

    def stop(self) -> None:
        for listener in self.listeners():
            listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeHandler(BaseHTTPRequestHandler):
    """Request plumbing shared by the fakes' handlers; subclasses override ``_dispatch(method)``."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        """Serve one request. A handler that serves no such method answers as ``http.server`` does
        for a method it has no ``do_`` for."""
        self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({self.command!r})")

    def _send(self, status: int, body: bytes = b"", content_type: str | None = None) -> None:
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _body(self) -> bytes:
        """The request body (read whole, so the connection stays usable)."""
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""


def refused(port: int) -> bool:
    """True when a TCP connect to 127.0.0.1:port is refused (used by tests of the loading phase)."""
    try:
        with socket.create_connection((LOCALHOST, port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def http_call(url: str, method: str = "GET", body: bytes | None = None,
              content_type: str | None = None) -> tuple[int, bytes, str]:
    """One raw HTTP exchange with a fake: (status, body, Content-Type), error statuses included.
    A POST without a body sends an empty one."""
    data = body if body is not None else (b"" if method == "POST" else None)
    headers = {"Content-Type": content_type} if content_type else {}
    req = urllib.request.Request(url, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(), exc.headers.get("Content-Type", "")
