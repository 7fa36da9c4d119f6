"""A fake of a DeepSpeed-MII 0.3.3 deployment: its REST gateway and its gRPC load-balancer port
(CONTRACTS.md section 3).

REST gateway (``mii/grpc_related/restful_gateway.py``, Flask; reproduced):

* ``POST /mii/<deployment_name>``: the JSON body is the kwargs of ``client.generate``
  (``{"prompts": [...], "max_new_tokens": n}`` or ``"max_length"``); 200 ``application/json`` list, one
  ``{"generated_text", "prompt_length", "generated_length", "finish_reason"}`` per prompt,
  ``finish_reason`` ``"length"`` when the token limit cut the reply, else ``"stop"``.
* Flask's own errors, as HTML pages (``text/html; charset=utf-8``): request ``Content-Type`` not
  ``application/json`` -> 415; undecodable JSON -> 400; other deployment name / unknown path -> 404;
  ``GET /mii/<name>`` -> 405; ``client.generate`` raising (no ``prompts``, unknown kwarg, backend down)
  -> 500 "Internal Server Error".
* ``GET /healthz`` -> 200 ``ok``, **static**: it answers even with ``down=True``, as in MII.

gRPC load balancer: **only a port-accept check is faked**. A plain TCP listener accepts and closes each
connection; it speaks no HTTP/2 or gRPC (no ``ModelResponse`` service). It exists so that a driver's
"the LB port accepts a TCP connection" check has something real to connect to.

Knobs:

* ``start(loading=True)`` / :meth:`begin_loading` / :meth:`finish_loading`: both ports bound but not
  listening, so every connect is *refused* (replicas still loading);
* ``down``: the load balancer (and replicas) died but the gateway lives: LB port refused, ``/healthz``
  still ``ok``, generate -> 500;
* ``slow_s``: seconds the gateway sleeps before answering a generate;
* ``hold``: a ``threading.Event``; while set to one, every generate waits (at most ``HOLD_LIMIT_S``)
  until the event is set, and :attr:`held` counts the generates waiting on it (a request the "model"
  is busy with, for tests that look at a meter while it is in flight);
* ``error_status``: answer every generate with this status and Flask's page for it;
* ``body_override``: bytes sent verbatim as the 200 generate body (malformed-reply tests);
* ``reply_text``: what the "model" generates (whitespace-separated words count as tokens).

``requests`` records (method, path, content type, body) of every gateway request.
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from http import HTTPStatus
from typing import Any

from tests.fakes.base import (
    FakeHandler,
    FakeHttpServer,
    FakeServer,
    Listener,
    http_factory,
)

GENERATE_KWARGS = frozenset({
    "max_length", "max_new_tokens", "min_new_tokens", "stream", "ignore_eos", "return_full_text",
    "do_sample", "top_p", "top_k", "temperature", "stop",
})
DEFAULT_MAX_LENGTH = 1024
HOLD_LIMIT_S = 10.0

_FLASK_TEXT = {
    400: "The browser (or proxy) sent a request that this server could not understand.",
    404: "The requested URL was not found on the server. If you entered the URL manually please check "
         "your spelling and try again.",
    405: "The method is not allowed for the requested URL.",
    415: "Did not attempt to load JSON data because the request Content-Type was not 'application/json'.",
    500: "The server encountered an internal error and was unable to complete your request. Either the "
         "server is overloaded or there is an error in the application.",
    503: "The server is temporarily unable to service your request due to maintenance downtime or "
         "capacity problems. Please try again later.",
}


def flask_error_page(status: int) -> bytes:
    """werkzeug's HTML error page for ``status``."""
    phrase = HTTPStatus(status).phrase
    text = _FLASK_TEXT.get(status, phrase + ".").replace("'", "&#39;")
    return (f"<!doctype html>\n<html lang=en>\n<title>{status} {phrase}</title>\n<h1>{phrase}</h1>\n"
            f"<p>{text}</p>\n").encode()


class _HttpServer(FakeHttpServer):
    fake: FakeMiiServer


class _AcceptAndClose(socketserver.BaseRequestHandler):
    def handle(self) -> None:  # the connection is closed by the server after handle()
        return


class _TcpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class FakeMiiServer(FakeServer):
    """One fake MII deployment on 127.0.0.1. Use :meth:`start` / :meth:`stop` (or a ``with`` block)."""

    def __init__(self, *, deployment_name: str = "mii-llama") -> None:
        super().__init__()
        self.deployment_name = deployment_name
        self.down = False
        self.slow_s = 0.0
        self.error_status: int | None = None
        self.body_override: bytes | None = None
        self.reply_text = "pong"
        self.hold: threading.Event | None = None
        self.held = 0
        self.requests: list[tuple[str, str, str, bytes]]
        self.generated_prompts: list[str] = []
        self._rest = Listener(http_factory(_HttpServer, _Handler, self), "fake-mii-rest")
        self._lb = Listener(lambda addr: _TcpServer(addr, _AcceptAndClose, bind_and_activate=False), "fake-mii-lb")

    # -- lifecycle (start / stop / begin_loading: tests.fakes.base.FakeServer) -------------------
    def listeners(self) -> tuple[Listener, ...]:
        return (self._rest, self._lb)

    @property
    def rest_port(self) -> int:
        return self._rest.port

    @property
    def grpc_port(self) -> int:
        return self._lb.port

    @property
    def rest_url(self) -> str:
        """``http://{HOST}:{RESTFUL_API_PORT}/mii/{DEPLOYMENT_NAME}`` (``docs/source/rest.rst``)."""
        return f"http://127.0.0.1:{self._rest.port}/mii/{self.deployment_name}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self._lb.port}"

    def finish_loading(self) -> None:
        self._rest.listen()
        if not self.down:
            self._lb.listen()

    def set_down(self, down: bool) -> None:
        """LB (and replicas) gone while the gateway stays up; ``False`` brings the LB back."""
        self.down = down
        if down:
            self._lb.rebind()
        elif self._rest.listening:
            self._lb.listen()

    # -- the "model" ----------------------------------------------------------------------------
    def generate(self, kwargs: Any) -> list[dict[str, Any]] | None:
        """``client.generate(**kwargs)``'s reply, or None where MII would raise (-> Flask 500)."""
        if not isinstance(kwargs, dict) or set(kwargs) - GENERATE_KWARGS - {"prompts"}:
            return None
        prompts = kwargs.get("prompts")
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            return None
        tokens = self.reply_text.split()
        out = []
        for prompt in prompts:
            prompt_length = len(prompt.split())
            limit = kwargs.get("max_new_tokens")
            if limit is None:
                limit = int(kwargs.get("max_length", DEFAULT_MAX_LENGTH)) - prompt_length
            n = max(0, min(len(tokens), int(limit)))
            out.append({"generated_text": " ".join(tokens[:n]), "prompt_length": prompt_length,
                        "generated_length": n, "finish_reason": "length" if n < len(tokens) else "stop"})
        with self.lock:
            self.generated_prompts.extend(prompts)
        return out


class _Handler(FakeHandler):
    server: _HttpServer
    server_version = "Werkzeug/3.1.3"
    sys_version = "Python/3.11"

    def _error(self, status: int) -> None:
        self._send(status, flask_error_page(status), "text/html; charset=utf-8")

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        body = self._body()
        content_type = self.headers.get("Content-Type", "")
        fake.record(method, self.path, content_type, body)
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            if method != "GET":
                self._error(405)
                return
            self._send(200, b"ok", "text/html; charset=utf-8")  # static, whatever the backend does
            return
        if path != f"/mii/{fake.deployment_name}":
            self._error(404)
            return
        if method != "POST":
            self._error(405)
            return
        self._generate(content_type, body)

    def _generate(self, content_type: str, body: bytes) -> None:
        fake = self.server.fake
        if fake.slow_s > 0:
            time.sleep(fake.slow_s)
        hold = fake.hold
        if hold is not None:
            with fake.lock:
                fake.held += 1
            try:
                hold.wait(HOLD_LIMIT_S)
            finally:
                with fake.lock:
                    fake.held -= 1
        if fake.error_status is not None:
            self._error(fake.error_status)
            return
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            self._error(415)
            return
        try:
            kwargs = json.loads(body)
        except ValueError:
            self._error(400)
            return
        if fake.down:
            self._error(500)  # client.generate raised: the gRPC load balancer is gone
            return
        if fake.body_override is not None:
            self._send(200, fake.body_override, "application/json")
            return
        reply = fake.generate(kwargs)
        if reply is None:
            self._error(500)
            return
        self._send(200, json.dumps(reply).encode() + b"\n", "application/json")
