"""The bridge's loopback server: one thread per connected Spark worker.

It runs outside the node's event loop on purpose. Spark's workers ask for offsets
and batches while the app may be busy, and sealing or slicing Arrow batches is work
for a thread, not for the loop that routes messages. Whatever has to happen in the
loop (creating a stream, publishing a committed write) the handler hands over.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any

from ._wire import Body, error_header, read_message, write_message

__all__ = ["ControlServer", "Handler"]

log = logging.getLogger("meshbus.contrib.spark")

#: ``handler(header, body) -> (header, body)``; raising answers with the error.
Handler = Callable[[dict[str, Any], Body], tuple[dict[str, Any], Body]]


class _Connection(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.lock:
            self.server.connections.add(sock)
        try:
            self._serve(sock)
        finally:
            with self.server.lock:
                self.server.connections.discard(sock)

    def _serve(self, sock: socket.socket) -> None:
        while not self.server.closing:
            try:
                header, body = read_message(sock)
            except (ConnectionError, OSError, ValueError):
                return
            try:
                answer, payload = self.server.dispatch(header, body)
            except Exception as exc:  # every failure goes back to the worker, typed
                if not getattr(exc, "expected", False):
                    log.debug("spark bridge request %r failed", header.get("op"), exc_info=True)
                answer, payload = error_header(exc), b""
            try:
                write_message(sock, answer, payload)
            except OSError:
                return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], dispatch: Handler) -> None:
        self.dispatch = dispatch
        self.closing = False
        self.lock = threading.Lock()
        self.connections: set[socket.socket] = set()
        super().__init__(address, _Connection)


class ControlServer:
    """Serve ``dispatch`` on ``host:port`` (port 0 picks a free one) from a thread."""

    def __init__(self, host: str, port: int, dispatch: Handler) -> None:
        self._server = _Server((host, port), dispatch)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            # How often serve_forever checks for close()'s shutdown request (close()
            # waits up to that long); requests are served as they come, whatever it is.
            kwargs={"poll_interval": 0.05},
            name="meshbus-spark-bridge",
            daemon=True,
        )

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.closing = True
        self._server.shutdown()
        self._server.server_close()
        with self._server.lock:
            for sock in self._server.connections:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)
