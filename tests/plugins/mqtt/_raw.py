"""An MQTT 5 client made by hand, for tests that write packets as they choose (many
in one write, no acknowledgement unless told) and look at each packet the node wrote."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import mqtt5

from ._packets import CONNECT_5


class Raw:
    """An MQTT 5 client made by hand, to put many packets in one write."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buffer = b""
        self.packets: list[Any] = []

    async def read_until(self, done: Any, timeout: float = 10) -> None:
        with anyio.fail_after(timeout):
            while not done():
                self.buffer += await self.stream.receive()
                while self.buffer:
                    try:
                        packet, used = mqtt5.read(self.buffer)
                    except IndexError:  # incomplete: wait for more
                        break
                    self.packets.append(packet)
                    self.buffer = self.buffer[used:]

    async def take(self, kind: type) -> Any:
        """The first packet of ``kind`` the node wrote (waiting for it), taken out."""
        await self.read_until(lambda: any(type(p) is kind for p in self.packets))
        packet = next(p for p in self.packets if type(p) is kind)
        self.packets.remove(packet)
        return packet

    def payloads(self) -> list[bytes]:
        return [p.payload for p in self.packets if type(p) is mqtt5.PublishPacket]

    async def to_the_end(self) -> list[Any]:
        """Every packet the node writes until it closes the connection (which it must
        do within 5 s); the stream is closed after."""
        async with self.stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                await self.read_until(lambda: False, timeout=5)
        return self.packets


async def login(port: int, connect: bytes = CONNECT_5) -> Raw:
    client = Raw(await anyio.connect_tcp("127.0.0.1", port))
    await client.stream.send(connect)
    await client.read_until(lambda: client.packets)
    assert type(client.packets[0]) is mqtt5.ConnAckPacket
    client.packets.clear()
    return client
