"""Input limits over the wire (SPEC 10): what a node accepts it can deliver, and a client
refuses locally what the node would refuse."""

from __future__ import annotations

import contextlib
import logging
import struct
from typing import Any

import anyio
import anyio.abc
import pytest

from meshbus import HEADER_LIMITS, Message, Node, PublishRejectedError
from meshbus.plugins.guaranteed._service import GuaranteedService
from meshbus.transports import (
    FrameKind,
    ListenerSettings,
    RemoteFlow,
    RemoteSession,
    Server,
    _serving,
    connect,
    start_server,
)

from .conftest import wait_until
from .test_reconnect_keepalive import fast


def nested(depth: int) -> dict[str, Any]:
    """Headers nested ``depth`` levels deep, the headers object itself being the first."""
    value: Any = "bottom"
    for _ in range(depth - 1):
        value = [value]
    return {"k": value}


async def receive(session: RemoteSession | RemoteFlow, timeout: float = 3.0) -> Message:
    with anyio.fail_after(timeout):
        return await session.receive()


def service(node: Node) -> GuaranteedService:
    svc = node.guaranteed
    assert isinstance(svc, GuaranteedService)
    return svc


# --- defect 1: headers a node accepts are headers it can deliver ------------------------------


async def test_deep_headers_a_publish_accepts_reach_a_remote_subscriber(
    node: Node, server: Server
) -> None:
    async with connect(server.url, reconnect=False) as subscriber:
        subscriber.subscribe("deep/>")
        await subscriber.confirm()
        publisher = node.connect()
        limit = HEADER_LIMITS.max_depth
        accepted, refused = [], set()
        for depth in (limit - 1, limit, limit + 1, 97, 98, 99, 150):
            headers = nested(depth)
            try:
                # Two at once: the node writes them as one DELIVER_BATCH, its deepest frame.
                publisher.publish("deep/a", b"1", headers=headers)
                publisher.publish("deep/b", b"2", headers=headers)
            except PublishRejectedError as exc:
                refused.add(exc.reason)
                continue
            accepted.append(depth)
            got = [await receive(subscriber), await receive(subscriber)]
            assert [(m.topic, m.headers) for m in got] == [
                ("deep/a", headers),
                ("deep/b", headers),
            ]
        assert subscriber.connected
        assert subscriber.connects == 1
        assert accepted == [limit - 1, limit]
        assert refused == {"headers-too-deep"}


# --- what a node writes fits the frames its subscribers read ----------------------------------


def sized(size: int, keys: int = 1) -> dict[str, Any]:
    """Headers of about ``size`` bytes of JSON, in ``keys`` string values."""
    each = max(size // keys - 12, 1)
    return {f"h{i:03}": "v" * each for i in range(keys)}


async def test_large_headers_a_publish_accepts_reach_a_remote_subscriber(
    node: Node, server: Server
) -> None:
    async with connect(server.url, reconnect=False) as subscriber:
        subscriber.subscribe("big/>")
        await subscriber.confirm()
        publisher = node.connect()
        accepted, refused = [], set()
        for size in (1_000, 60_000, 200_000, 1_500_000):
            headers = sized(size, keys=8)
            try:
                publisher.publish("big/a", b"1", headers=headers)
                publisher.publish("big/b", b"2", headers=headers)
            except PublishRejectedError as exc:
                refused.add(exc.reason)
                continue
            accepted.append(size)
            got = [await receive(subscriber), await receive(subscriber)]
            assert [(m.topic, m.headers) for m in got] == [("big/a", headers), ("big/b", headers)]
        assert subscriber.connected
        assert subscriber.connects == 1
        assert accepted == [1_000, 60_000]  # HEADER_LIMITS.max_bytes is 64 KiB
        assert refused == {"headers-too-large"}


async def test_a_burst_of_messages_with_headers_reaches_a_remote_subscriber(
    node: Node, server: Server
) -> None:
    # Their headers together are far more than one frame's header may hold.
    async with connect(server.url, reconnect=False) as subscriber:
        subscriber.subscribe("burst/>")
        await subscriber.confirm()
        publisher = node.connect()
        headers = sized(50_000, keys=4)
        for i in range(40):
            publisher.publish(f"burst/{i}", b"", headers=headers)
        got = [await receive(subscriber) for _ in range(40)]
        assert [m.topic for m in got] == [f"burst/{i}" for i in range(40)]
        assert all(m.headers == headers for m in got)
        assert subscriber.connected
        assert subscriber.connects == 1


LONG = "x" * 244 + "/long"  # 249 bytes: within the default topic limit of 250


async def test_a_burst_on_long_topics_reaches_a_remote_subscriber(
    node: Node, server: Server
) -> None:
    async with connect(server.url, reconnect=False) as subscriber:
        subscriber.subscribe(LONG)
        await subscriber.confirm()
        publisher = node.connect()
        for i in range(5_000):
            publisher.publish(LONG, b"%d" % i)
        got = [await receive(subscriber) for _ in range(5_000)]
        assert [m.payload for m in got] == [b"%d" % i for i in range(5_000)]
        assert subscriber.connected
        assert subscriber.connects == 1


async def test_pipelined_sends_wait_for_the_spool_within_a_byte_bound(
    node: Node, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node reads guaranteed sends ahead of the spool; while the spool is slow, what
    # it holds of them must be bounded in bytes, not only in frames.
    bound = 256 * 1024
    monkeypatch.setattr(_serving, "_MAX_PIPELINED_BYTES", bound)
    svc = service(node)
    svc.create_queue("slow", subscriptions=["slow/>"])
    spool = anyio.Event()
    send, send_many = svc.send, svc.send_many

    async def slow_send(*args: Any) -> None:
        await spool.wait()
        await send(*args)

    async def slow_send_many(*args: Any) -> list[Exception | None]:
        await spool.wait()
        return await send_many(*args)

    monkeypatch.setattr(svc, "send", slow_send)
    monkeypatch.setattr(svc, "send_many", slow_send_many)
    async with connect(server.url) as producer, anyio.create_task_group() as tg:
        for i in range(40):  # 2.5 MiB, written at once
            tg.start_soon(producer.send, f"slow/{i}", bytes(64 * 1024))
        await wait_until(lambda: server.statistics().bytes_received > bound)
        await anyio.sleep(0.2)  # what the node would read meanwhile, it has read
        assert server.statistics().bytes_received < 4 * bound  # the rest waits in TCP
        spool.set()
    assert svc.store.stats("default/slow").messages == 40


# --- defect 3: before login a connection holds little -----------------------------------------

PREFIX = struct.Struct("!IBI")


async def hung_up(stream: anyio.abc.ByteStream, timeout: float = 2.0) -> bytes:
    """What the node wrote before it closed ``stream`` (fails the test if it does not)."""
    received = b""
    with anyio.fail_after(timeout):
        try:
            while True:
                received += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return received


async def test_before_login_only_a_small_frame_is_accepted(
    node: Node, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="meshbus.transports")
    size = 1024 * 1024  # far below the frame limit after login
    async with await anyio.connect_tcp("127.0.0.1", server.port) as stream:
        await stream.send(PREFIX.pack(size, FrameKind.HELLO, 100) + bytes(60_000))
        assert await hung_up(stream) == b""
    assert server.statistics().failed == 1
    [reason] = [r.getMessage() for r in caplog.records if "closing connection" in r.getMessage()]
    assert f"frame of {size} bytes is larger than the limit of 65536 before login" in reason
    # Once logged in, a session may send frames up to the listener's limit.
    local = node.connect()
    local.subscribe("after/login")
    async with connect(server.url, reconnect=False) as publisher:
        publisher.publish("after/login", bytes(size))
        await publisher.confirm()
    [message] = iter(local.receive_nowait, None)
    assert len(message.payload) == size


async def test_connections_over_the_unauthenticated_limit_are_closed_at_once(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="meshbus.transports")
    server = await start_server(node, ListenerSettings(port=0, max_unauthenticated=3))
    async with contextlib.AsyncExitStack() as stack:
        idle = [
            await stack.enter_async_context(await anyio.connect_tcp("127.0.0.1", server.port))
            for _ in range(3)
        ]
        await wait_until(lambda: server.statistics().open == 3)
        for _ in range(20):
            async with await anyio.connect_tcp("127.0.0.1", server.port) as extra:
                assert await hung_up(extra) == b""
        stats = server.statistics()
        assert (stats.turned_away, stats.open, stats.accepted) == (20, 3, 23)
        # One line for the burst, not one per connection.
        lines = [r for r in caplog.records if "unauthenticated" in r.getMessage()]
        assert len(lines) == 1
        assert lines[0].levelno == logging.WARNING
        # A connection that ends frees its place; logged-in sessions take none.
        await idle.pop().aclose()
        await wait_until(lambda: server.statistics().open == 2)
        async with connect(server.url, reconnect=False) as session:
            idle.append(
                await stack.enter_async_context(await anyio.connect_tcp("127.0.0.1", server.port))
            )
            await wait_until(lambda: server.statistics().open == 4)
            await session.confirm()
        assert server.statistics().turned_away == 20


# --- defect 4: a client refuses what the node would refuse ------------------------------------

SMALL_FRAME = 64 * 1024


async def test_a_publish_larger_than_the_node_takes_is_refused_locally(node: Node) -> None:
    small = await start_server(node, ListenerSettings(port=0, max_frame_size=SMALL_FRAME))
    local = node.connect()
    local.subscribe("frame/>")
    async with connect(small.url, reconnect=False) as publisher:
        with pytest.raises(PublishRejectedError) as caught:
            publisher.publish("frame/big", bytes(SMALL_FRAME))
        assert caught.value.reason == "too-large"
        assert caught.value.limit == SMALL_FRAME
        assert caught.value.size is not None
        assert caught.value.size > SMALL_FRAME
        publisher.publish("frame/small", b"fits")
        await publisher.confirm()
        assert publisher.connects == 1
        assert publisher.published == 1
    assert [m.topic for m in iter(local.receive_nowait, None)] == ["frame/small"]


async def test_a_send_larger_than_the_node_takes_is_refused_locally(node: Node) -> None:
    service(node).create_queue("sends", subscriptions=["frame/>"])
    small = await start_server(node, ListenerSettings(port=0, max_frame_size=SMALL_FRAME))
    async with connect(small.url, backoff=fast()) as producer:
        with anyio.fail_after(3):
            with pytest.raises(PublishRejectedError) as caught:
                await producer.send("frame/big", bytes(SMALL_FRAME))
            assert (caught.value.reason, caught.value.limit) == ("too-large", SMALL_FRAME)
            with pytest.raises(PublishRejectedError) as caught:
                await producer.send_to_queue("sends", bytes(SMALL_FRAME))
            assert (caught.value.reason, caught.value.limit) == ("too-large", SMALL_FRAME)
            [result] = await producer.send_many([("frame/big", bytes(SMALL_FRAME))])
            assert isinstance(result, PublishRejectedError)
            assert result.reason == "too-large"
            await producer.send("frame/small", b"fits")  # later requests are answered
        assert producer.connects == 1
    assert service(node).store.stats("default/sends").messages == 1


async def test_a_send_waiting_for_a_node_that_now_takes_less_is_refused_not_resent(
    node: Node,
) -> None:
    service(node).create_queue("sends", subscriptions=["frame/>"])
    roomy = await start_server(node, ListenerSettings(port=0, max_frame_size=4 * SMALL_FRAME))
    port = roomy.port
    async with connect(roomy.url, backoff=fast()) as producer:
        await roomy.aclose()
        with anyio.fail_after(3):
            while producer.connected:
                await anyio.sleep(0.01)
        results: list[BaseException | None] = []

        async def send(payload: bytes) -> None:
            try:
                await producer.send("frame/x", payload)
            except PublishRejectedError as exc:
                results.append(exc)
            else:
                results.append(None)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, bytes(2 * SMALL_FRAME))  # fitted the node it was made for
            await anyio.sleep(0.05)
            tg.start_soon(send, b"small")
            await anyio.sleep(0.05)
            assert results == []  # both wait for the node
            small = await start_server(
                node, ListenerSettings(port=port, max_frame_size=SMALL_FRAME)
            )
            with anyio.fail_after(3):
                while len(results) < 2:
                    await anyio.sleep(0.01)
        refused = [r for r in results if r is not None]
        assert len(refused) == 1
        assert isinstance(refused[0], PublishRejectedError)
        assert (refused[0].reason, refused[0].limit) == ("too-large", SMALL_FRAME)
        assert producer.connects == 2
        assert small.statistics().failed == 0
    assert service(node).store.stats("default/sends").messages == 1


async def test_deep_headers_a_send_accepts_reach_the_queue_consumer(
    node: Node, server: Server
) -> None:
    service(node).create_queue("deep", subscriptions=["deep/>"])
    async with (
        connect(server.url, backoff=fast()) as producer,
        connect(server.url, backoff=fast()) as consumer,
    ):
        flow = await consumer.bind("deep")
        limit = HEADER_LIMITS.max_depth
        accepted, refused = [], set()
        for depth in (limit - 1, 99, limit, 98, 100, limit + 1, 150):
            headers = nested(depth)
            try:
                with anyio.fail_after(3):
                    await producer.send("deep/x", str(depth), headers=headers)
            except PublishRejectedError as exc:
                refused.add(exc.reason)
                continue
            accepted.append(depth)
            message = await receive(flow)
            assert (message.payload, message.headers) == (str(depth).encode(), headers)
            flow.ack(message)
        assert accepted == [limit - 1, limit]
        assert refused == {"headers-too-deep"}
        assert (producer.connects, consumer.connects) == (1, 1)


async def test_a_remote_burst_on_long_topics_reaches_the_node(node: Node, server: Server) -> None:
    local = node.connect()
    local.subscribe(LONG)
    async with connect(server.url, reconnect=False) as publisher:
        for i in range(5_000):
            publisher.publish(LONG, b"%d" % i)
        await publisher.confirm()
        assert publisher.connected
        assert publisher.connects == 1
    got = list(iter(local.receive_nowait, None))
    assert [m.payload for m in got] == [b"%d" % i for i in range(5_000)]


async def test_a_remote_burst_larger_than_a_frame_reaches_the_node(node: Node) -> None:
    small = await start_server(node, ListenerSettings(port=0, max_frame_size=64 * 1024))
    local = node.connect()
    local.subscribe("many/>")
    async with connect(small.url, reconnect=False) as publisher:
        for i in range(200):  # written together: 200 KiB of payloads
            publisher.publish(f"many/{i}", bytes(1024))
        await publisher.confirm()
        assert publisher.connected
        assert publisher.connects == 1
    got = list(iter(local.receive_nowait, None))
    assert [m.topic for m in got] == [f"many/{i}" for i in range(200)]
