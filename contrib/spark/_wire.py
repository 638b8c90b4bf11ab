"""Requests between Spark's Python workers and the bridge in the app's process.

Spark runs a data source's methods in worker processes it spawns, never in the
process that holds the node, so they reach the bridge over loopback TCP. A message
either way is ``u32 header length | u32 body length | JSON header | body``: the
header names the operation and its arguments (or the error), the body carries
Arrow IPC bytes for fetches and staged writes.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import orjson

from ._errors import BridgeError, BridgeUnavailableError, OffsetsUnavailableError, SparkOptionError
from ._options import parse_address

__all__ = ["Body", "BridgeClient", "error_header", "read_message", "write_message"]

#: A message body: bytes, a bytearray as received, or a ``pyarrow.Buffer`` to send
#: (anything with the buffer protocol; bodies are passed on without copies).
Body = Any

_PREFIX = struct.Struct("!II")
#: Upper bound of one header; bodies are bounded by the bridge's stage limit.
MAX_HEADER = 1 << 20
MAX_BODY = 1 << 31

_ERRORS: dict[str, type[BridgeError]] = {
    "OffsetsUnavailableError": OffsetsUnavailableError,
    "BridgeError": BridgeError,
}


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    view = memoryview(bytearray(n))
    got = 0
    while got < n:
        chunk = sock.recv_into(view[got:], n - got)
        if chunk == 0:
            raise ConnectionError("peer closed the connection")
        got += chunk
    return view.obj  # type: ignore[return-value]


def read_message(sock: socket.socket) -> tuple[dict[str, Any], Body]:
    """One message from ``sock``; raises ``ConnectionError`` at a clean end."""
    header_len, body_len = _PREFIX.unpack(_recv_exactly(sock, _PREFIX.size))
    if header_len > MAX_HEADER or body_len > MAX_BODY:
        raise ConnectionError(f"message too large ({header_len}/{body_len} bytes)")
    header = orjson.loads(_recv_exactly(sock, header_len))
    if not isinstance(header, dict):
        raise ConnectionError("message header is not a JSON object")
    # Bodies are Arrow IPC streams of up to tens of megabytes: handed on without a copy.
    body = _recv_exactly(sock, body_len) if body_len else b""
    return header, body


def write_message(sock: socket.socket, header: dict[str, Any], body: Body = b"") -> None:
    """Send one message; ``body`` is anything with the buffer protocol (a ``pa.Buffer``)."""
    encoded = orjson.dumps(header)
    sock.sendall(_PREFIX.pack(len(encoded), len(body)) + encoded)
    if body:
        sock.sendall(body)


def error_header(exc: BaseException) -> dict[str, Any]:
    """The header that carries ``exc`` back to the worker."""
    if isinstance(exc, SparkOptionError):
        return {"error": "SparkOptionError", "option": exc.option, "why": exc.why}
    name = type(exc).__name__ if type(exc).__name__ in _ERRORS else "BridgeError"
    return {"error": name, "message": str(exc)}


class BridgeClient:
    """A blocking connection to a bridge, for code that runs in Spark's workers.

    Connects lazily on the first request; pickled copies (Spark sends readers and
    writers to executors) start without a socket.
    """

    def __init__(self, address: str, *, timeout: float = 60.0) -> None:
        self.address = address
        self.timeout = timeout
        self._sock: socket.socket | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"address": self.address, "timeout": self.timeout, "_sock": None}

    def _connect(self) -> socket.socket:
        host, port = parse_address(self.address)
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout)
        except OSError as exc:
            raise BridgeUnavailableError(
                f"no meshbus Spark bridge answers at {self.address} ({exc}); start one "
                "in the app (meshbus.contrib.spark.SparkBridge) and pass its address "
                "with .option('address', ...)"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def request(self, op: str, body: Body = b"", **fields: Any) -> tuple[dict[str, Any], Body]:
        """Send one request and wait for its answer; raise the bridge's error."""
        if self._sock is None:
            self._sock = self._connect()
        try:
            write_message(self._sock, {"op": op, **fields}, body)
            header, answer = read_message(self._sock)
        except (OSError, ConnectionError) as exc:
            self.close()
            raise BridgeUnavailableError(
                f"the Spark bridge at {self.address} went away during {op!r}: {exc}"
            ) from None
        error = header.get("error")
        if error is not None:
            if error == "SparkOptionError":
                raise SparkOptionError(header["option"], header["why"])
            raise _ERRORS.get(error, BridgeError)(header.get("message", error))
        return header, answer

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
