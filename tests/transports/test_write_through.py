"""Deliveries written from the publisher's read (the node's write-through path).

On an asyncio loop a node's TCP connection can be written without an await,
so a remote publisher's reader writes an idle remote subscriber's deliveries
itself instead of waking that connection's pump. These tests pin down when
that path is taken and that it keeps every delivery rule the pump keeps: order
per publisher, nothing lost while the egress has room, the oldest shed with a
discard indication once a subscriber stops reading (SPEC 2), and TLS and trio
connections falling back to the pump.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc
import pytest

from meshbus import ClientProfile, Message, Node
from meshbus.transports import (
    ListenerSettings,
    Server,
    TlsSettings,
    WriteThrough,
    connect,
    start_server,
    write_through_of,
)
from meshbus.transports._asyncio_tcp import AsyncioTcpStream, adopt_tcp_stream
from meshbus.transports._codec import decode_deliver, decode_deliver_batch
from meshbus.transports._connection import Connection
from meshbus.transports._framing import FrameKind
from meshbus.transports._protocol import LinkProtocol, Role
from meshbus.transports._serving import ServedSession
from meshbus.transports._streams import connect_stream, memory_stream_pair

from .conftest import Certificates, wait_until

K = FrameKind


def writes_through(node: Node) -> int:
    """How many times a reader has written another connection's deliveries itself."""
    return write_through_of(node).writes


async def drain(session: Any, count: int, timeout: float = 10.0) -> list[Message]:
    messages: list[Message] = []
    with anyio.fail_after(timeout):
        while len(messages) < count:
            messages.append(await session.receive())
    return messages


# --- which streams have a write that never waits --------------------------------------------


async def test_only_a_tcp_stream_on_asyncio_writes_without_waiting(
    server: Server, anyio_backend: str
) -> None:
    stream = await connect_stream(server.url)
    try:
        if anyio_backend == "asyncio":
            assert isinstance(stream, AsyncioTcpStream)
            assert stream.writable_now()
        else:
            assert not isinstance(stream, AsyncioTcpStream)
    finally:
        await stream.aclose()
    if isinstance(stream, AsyncioTcpStream):
        assert not stream.writable_now()  # closed: the caller must not write
    a, b = memory_stream_pair()
    assert adopt_tcp_stream(a) is a
    await a.aclose()
    await b.aclose()


async def test_a_tls_stream_has_no_write_without_waiting(
    node: Node, certificates: Certificates
) -> None:
    tls = TlsSettings(
        certificate=certificates.server.certificate,
        private_key=certificates.server.private_key,
    )
    listener = await start_server(node, ListenerSettings(port=0, tls=tls))
    stream = await connect_stream(listener.url, tls=TlsSettings(ca=certificates.ca))
    try:
        assert not isinstance(stream, AsyncioTcpStream)  # TLS on top of it
        assert not Connection(
            stream, LinkProtocol(Role.CLIENT, max_frame_size=1024), "x"
        ).writes_nowait
    finally:
        await stream.aclose()


# --- the path itself ---------------------------------------------------------------------------


async def test_remote_deliveries_are_written_by_the_publishers_reader(
    node: Node, server: Server, anyio_backend: str
) -> None:
    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        subscriber.subscribe("wt/>")
        await subscriber.confirm()
        for n in range(50):
            publisher.publish(f"wt/{n}", b"%d" % n)
            await publisher.flush()
            message = await drain(subscriber, 1)
            assert message[0].topic == f"wt/{n}"
    if anyio_backend == "asyncio":
        assert writes_through(node) >= 40  # a few may meet a busy connection
    else:
        assert writes_through(node) == 0  # trio streams: the pump writes every one


async def test_order_kept_when_the_pump_and_the_reader_both_write(
    node: Node, server: Server
) -> None:
    """An in-process publisher's messages go through the pump, a remote one's through
    the reader; interleaved, each publisher's messages still arrive in order."""
    local = node.connect(client_name="local")
    count = 3000
    async with connect(server.url) as subscriber, connect(server.url) as remote:
        subscriber.subscribe("mix/>")
        await subscriber.confirm()

        async def publish_locally() -> None:
            for n in range(count):
                local.publish("mix/local", b"%d" % n)
                if n % 50 == 0:
                    await anyio.sleep(0)

        async def publish_remotely() -> None:
            for n in range(count):
                remote.publish("mix/remote", b"%d" % n)
                if n % 50 == 0:
                    await remote.flush()

        async with anyio.create_task_group() as tg:
            tg.start_soon(publish_locally)
            tg.start_soon(publish_remotely)
        await remote.flush()
        messages = await drain(subscriber, 2 * count)
    for topic in ("mix/local", "mix/remote"):
        numbers = [int(m.payload) for m in messages if m.topic == topic]
        assert numbers == list(range(count)), topic
    assert not any(m.discard_indication for m in messages)


class RawSubscriber:
    """A client made by hand that subscribes and then reads only when told to, so the
    node's socket buffer toward it fills."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.protocol = LinkProtocol(Role.CLIENT, max_frame_size=1 << 26)

    async def frames_until(self, kind: int) -> list[tuple[int, Any, bytes]]:
        got: list[tuple[int, Any, bytes]] = []
        while not got or got[-1][0] != kind:
            got.extend(self.protocol.receive_data(await self.stream.receive(1 << 20)))
        return got

    async def login_and_subscribe(self, username: str, subscription: str) -> None:
        self.protocol.hello({"version": 1, "vpn": "default", "username": username})
        await self.stream.send(self.protocol.data_to_send())
        await self.frames_until(K.WELCOME)
        self.protocol.send(K.SUBSCRIBE, {"id": 1, "subscription": subscription})
        await self.stream.send(self.protocol.data_to_send())
        await self.frames_until(K.OK)

    async def read_messages(self, last_topic: str) -> list[Message]:
        messages: list[Message] = []
        while not messages or messages[-1].topic != last_topic:
            with anyio.fail_after(10):
                data = await self.stream.receive(1 << 20)
            for kind, header, payload in self.protocol.receive_data(data):
                if kind == K.DELIVER:
                    messages.append(decode_deliver(header, payload))
                elif kind == K.DELIVER_BATCH:
                    messages.extend(decode_deliver_batch(header, payload))
        return messages


async def test_a_subscriber_that_stops_reading_sheds_its_oldest(node: Node, server: Server) -> None:
    """Once its socket is full the node stops writing to it without waiting and its
    egress sheds the oldest (SPEC 2); other subscribers are not held up."""
    vpn = node.vpn()
    vpn.add_client_profile(ClientProfile("small", egress_max_messages=500))
    vpn.add_user("stalled", client_profile="small")
    stream = await connect_stream(server.url)
    stalled = RawSubscriber(stream)
    try:
        await stalled.login_and_subscribe("stalled", "flood/>")
        payload = b"x" * 4096
        count = 6000  # about 24 MB: more than the loopback socket buffers hold
        async with connect(server.url) as healthy, connect(server.url) as publisher:
            healthy.subscribe("flood/>")
            await healthy.confirm()
            for n in range(count):
                publisher.publish("flood/data", b"%06d" % n + payload)
                if n % 100 == 99:
                    await publisher.flush()
            publisher.publish("flood/end", b"")
            await publisher.flush()
            received = await drain(healthy, count + 1, timeout=30)
            assert [m.payload[:6] for m in received[:-1]] == [b"%06d" % n for n in range(count)]
        served = [s for s in vpn.sessions.values() if s.username == "stalled"]
        assert len(served) == 1
        await wait_until(lambda: served[0].egress.discarded > 0, timeout=10)
        messages = await stalled.read_messages("flood/end")
    finally:
        await stream.aclose()
    numbers = [int(m.payload[:6]) for m in messages[:-1]]
    assert numbers == sorted(numbers)  # order kept across the gap
    assert len(numbers) + served[0].egress.discarded == count
    assert any(m.discard_indication for m in messages)  # the gap is announced


async def test_in_process_publishers_still_wake_the_pump(node: Node, server: Server) -> None:
    local = node.connect(client_name="local")
    async with connect(server.url) as subscriber:
        subscriber.subscribe("inproc/>")
        await subscriber.confirm()
        before = writes_through(node)
        for n in range(20):
            local.publish("inproc/x", b"%d" % n)
            await anyio.sleep(0)
        messages = await drain(subscriber, 20)
    assert [int(m.payload) for m in messages] == list(range(20))
    assert writes_through(node) == before


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_connection_being_written_falls_back_to_the_pump(
    node: Node, server: Server
) -> None:
    """A delivery meeting a connection whose lock is held (another writer mid-send)
    is left to the pump, and still arrives."""
    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        subscriber.subscribe("busy/>")
        await subscriber.confirm()
        served = next(s for s in node.vpn().sessions.values() if s.egress.on_ready is not None)
        # The hook is the subscriber's ServedSession's bound method: reach its connection.
        connection = served.egress.on_ready.__self__.connection  # type: ignore[union-attr]
        before = writes_through(node)
        async with connection._lock:
            publisher.publish("busy/1", b"1")
            await publisher.flush()
            await wait_until(lambda: len(served.egress) == 0 and served.delivered >= 1)
            assert writes_through(node) == before  # it waited for the lock, in the pump
        messages = await drain(subscriber, 1)
    assert messages[0].topic == "busy/1"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_failing_write_through_costs_neither_connection(
    node: Node, server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug while writing another connection's deliveries is logged; the publisher's
    connection goes on and the subscriber's pump delivers the message instead."""
    failures = []

    def broken(self: ServedSession) -> None:
        failures.append(self)
        raise RuntimeError("injected")

    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        subscriber.subscribe("bug/>")
        await subscriber.confirm()
        monkeypatch.setattr(ServedSession, "write_ready", broken)
        publisher.publish("bug/1", b"1")
        messages = await drain(subscriber, 1)
        monkeypatch.undo()
        await publisher.confirm()  # the publisher's connection is still served
        publisher.publish("bug/2", b"2")
        messages += await drain(subscriber, 1)
    assert [m.topic for m in messages] == ["bug/1", "bug/2"]
    assert len(failures) == 1
    assert "writing deliveries to" in caplog.text


class _Writer:
    """A connection as :class:`WriteThrough` sees it, writing or not as told."""

    def __init__(self, writes: bool) -> None:
        self.marked = True
        self.writes = writes
        self.woken = 0

    @property
    def peer(self) -> str:
        return "test"

    def write_ready(self) -> bool:
        if not self.writes:
            self.woken += 1  # as the real ones do: wake their writer, say so
        return self.writes

    def wake_writer(self) -> None:
        self.woken += 1


def test_drain_says_whether_a_writer_task_was_left_work() -> None:
    """The reader learns that a destination fell behind (it then reads in its task's
    turn, so the destination's writer gets the loop as well)."""
    through = WriteThrough()
    both = [_Writer(True), _Writer(True)]
    through.ready = list(both)
    assert through.drain() is True
    assert not any(w.marked for w in both)
    stuck = _Writer(False)
    through.ready = [_Writer(True), stuck, _Writer(True)]
    assert through.drain() is False
    assert stuck.woken == 1
    assert not stuck.marked
    assert through.ready == []
    assert through.drain() is True  # nothing left: all written
