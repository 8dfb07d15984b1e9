"""A few lines of raw HTTP/1.1 over a socket, for what ``requests`` can't send (garbage, pipelining)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass


@dataclass
class RawResponse:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def connect(host: str, port: int, timeout: float = 30.0) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def request_bytes(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    host: str = "127.0.0.1",
    content_length: int | None = None,
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def json_request(path: str, payload, headers: dict[str, str] | None = None) -> bytes:
    body = json.dumps(payload).encode()
    return request_bytes("POST", path, body, {"Content-Type": "application/json", **(headers or {})})


class ResponseReader:
    """Reads consecutive responses (content-length framed, as inferd answers) from one socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.file = sock.makefile("rb")

    def read(self) -> RawResponse:
        status_line = self.file.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection without an answer")
        version, status, *reason = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        assert version.startswith("HTTP/1."), status_line
        headers: dict[str, str] = {}
        while True:
            line = self.file.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = self.file.read(length) if length else b""
        assert len(body) == length, f"short body: {len(body)} of {length}"
        return RawResponse(int(status), reason[0] if reason else "", headers, body)

    def at_eof(self) -> bool:
        """True when the server has closed the connection (nothing more to read)."""
        try:
            return self.file.read(1) == b""
        except (ConnectionResetError, TimeoutError, OSError):
            return True


def exchange(host: str, port: int, data: bytes, responses: int = 1, timeout: float = 30.0) -> list[RawResponse]:
    """Send ``data`` on a new connection and read ``responses`` answers."""
    with connect(host, port, timeout) as sock:
        sock.sendall(data)
        reader = ResponseReader(sock)
        return [reader.read() for _ in range(responses)]
