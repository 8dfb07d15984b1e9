"""A lean HTTP/1.1 server: asyncio protocol + httptools' parser.

Why not an ASGI framework: on the inference path the framework's per-request objects, middleware
stack and coroutine hops cost more than everything else the server does for a small model. Here a
request is parsed by httptools (llhttp, in C), handed to one callback, and answered by one write.
Keep-alive, pipelining (answers in order), request size limits, gzip/deflate request bodies and a
graceful drain are handled here so no front end has to think about them.

Answers can be sent from any thread (``respond_from_thread``): the instance that computed a batch
writes its answers straight to the sockets, through a duplicate of each connection's file
descriptor, while the event loop goes on parsing. The loop then only does the bookkeeping
(``finish``). The send system call is most of what a small request costs the server, and it
releases the GIL, so this takes it off the one thread that every request has to pass through.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import zlib
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from time import perf_counter_ns
from typing import Any

import httptools
import orjson

log = logging.getLogger("inferd.http")

Handler = Callable[["HttpRequest"], None]

_STATUS_LINES = {status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode() for status in HTTPStatus}
#: Pipelined requests buffered per connection before reading pauses (flow control).
_PIPELINE_HIGH_WATER = 16


class HttpRequest:
    """One parsed request. The handler answers it exactly once with ``respond``."""

    __slots__ = (
        "method",
        "path",
        "query",
        "headers",
        "body",
        "received_ns",
        "keep_alive",
        "http10",
        "_conn",
        "answered",
        "_unsent",
    )

    def __init__(
        self,
        conn: HttpConnection,
        method: bytes,
        path: str,
        query: str,
        headers: dict[bytes, bytes],
        body: bytes,
        keep_alive: bool,
        http10: bool,
    ) -> None:
        self._conn = conn
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http10 = http10
        self.received_ns = perf_counter_ns()
        self.answered = False
        self._unsent: bytes | memoryview | None = None

    def respond(
        self,
        status: int,
        body: bytes | list[Any] = b"",
        content_type: bytes = b"application/json",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Send the answer, on the event loop. ``body`` may be a list of bytes-like parts."""
        data = self._render_once(status, body, content_type, headers)
        if data is None:
            return
        conn = self._conn
        if conn.transport is not None and self is conn._current:
            conn.transport.write(data)
        conn.finished(self)

    def respond_from_thread(
        self,
        status: int,
        body: bytes | list[Any] = b"",
        content_type: bytes = b"application/json",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Like ``respond``, from any thread; ``finish`` must follow on the event loop."""
        data = self._render_once(status, body, content_type, headers)
        if data is None:
            return
        conn = self._conn
        direct = conn.direct
        # Only plain reads of flags the loop maintains: transport methods are not thread-safe.
        if direct is not None and conn.direct_ok:
            try:
                sent = direct.send(data, socket.MSG_NOSIGNAL)
            except BlockingIOError:
                sent = 0
            except OSError:
                return  # the client is gone; finish() cleans up
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
        self._unsent = data

    def _render_once(
        self, status: int, body: bytes | list[Any], content_type: bytes, headers: list[tuple[bytes, bytes]] | None
    ) -> bytes | None:
        """The answer's bytes, or None when the request was answered already."""
        if self.answered:
            return None
        self.answered = True
        return self._conn.render(self, status, body, content_type, headers)

    def finish(self) -> None:
        """On the event loop, after ``respond_from_thread``: write what the thread could not, and
        let the connection go on to its next request."""
        conn = self._conn
        if self._unsent is not None and conn.transport is not None and self is conn._current:
            conn.transport.write(self._unsent)
        self._unsent = None
        conn.finished(self)

    def respond_json(self, status: int, payload: Any) -> None:
        self.respond(status, orjson.dumps(payload))

    def respond_error(self, status: int, message: str) -> None:
        self.respond(status, orjson.dumps({"error": message}))

    @property
    def peer(self) -> str:
        peer = self._conn.peer
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests, runs them one at a time, writes answers in order."""

    __slots__ = (
        "server",
        "transport",
        "parser",
        "peer",
        "_url",
        "_headers",
        "_body",
        "_body_size",
        "_too_large",
        "_current",
        "_pipeline",
        "_paused",
        "_closing",
        "_deferred_error",
        "direct",
        "direct_ok",
    )

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.peer: Any = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        self._too_large = False
        self._current: HttpRequest | None = None
        self._pipeline: deque[HttpRequest] = deque()
        self._paused = False
        self._closing = False
        self._deferred_error: tuple[int, str] | None = None
        self.direct: socket.socket | None = None
        #: True while nothing of ours waits in the transport's buffer, so a thread may write
        #: straight to the socket without overtaking it. Maintained on the event loop.
        self.direct_ok = False

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        self.server.connections.add(self)
        sock = transport.get_extra_info("socket")
        if self.server.direct_writes and sock is not None and transport.get_extra_info("sslcontext") is None:
            # Our own descriptor for the same socket: stays valid until *we* close it, so a
            # thread writing an answer can never hit a descriptor number the loop reused.
            self.direct = socket.socket(fileno=os.dup(sock.fileno()))
            self.direct_ok = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.direct_ok = False
        self.transport = None
        self._pipeline.clear()
        if self._current is None:
            self._close_direct()

    def _close_direct(self) -> None:
        if self.direct is not None:
            self.direct.close()
            self.direct = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol upgrades: the request was read as plain HTTP/1.1
        except httptools.HttpParserError as exc:
            self._fatal(400, f"malformed HTTP request: {exc}")

    # -- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_size = 0
        self._too_large = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        length = self._headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_request_size:
            self._too_large = True
        elif (
            self._headers.get(b"expect", b"").lower() == b"100-continue"
            and self.transport is not None
            and self._current is None  # never ahead of an answer still being written
        ):
            # curl asks before sending large bodies; without this it waits a second for nothing.
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        self._body_size += len(body)
        if self._body_size > self.server.max_request_size:
            self._too_large = True
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self.parser
        if self._too_large:
            self._fatal(413, f"request body exceeds the maximum request size of {self.server.max_request_size} bytes")
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        url = self._url.decode("latin-1")
        path, _, query = url.partition("?")
        request = HttpRequest(
            self,
            parser.get_method(),
            path,
            query,
            self._headers,
            body,
            parser.should_keep_alive(),
            parser.get_http_version() == "1.0",
        )
        if self._current is None:
            self._dispatch(request)
        else:
            self._pipeline.append(request)
            if len(self._pipeline) >= _PIPELINE_HIGH_WATER and not self._paused and self.transport:
                self._paused = True
                self.transport.pause_reading()

    # -- requests ----------------------------------------------------------------------------
    def _dispatch(self, request: HttpRequest) -> None:
        self._current = request
        self.server.inflight += 1
        encoding = request.headers.get(b"content-encoding")
        if encoding is not None and request.body:
            try:
                request.body = _decompress(encoding, request.body, self.server.max_request_size)
            except ValueError as exc:
                request.respond_error(400, str(exc))
                return
        try:
            self.server.handler(request)
        except Exception as exc:  # a handler bug must cost one request, not the connection
            log.exception("unhandled error for %s %s", request.method.decode(), request.path)
            request.respond_error(500, f"internal server error: {exc!r}")

    def render(
        self,
        request: HttpRequest,
        status: int,
        body: bytes | list[Any],
        content_type: bytes,
        headers: list[tuple[bytes, bytes]] | None,
    ) -> bytes:
        """The bytes of an answer (pure: safe from any thread)."""
        if isinstance(body, list):
            length = 0
            for part in body:
                length += len(part)
        else:
            length = len(body)
        keep_alive = request.keep_alive and not self._closing and not self.server.closing
        request.keep_alive = keep_alive
        head = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode()]
        head.append(b"content-type: %s\r\ncontent-length: %d\r\n" % (content_type, length))
        if headers:
            for name, value in headers:
                head.append(b"%s: %s\r\n" % (name, value))
        if not keep_alive:
            head.append(b"connection: close\r\n")
        elif request.http10:
            head.append(b"connection: keep-alive\r\n")
        head.append(b"\r\n")
        if isinstance(body, list):
            head.extend(body)
        else:
            head.append(body)
        return b"".join(head)

    def finished(self, request: HttpRequest) -> None:
        """On the event loop, once an answer went out: close or go on to the next request."""
        self.server.inflight -= 1
        if request is not self._current:
            return
        self._current = None
        transport = self.transport
        if transport is None:
            self._close_direct()
            return
        if self._deferred_error is not None:
            status, message = self._deferred_error
            self._deferred_error = None
            self._fatal(status, message)
            return
        if not request.keep_alive or self.server.closing:
            transport.close()
            return
        self.direct_ok = self.direct is not None and transport.get_write_buffer_size() == 0
        if self._pipeline:
            nxt = self._pipeline.popleft()
            if self._paused and len(self._pipeline) < _PIPELINE_HIGH_WATER // 2:
                self._paused = False
                transport.resume_reading()
            self._dispatch(nxt)

    def _fatal(self, status: int, message: str) -> None:
        """Answer a request we cannot parse or accept, then close the connection."""
        self._closing = True
        transport = self.transport
        if transport is None:
            return
        if self._current is None:
            body = orjson.dumps({"error": message})
            transport.write(
                _STATUS_LINES[status]
                + b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
                + body
            )
            transport.close()
        else:
            # Answer the one in progress first, then this error, then close.
            self._pipeline.clear()
            self._deferred_error = (status, message)
            transport.pause_reading()

    def close_if_idle(self) -> None:
        self._closing = True
        if self._current is None and self.transport is not None:
            self.transport.close()


def _decompress(encoding: bytes, body: bytes, limit: int) -> bytes:
    encoding = encoding.strip().lower()
    if encoding == b"identity":
        return body
    if encoding == b"gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == b"deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise ValueError(f"unsupported content-encoding '{encoding.decode('latin-1')}' (use gzip or deflate)")
    decompressor = zlib.decompressobj(wbits)
    try:
        out = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"failed to decompress the {encoding.decode()} request body: {exc}") from None
    if len(out) > limit:
        raise ValueError(f"decompressed request body exceeds the maximum request size of {limit} bytes")
    return out


class HttpServer:
    """Listens on one address and hands each parsed request to ``handler``."""

    def __init__(
        self,
        handler: Handler,
        host: str,
        port: int,
        max_request_size: int = 64 * 1024 * 1024,
        direct_writes: bool = True,
    ) -> None:
        self.handler = handler
        self.direct_writes = direct_writes
        self.host = host
        self.port = port
        self.max_request_size = max_request_size
        self.connections: set[HttpConnection] = set()
        self.inflight = 0
        self.closing = False
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpConnection(self), self.host, self.port, reuse_address=True, backlog=1024
        )
        sockets = self._server.sockets or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

    async def drain(self, timeout: float) -> bool:
        """Stop accepting, let in-flight requests finish (up to ``timeout``), close connections.
        Returns True when everything in flight was answered."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close_if_idle()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.inflight > 0 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        return self.inflight <= 0
