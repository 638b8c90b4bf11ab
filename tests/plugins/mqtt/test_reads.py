"""Reads of an MQTT connection: QoS 0 publishes and PUBACKs are acted on as the bytes
arrive (on asyncio, in the transport's callback) and everything else in the
connection's task, in the order the client wrote it; the keepalive still counts every
byte heard. And the writes of a backlog of QoS 1 messages, several to a write."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mqtt5
import pytest
from mqtt5 import TopicFilter

from meshbus import Node
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener
from meshbus.plugins.mqtt._connection import READ_SLICE
from meshbus.transports import ListenerSettings, connect, start_server, write_through_of

from ._clients import eventually
from ._raw import Raw, login


@pytest.fixture
async def listener() -> AsyncIterator[MqttListener]:
    async with Node(name="edge") as node:
        yield await start_mqtt_listener(node, MqttListenerSettings(port=0))


async def test_publishes_and_subscriptions_in_one_write_keep_their_order(
    listener: MqttListener,
) -> None:
    client = await login(listener.port)
    async with client.stream:
        await client.stream.send(
            b"".join(
                packet.write()
                for packet in (
                    mqtt5.PublishPacket("a/x", b"1"),  # nobody subscribed yet
                    mqtt5.SubscribePacket(1, [TopicFilter("a/#")]),
                    mqtt5.PublishPacket("a/x", b"2"),
                    mqtt5.UnsubscribePacket(2, ["a/#"]),
                    mqtt5.PublishPacket("a/x", b"3"),
                    mqtt5.SubscribePacket(3, [TopicFilter("a/#")]),
                    mqtt5.PublishPacket("a/x", b"4"),
                    mqtt5.PingReqPacket(),
                    mqtt5.PublishPacket("a/x", b"end"),
                )
            )
        )
        await client.read_until(lambda: b"end" in client.payloads())
        assert client.payloads() == [b"2", b"4", b"end"]
        answers = [type(p).__name__ for p in client.packets if type(p) is not mqtt5.PublishPacket]
        assert answers == ["SubAckPacket", "UnsubAckPacket", "SubAckPacket", "PingRespPacket"]


async def test_qos0_publishes_keep_a_connection_alive(listener: MqttListener) -> None:
    """Keepalive 1 s: a client that only publishes QoS 0 (read in callbacks) stays,
    one that goes quiet is dropped after 1.5 s."""
    connect = mqtt5.ConnectPacket("talker", clean_start=True, keep_alive=1).write()
    client = await login(listener.port, connect)
    async with client.stream:
        with anyio.fail_after(10):
            for _ in range(25):  # 2.5 s of publishing, more than 1.5 s
                await client.stream.send(mqtt5.PublishPacket("t", b"x").write())
                await anyio.sleep(0.1)
            await client.stream.send(mqtt5.PingReqPacket().write())
        await client.read_until(
            lambda: any(type(p) is mqtt5.PingRespPacket for p in client.packets)
        )
        with anyio.fail_after(5):  # now quiet: dropped (after a DISCONNECT saying why)
            try:
                while True:
                    client.buffer += await client.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass


async def test_a_backlog_goes_out_in_order_within_the_receive_maximum(
    listener: MqttListener,
) -> None:
    """QoS 1 messages waiting in a client's queue go out in order, several to a write,
    never more of them unacknowledged than its receive maximum; PUBACKs (read in
    callbacks) and a DISCONNECT in one write leave nothing to deliver again."""
    connect = mqtt5.ConnectPacket(
        "backlog", clean_start=True, session_expiry_interval=60, receive_max=3
    ).write()
    client = await login(listener.port, connect)
    async with client.stream:
        await client.stream.send(
            mqtt5.SubscribePacket(1, [TopicFilter("q/#", max_qos=mqtt5.QoS.AT_LEAST_ONCE)]).write()
        )
        await client.read_until(lambda: client.packets)
        assert type(client.packets.pop()) is mqtt5.SubAckPacket
        sender = listener.node.connect()
        for i in range(8):
            await sender.send("q/x", b"%d" % i)
        got: list[bytes] = []
        while len(got) < 8:
            await client.read_until(lambda: client.payloads())
            # Anything more the node would send before the PUBACKs has had the time
            # of a ping's round trip to come.
            await client.stream.send(mqtt5.PingReqPacket().write())
            await client.read_until(lambda: type(client.packets[-1]) is mqtt5.PingRespPacket)
            batch = [p for p in client.packets if type(p) is mqtt5.PublishPacket]
            assert 1 <= len(batch) <= 3
            client.packets.clear()
            got += [p.payload for p in batch]
            acks = b"".join(mqtt5.PubAckPacket(p.packet_id).write() for p in batch)
            if len(got) == 8:
                acks += mqtt5.DisconnectPacket().write()
            await client.stream.send(acks)
        assert got == [b"%d" % i for i in range(8)]
    queue = listener.node.guaranteed.queue("mqtt/backlog")  # type: ignore[attr-defined]
    await eventually(lambda: queue.statistics().acked == 8)
    assert queue.statistics().delivered == 8


async def _ping(client: Raw) -> None:
    await client.stream.send(mqtt5.PingReqPacket().write())
    await client.read_until(lambda: bool(client.packets))
    assert type(client.packets.pop()) is mqtt5.PingRespPacket


def _connection(listener: MqttListener, client_id: str) -> Any:
    return next(c for c in listener.connections if c.client_id == client_id)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio's reads are not callbacks
async def test_the_publishes_of_one_read_reach_a_subscriber_in_one_write(
    listener: MqttListener,
) -> None:
    subscriber = await login(listener.port, mqtt5.ConnectPacket("sub", clean_start=True).write())
    publisher = await login(listener.port, mqtt5.ConnectPacket("pub", clean_start=True).write())
    async with subscriber.stream, publisher.stream:
        await subscriber.stream.send(
            mqtt5.SubscribePacket(1, [TopicFilter("w/#", max_qos=mqtt5.QoS.AT_MOST_ONCE)]).write()
        )
        await subscriber.read_until(lambda: subscriber.packets)
        subscriber.packets.clear()
        stream = _connection(listener, "sub").stream
        writes: list[bytes] = []
        send_nowait = stream.send_nowait

        def counted(data: bytes) -> None:
            writes.append(data)
            send_nowait(data)

        stream.send_nowait = counted
        await _ping(publisher)  # its connection now reads in callbacks
        payloads = [b"%d" % i for i in range(10)]
        await publisher.stream.send(
            b"".join(mqtt5.PublishPacket("w/x", p).write() for p in payloads)
        )
        await subscriber.read_until(lambda: len(subscriber.payloads()) == 10)
        assert subscriber.payloads() == payloads
        assert len(writes) == 1
        assert listener.statistics().written_through == 10


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_publishes_of_one_read_reach_a_remote_session_in_one_write(
    listener: MqttListener,
) -> None:
    """A meshbus client's connection is written by the MQTT reader too, at the end
    of the read, not by waking the connection's own writer for each message."""
    node = listener.node
    server = await start_server(node, ListenerSettings(host="127.0.0.1", port=0))
    try:
        async with connect(f"tcp://127.0.0.1:{server.port}") as remote:
            remote.subscribe("w/>")
            await remote.confirm()
            publisher = await login(
                listener.port, mqtt5.ConnectPacket("pub", clean_start=True).write()
            )
            async with publisher.stream:
                await _ping(publisher)
                payloads = [b"%d" % i for i in range(10)]
                before = write_through_of(node).writes
                await publisher.stream.send(
                    b"".join(mqtt5.PublishPacket("w/x", p).write() for p in payloads)
                )
                with anyio.fail_after(10):
                    got = [(await remote.receive()).payload for _ in payloads]
                assert got == payloads
                assert write_through_of(node).writes - before >= 1
    finally:
        await server.aclose()


async def test_a_flood_of_small_publishes_lets_others_run_between_slices(
    listener: MqttListener,
) -> None:
    """Thousands of tiny QoS 0 publishes in one write are acted on a slice at a time,
    not all in one go: another task runs between slices, so one client cannot hold
    the event loop for the whole of a large read."""
    flooder = await login(listener.port, mqtt5.ConnectPacket("flood", clean_start=True).write())
    async with flooder.stream:
        await _ping(flooder)
        count = 5000
        before = listener.statistics().received
        seen: list[int] = []
        watching = anyio.Event()

        async def watch() -> None:
            watching.set()
            while not seen or seen[-1] - before < count:
                await anyio.lowlevel.checkpoint()
                seen.append(listener.statistics().received)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await watching.wait()
                await flooder.stream.send(mqtt5.PublishPacket("f", b"").write() * count)
        steps = [b - a for a, b in itertools.pairwise([before, *seen])]
        # Trio may run the reader twice in one scheduling batch before the watcher.
        assert max(steps) <= 2 * READ_SLICE


async def test_a_late_puback_for_a_message_its_flow_gave_back_is_ignored(
    listener: MqttListener,
) -> None:
    """A PUBACK can come after the session's queue was deleted under the connection (a
    new connection took the client id over with a clean start): the message is no
    longer the flow's. Found by the MQTT chaos test, where the StateError of the ack
    ended the whole listener."""
    client = await login(listener.port)
    async with client.stream:
        wanted = TopicFilter("t/#", max_qos=mqtt5.QoS.AT_LEAST_ONCE)
        await client.stream.send(mqtt5.SubscribePacket(1, [wanted]).write())
        await client.read_until(lambda: any(type(p) is mqtt5.SubAckPacket for p in client.packets))
        await listener.node.connect().send("t/a", b"x")
        await client.read_until(client.payloads)
        [publish] = [p for p in client.packets if type(p) is mqtt5.PublishPacket]
        state = listener.registry.get(listener.settings.vpn, "hostile")
        assert state is not None
        assert state.connection is not None
        connection = state.connection
        assert connection.flow is not None
        connection.flow.detach()  # what deleting the queue does to it
        connection._acked(mqtt5.PubAckPacket(publish.packet_id))
