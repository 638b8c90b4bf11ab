"""A remote client made by hand over a memory stream pair, for tests that write raw
frames to a node: :class:`Client`, a node serving such clients (:func:`serving`), and
what the node logged about one connection (:func:`records_of`)."""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import attrs
import pytest

from meshbus import Node
from meshbus.transports import (
    ConnectionState,
    FrameKind,
    LinkProtocol,
    ListenerSettings,
    MemoryByteStream,
    Role,
    Server,
    memory_stream_pair,
)
from meshbus.transports import _events as ev
from meshbus.transports._codec import decode_deliver_batch, options_to_wire

K = FrameKind
MAX_FRAME = 64 * 1024
PREFIX = struct.Struct("!IBI")
LOGGER = "meshbus.transports"

CLIENTS: list[Client] = []
"""Clients not yet closed: :func:`serving` closes them when a test fails half-way."""


def as_header(event: Any) -> Any:
    """A control frame's event as the header it came in (what these tests look at)."""
    if isinstance(event, ev.Ok):
        return {"id": event.id, **event.result}
    if isinstance(event, ev.ErrorAnswer):
        return event.header
    if attrs.has(type(event)):
        return attrs.asdict(event)
    return event


class Client:
    """A remote client made by hand over a memory pair (a :class:`LinkProtocol` and our end
    of the stream), served by ``server`` in ``tg``: it can write anything at any time."""

    def __init__(self, server: Server, tg: anyio.abc.TaskGroup, peer: str) -> None:
        self.ours, theirs = memory_stream_pair()
        self.protocol = LinkProtocol(Role.CLIENT, max_frame_size=1 << 24)
        self.frames: list[tuple[int, Any, bytes]] = []
        self.served = anyio.Event()
        tg.start_soon(self._serve, server, theirs, peer)
        CLIENTS.append(self)

    async def _serve(self, server: Server, stream: MemoryByteStream, peer: str) -> None:
        try:
            await server.serve(stream, peer=peer)
        finally:
            self.served.set()

    async def login(self, **hello: Any) -> tuple[int, Any, bytes]:
        """Send HELLO; return the node's answer (WELCOME or REFUSED)."""
        self.protocol.hello(hello)
        await self.flush()
        with anyio.fail_after(5):
            while self.protocol.state is ConnectionState.HANDSHAKE:
                await self.read()
        return self.frames.pop(0)

    async def request(self, kind: FrameKind, header: dict[str, Any], payload: bytes = b"") -> Any:
        """Send a request frame; return the header of its OK (or ERROR)."""
        self.protocol.send(kind, header, payload)
        await self.flush()
        return await self.wait_for(
            lambda f: f[0] in (K.OK, K.ERROR) and f[1].get("id") == header["id"]
        )

    async def flush(self) -> None:
        data = self.protocol.data_to_send()
        if data:
            await self.ours.send(data)

    async def read(self) -> None:
        for kind, header, payload in self.protocol.receive_data(await self.ours.receive(1 << 20)):
            if kind == K.DELIVER_BATCH:  # one DELIVER each, to look for them the same way
                self.frames += [
                    (
                        K.DELIVER,
                        [m.topic, m.sender, m.timestamp, options_to_wire(m.options)],
                        m.payload,
                    )
                    for m in decode_deliver_batch(header, payload)
                ]
            else:
                self.frames.append((kind, as_header(header), payload))
        await self.flush()  # PONGs

    async def wait_for(self, match: Callable[[tuple[int, Any, bytes]], bool]) -> Any:
        """Read until a frame matches; return its header."""
        with anyio.fail_after(5):
            while True:
                while self.frames:
                    frame = self.frames.pop(0)
                    if match(frame):
                        return frame[1]
                await self.read()

    async def hang_up(self) -> None:
        """Close our end and wait until the node is done with the connection."""
        await self.ours.aclose()
        with anyio.fail_after(5):
            await self.served.wait()
        CLIENTS.remove(self)


def records_of(caplog: pytest.LogCaptureFixture, start: int, peer: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records[start:]
        if r.name == LOGGER and isinstance(r.args, tuple) and r.args and r.args[0] == peer
    ]


ENDINGS = (
    "closing connection from %s",
    "refused login from %s",
    "connection from %s closed",
    "connection from %s ended",
    "connection from %s lost at login",
)


def settings_for_fuzz() -> ListenerSettings:
    return ListenerSettings(
        port=0,
        max_frame_size=MAX_FRAME,
        handshake_timeout=5,
        keepalive=300,  # no pings to the probe while the test runs
        keepalive_timeout=600,
    )


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[Node, Server, anyio.abc.TaskGroup]]:
    """A running node, a server of it (not listening: connections are served by hand) and a
    task group for the connections."""
    try:
        async with Node(name="node") as node, anyio.create_task_group() as tg:
            yield node, Server(node, settings_for_fuzz()), tg
            tg.cancel_scope.cancel()
    finally:
        while CLIENTS:
            await CLIENTS.pop().ours.aclose()
