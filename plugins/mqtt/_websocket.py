"""MQTT over WebSocket (MQTT 5, chapter 6): the HTTP upgrade of an accepted stream,
and a byte stream of the binary messages that follow, for browsers and the devices
that can only reach a node through an HTTP port.

The WebSocket framing is `wsproto`'s (sans-IO, no extension offered, so no
compression bomb can come through); this module only moves bytes. MQTT packets may
span WebSocket messages and a message may hold several packets: the connection's
:class:`~meshbus.plugins.mqtt._codec.PacketReader` reads what this stream hands it,
as it does on TCP. A data frame's payload is handed on as it arrives, never held whole,
so the packet size limit stays the one bound on what a client can make the node keep.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from meshbus.abc import Clock

__all__ = ["SUBPROTOCOLS", "WebSocketStream", "accept_websocket"]

log = logging.getLogger("meshbus.mqtt")

SUBPROTOCOLS = ("mqtt", "mqttv3.1")
"""The WebSocket subprotocols taken, in the order they are preferred: ``mqtt`` is the
one MQTT 3.1.1 and 5 name (MQTT-6.0.0-3); some older clients offer only ``mqttv3.1``."""

_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_NORMAL = 1000
_UNSUPPORTED_DATA = 1003  # a text message: MQTT travels in binary ones only (MQTT-6.0.0-1)


class WebSocketStream(anyio.abc.ByteStream):
    """The bytes of a WebSocket connection's binary messages, both ways."""

    def __init__(self, stream: anyio.abc.ByteStream, connection: WSConnection) -> None:
        self._stream = stream
        self._ws = connection
        self._pending: list[bytes] = []
        self._lock = anyio.Lock()  # a pong and a message may be written from two tasks
        self._closed = False

    @property
    def extra_attributes(self) -> Any:
        return self._stream.extra_attributes

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while not self._pending:
            await self._events()
            if self._pending:
                break
            if self._closed:
                raise anyio.EndOfStream
            data = await self._stream.receive(max_bytes)
            self._ws.receive_data(data)
        data = b"".join(self._pending)
        self._pending.clear()
        return data

    async def _events(self) -> None:
        for event in self._ws.events():
            if isinstance(event, BytesMessage):
                if event.data:
                    self._pending.append(bytes(event.data))
            elif isinstance(event, Ping):
                await self._write(self._ws.send(event.response()))
            elif isinstance(event, TextMessage):
                await self._close(_UNSUPPORTED_DATA, "MQTT goes in binary messages")
                raise anyio.BrokenResourceError("the client sent a text message")
            elif isinstance(event, CloseConnection):
                if not self._closed:
                    self._closed = True
                    # Answer it (a protocol error wsproto found says why, as its code).
                    await self._write(self._ws.send(event.response()))
                if event.code not in (_NORMAL, 1001, 1005):
                    log.info("WebSocket closed: %s %s", event.code, event.reason or "")

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        await self._write(self._ws.send(BytesMessage(data=item)))

    async def _write(self, data: bytes) -> None:
        async with self._lock:
            await self._stream.send(data)

    async def _close(self, code: int, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with anyio.move_on_after(1):
                await self._write(self._ws.send(CloseConnection(code=code, reason=reason)))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, LocalProtocolError):
            pass

    async def send_eof(self) -> None:
        raise NotImplementedError("a WebSocket has no half-close")

    async def aclose(self) -> None:
        try:
            await self._close(_NORMAL, "")
        finally:
            await self._stream.aclose()


async def accept_websocket(
    stream: anyio.abc.ByteStream, path: str, clock: Clock, timeout: float, peer: str
) -> WebSocketStream | None:
    """The upgrade of ``stream`` to a WebSocket for MQTT, within ``timeout`` seconds of
    ``clock``: a request for ``path`` offering an MQTT subprotocol is accepted; any
    other request is answered with its HTTP error (logged) and ``None`` returned."""
    connection = WSConnection(ConnectionType.SERVER)
    why = None
    try:
        with clock.fail_after(timeout):
            request = await _request(stream, connection)
            target = request.target.split("?", 1)[0]
            offered = [p.strip().lower() for p in request.subprotocols]
            chosen = next((p for p in SUBPROTOCOLS if p in offered), None)
            if target != path:
                why = f"no MQTT at {target!r} (it is at {path!r})"
                await stream.send(connection.send(_reject(404)))
            elif chosen is None:
                why = f"subprotocol 'mqtt' not offered (offered: {request.subprotocols})"
                await stream.send(connection.send(_reject(400)))
            else:
                await stream.send(connection.send(AcceptConnection(subprotocol=chosen)))
                return WebSocketStream(stream, connection)
    except RemoteProtocolError as exc:
        why = f"not a WebSocket upgrade: {exc}"
        with anyio.move_on_after(1):
            await _quietly(stream.send(_BAD_REQUEST))
    except TimeoutError:
        why = "no WebSocket upgrade in time"
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        why = "connection lost during the WebSocket upgrade"
    log.info("closing MQTT WebSocket connection from %s: %s", peer, why)
    await anyio.aclose_forcefully(stream)
    return None


async def _request(stream: anyio.abc.ByteStream, connection: WSConnection) -> Request:
    """The upgrade request (the HTTP parser bounds its size)."""
    while True:
        data = await stream.receive(65536)
        connection.receive_data(data)
        for event in connection.events():
            if isinstance(event, Request):
                return event
            raise RemoteProtocolError(f"{type(event).__name__} before the request")


def _reject(status: int) -> RejectConnection:
    return RejectConnection(
        status_code=status, headers=[(b"content-length", b"0"), (b"connection", b"close")]
    )


async def _quietly(sending: Any) -> None:
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await sending
