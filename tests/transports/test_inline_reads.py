"""Frames read in the transport's callback (TCP on asyncio) keep the order of one read.

A node acts on publishes and acks as the bytes arrive and hands control frames that
may await (subscribe, bind, send, ...) to the connection's task, with the rest of the
read behind them. Whichever path a frame takes, it is acted on in the order the
client wrote it, on trio (no callback reads) as on asyncio.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import anyio.abc

from meshbus import Node
from meshbus.transports import Server, connect
from meshbus.transports._codec import (
    BATCH_LIMIT,
    decode_deliver,
    decode_deliver_batch,
    encode_publish,
    encode_publish_batch,
)
from meshbus.transports._connection import STEP_MESSAGES
from meshbus.transports._framing import FrameKind, encode_frame
from meshbus.transports._protocol import FRAME_SLICE, LinkProtocol, Role
from meshbus.transports._streams import connect_stream

K = FrameKind


class RawClient:
    """A client made by hand, to put many frames of different kinds in one write."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.protocol = LinkProtocol(Role.CLIENT, max_frame_size=1 << 26)
        self.frames: list[tuple[int, Any, bytes]] = []

    async def read_until(self, done: Any) -> None:
        with anyio.fail_after(10):
            while not done():
                self.frames.extend(self.protocol.receive_data(await self.stream.receive(1 << 20)))

    async def login(self) -> None:
        self.protocol.hello({"version": 1, "vpn": "default", "username": "raw"})
        await self.stream.send(self.protocol.data_to_send())
        await self.read_until(lambda: any(k == K.WELCOME for k, _, _ in self.frames))
        self.frames.clear()

    def payloads(self) -> list[bytes]:
        got: list[bytes] = []
        for kind, header, payload in self.frames:
            if kind == K.DELIVER:
                got.append(decode_deliver(header, payload).payload)
            elif kind == K.DELIVER_BATCH:
                got.extend(m.payload for m in decode_deliver_batch(header, payload))
        return got


async def test_publishes_and_subscription_changes_in_one_write_keep_their_order(
    node: Node, server: Server
) -> None:
    client = RawClient(await connect_stream(server.url))
    try:
        await client.login()
        send = client.protocol.send
        send_raw = client.protocol.send_raw
        send_raw(encode_publish("a/x", b"1"))  # nobody subscribed yet
        send(K.SUBSCRIBE, {"id": 1, "subscription": "a/>"})
        send_raw(encode_publish("a/x", b"2"))
        send(K.UNSUBSCRIBE, {"id": 2, "subscription": "a/>"})
        send_raw(encode_publish("a/x", b"3"))
        send(K.SUBSCRIBE, {"id": 3, "subscription": "a/>"})
        send_raw(encode_publish("a/x", b"4"))
        send(K.REQUEST, {"id": 4, "what": "sync"})
        send_raw(encode_publish("a/x", b"end"))
        await client.stream.send(client.protocol.data_to_send())  # one write

        def done() -> bool:
            answered = any(k == K.OK and h.id == 4 for k, h, _ in client.frames)
            return answered and b"end" in client.payloads()

        await client.read_until(done)
        assert client.payloads() == [b"2", b"4", b"end"]
        answered = [h.id for k, h, _ in client.frames if k == K.OK]
        assert answered == [1, 2, 3, 4]  # in the order asked
    finally:
        await client.stream.aclose()


async def test_a_bad_frame_behind_good_ones_closes_only_its_connection(
    node: Node, server: Server
) -> None:
    """A read with a bad frame is refused whole and the connection closed (what earlier
    reads did stands); another client goes on."""
    async with connect(server.url) as healthy:
        healthy.subscribe("b/>")
        await healthy.confirm()
        client = RawClient(await connect_stream(server.url))
        try:
            await client.login()
            client.protocol.send_raw(encode_publish("b/1", b"before"))
            await client.stream.send(client.protocol.data_to_send())
            with anyio.fail_after(10):
                assert (await healthy.receive()).payload == b"before"
            client.protocol.send_raw(encode_publish("b/1", b"refused with its read"))
            client.protocol.send_raw(encode_frame(0x99, {}))  # a kind no node takes
            await client.stream.send(client.protocol.data_to_send())
            await client.read_until(
                lambda: (
                    any(k == K.CLOSE or k == K.ERROR for k, _, _ in client.frames)
                    or client.protocol.state.name == "CLOSED"
                )
            )
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass  # the node closed it before saying why: closed all the same
        finally:
            await client.stream.aclose()
        healthy.publish("b/2", b"after")
        with anyio.fail_after(10):
            assert (await healthy.receive()).payload == b"after"


async def steps_of(node: Node, server: Server, data: bytes, count: int) -> tuple[list[bytes], int]:
    """Write ``data`` (``count`` publishes to ``f``) in one write; return the payloads
    a subscriber got, in order, and the most the node acted on between two turns of
    another task (trio may run the reader twice in one scheduling batch before the
    watcher, so a bound is two steps' worth)."""
    handled: list[bytes] = []
    node.connect(client_name="counter", on_message=lambda m: handled.append(m.payload)).subscribe(
        "f"
    )
    client = RawClient(await connect_stream(server.url))
    try:
        await client.login()
        seen: list[int] = []
        watching = anyio.Event()

        async def watch() -> None:
            watching.set()
            while not seen or seen[-1] < count:
                await anyio.lowlevel.checkpoint()
                seen.append(len(handled))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await watching.wait()
                await client.stream.send(data)
    finally:
        await client.stream.aclose()
    steps = [b - a for a, b in itertools.pairwise([0, *seen])]
    return handled, max(steps)


async def test_a_flood_of_small_frames_lets_others_run_between_slices(
    node: Node, server: Server
) -> None:
    """Thousands of one-message PUBLISH frames in one write are decoded and acted on a
    slice at a time: another task runs between slices, so one client cannot hold the
    event loop for the whole of a large read (on trio as on asyncio's callbacks)."""
    count = 5000
    handled, most = await steps_of(node, server, encode_publish("f", b"") * count, count)
    assert len(handled) == count
    assert most <= 2 * FRAME_SLICE


async def test_a_read_of_large_batches_is_acted_on_in_steps(node: Node, server: Server) -> None:
    """A few PUBLISH_BATCH frames of thousands of tiny messages each fit in one read;
    the node publishes at most STEP_MESSAGES of them per step, with other tasks' turns
    in between (one such read held the loop for about 30 ms), in order, none lost."""
    count = 4 * BATCH_LIMIT
    payloads = [b"%d" % i for i in range(count)]
    data = b"".join(
        encode_publish_batch([("f", p, None) for p in payloads[start : start + BATCH_LIMIT]])
        for start in range(0, count, BATCH_LIMIT)
    )
    handled, most = await steps_of(node, server, data, count)
    assert handled == payloads
    assert most <= 2 * STEP_MESSAGES


async def test_a_batch_over_the_message_limit_closes_only_its_connection(
    node: Node, server: Server
) -> None:
    async with connect(server.url) as healthy:
        healthy.subscribe("b/>")
        await healthy.confirm()
        client = RawClient(await connect_stream(server.url))
        try:
            await client.login()
            header = [["b/1", 0]] * (BATCH_LIMIT + 1)
            client.protocol.send(K.PUBLISH_BATCH, header)
            await client.stream.send(client.protocol.data_to_send())
            await client.read_until(
                lambda: (
                    any(k == K.CLOSE for k, _, _ in client.frames)
                    or client.protocol.state.name == "CLOSED"
                )
            )
            closes = [h for k, h, _ in client.frames if k == K.CLOSE]
            assert not closes or "more than the limit" in closes[0].reason
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass  # the node closed it before saying why: closed all the same
        finally:
            await client.stream.aclose()
        healthy.publish("b/2", b"after")
        with anyio.fail_after(10):
            assert (await healthy.receive()).payload == b"after"
