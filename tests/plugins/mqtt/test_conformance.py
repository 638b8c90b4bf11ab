"""What MQTT says a server does, in the places a side-by-side run against mosquitto
found meshbus doing otherwise: packets sent right behind CONNECT, ``$`` topics and
wildcards, retain-as-published through a client's queue, expired messages waiting in
it, refused client ids, and packets MQTT calls malformed or protocol errors (each
closes its connection, as MQTT asks)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mqtt5
import pytest
from mqtt5 import QoS, TopicFilter

from meshbus import Node
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener
from meshbus.testing import ManualClock

from ._packets import connect_311, packet, text
from ._raw import Raw, login

pytestmark = pytest.mark.anyio


@pytest.fixture
async def listener() -> AsyncIterator[MqttListener]:
    async with Node(name="edge") as node:
        yield await start_mqtt_listener(node, MqttListenerSettings(port=0))


def connect(client_id: str, **options: Any) -> bytes:
    return mqtt5.ConnectPacket(client_id, clean_start=True, **options).write()


def subscribe(packet_id: int, *filters: tuple[str, int], **options: Any) -> bytes:
    chosen = [TopicFilter(f, max_qos=QoS(q), **options) for f, q in filters]
    return mqtt5.SubscribePacket(packet_id, chosen).write()


# --- a client need not wait for CONNACK (MQTT 3.1.4) -----------------------------------


async def test_packets_right_behind_connect_are_answered(listener: MqttListener) -> None:
    client = Raw(await anyio.connect_tcp("127.0.0.1", listener.port))
    async with client.stream:
        await client.stream.send(
            connect("eager")
            + subscribe(1, ("eager/#", 1))
            + mqtt5.PublishPacket("eager/1", b"x", qos=QoS(1), packet_id=2).write()
            + mqtt5.PingReqPacket().write()[:1]  # and the first byte of a PINGREQ
        )
        await client.take(mqtt5.ConnAckPacket)
        assert (await client.take(mqtt5.SubAckPacket)).packet_id == 1
        assert (await client.take(mqtt5.PubAckPacket)).packet_id == 2
        assert (await client.take(mqtt5.PublishPacket)).topic == "eager/1"
        await client.stream.send(mqtt5.PingReqPacket().write()[1:])
        await client.take(mqtt5.PingRespPacket)


async def test_a_311_client_may_pipeline_too(listener: MqttListener) -> None:
    subscribe_311 = packet(0x82, b"\x00\x01" + text("old/#") + b"\x00")
    async with await anyio.connect_tcp("127.0.0.1", listener.port) as stream:
        await stream.send(connect_311(2, "old-device") + subscribe_311 + b"\xc0\x00")
        got = b""
        with anyio.fail_after(5):
            while len(got) < 11:
                got += await stream.receive()
        # CONNACK, SUBACK (QoS 0 granted), PINGRESP
        assert got == b"\x20\x02\x00\x00" + b"\x90\x03\x00\x01\x00" + b"\xd0\x00"


async def test_what_follows_connect_is_held_to_the_logged_in_packet_size(
    listener: MqttListener,
) -> None:
    # Bigger than the CONNECT limit (64 KiB), well under the packet size limit.
    big = mqtt5.PublishPacket("big/1", b"x" * 100_000).write()
    native = listener.node.connect()
    native.subscribe("big/>")
    client = Raw(await anyio.connect_tcp("127.0.0.1", listener.port))
    async with client.stream:
        await client.stream.send(connect("big") + big)
        await client.take(mqtt5.ConnAckPacket)
        with anyio.fail_after(5):
            got = await native.receive()
        assert len(got.payload) == 100_000


# --- $ topics (MQTT-4.7.2-1) -----------------------------------------------------------


async def test_wildcards_that_start_a_filter_do_not_match_dollar_topics(
    listener: MqttListener,
) -> None:
    native = listener.node.connect()
    await native.send("$SYS/uptime", b"kept", retain=True)
    client = await login(listener.port, connect("watcher"))
    async with client.stream:
        await client.stream.send(
            subscribe(1, ("#", 0), ("+/uptime", 1), ("$SYS/#", 1)) + subscribe(2, ("+/x", 0))
        )
        await client.take(mqtt5.SubAckPacket)
        await client.take(mqtt5.SubAckPacket)
        # The retained value comes once, for $SYS/# only.
        retained = await client.take(mqtt5.PublishPacket)
        assert (retained.topic, retained.retain) == ("$SYS/uptime", True)
        native.publish("$SYS/x", b"direct")  # "$SYS/#" (not "#", "+/x"): once
        await native.send("$SYS/uptime", b"queued")  # "+/uptime" and "$SYS/#"
        native.publish("plain/x", b"plain")
        await native.send("$other/uptime", b"hidden")  # "+/uptime" only: not sent
        await client.read_until(lambda: len(client.payloads()) >= 3)
        with anyio.move_on_after(0.3):
            await client.read_until(lambda: len(client.payloads()) > 3)
        topics = sorted(
            (p.topic, p.payload) for p in client.packets if type(p) is mqtt5.PublishPacket
        )
        assert topics == [
            ("$SYS/uptime", b"queued"),
            ("$SYS/x", b"direct"),
            ("plain/x", b"plain"),  # one copy for the session's two QoS 0 filters
        ]


# --- retain as published through the client's queue (MQTT-3.3.1-13) --------------------


async def test_retain_as_published_holds_at_qos_1_too(listener: MqttListener) -> None:
    client = await login(listener.port, connect("rap"))
    async with client.stream:
        await client.stream.send(
            subscribe(1, ("kept/#", 1), retain_as_published=True)
            + subscribe(2, ("plain/#", 1), retain_as_published=False)
        )
        await client.take(mqtt5.SubAckPacket)
        await client.take(mqtt5.SubAckPacket)
        native = listener.node.connect()
        await native.send("kept/1", b"a", retain=True)
        await native.send("plain/1", b"b", retain=True)
        flags = {}
        for _ in range(2):
            got = await client.take(mqtt5.PublishPacket)
            flags[got.topic] = (got.qos, got.retain)
        assert flags == {"kept/1": (1, True), "plain/1": (1, False)}


# --- expired messages wait for no one (MQTT-3.3.2-5) -----------------------------------


async def test_a_message_that_expired_in_the_queue_is_not_sent() -> None:
    clock = ManualClock()
    async with Node(name="edge", clock=clock) as node:
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        persistent = {"session_expiry_interval": 600}
        device = await login(
            listener.port, mqtt5.ConnectPacket("away", clean_start=True, **persistent).write()
        )
        async with device.stream:
            await device.stream.send(subscribe(1, ("news/#", 1)))
            await device.take(mqtt5.SubAckPacket)
            await device.stream.send(mqtt5.DisconnectPacket().write())
        sender = node.connect()
        await sender.send("news/short", b"stale soon", ttl=1)
        await sender.send("news/long", b"still good", ttl=100)
        clock.advance(5)
        again = await login(
            listener.port, mqtt5.ConnectPacket("away", clean_start=False, **persistent).write()
        )
        async with again.stream:
            got = await again.take(mqtt5.PublishPacket)
            assert got.topic == "news/long"
            assert 90 <= got.message_expiry_interval <= 95
            with anyio.move_on_after(0.3):
                await again.read_until(lambda: len(again.payloads()) > 0)
            assert again.payloads() == []


@contextlib.asynccontextmanager
async def watched(topic_filter: str) -> AsyncIterator[tuple[ManualClock, MqttListener, Raw]]:
    """A node on a virtual clock with an MQTT listener, and an MQTT 5 client logged in
    and subscribed to ``topic_filter`` at QoS 0."""
    clock = ManualClock()
    async with Node(name="edge", clock=clock) as node:
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        watcher = await login(listener.port, connect("watcher"))
        async with watcher.stream:
            await watcher.stream.send(subscribe(1, (topic_filter, 0)))
            await watcher.take(mqtt5.SubAckPacket)
            yield clock, listener, watcher


async def test_a_qos_0_message_keeps_its_expiry_interval() -> None:
    # MQTT-3.3.2-6: a QoS 0 message goes out with the interval it has left, as QoS 1 does.
    async with watched("news/#") as (_, listener, device):
        sender = await login(listener.port, connect("sender"))
        async with sender.stream:
            await sender.stream.send(
                mqtt5.PublishPacket("news/1", b"soon stale", message_expiry_interval=100).write()
                + mqtt5.PublishPacket("news/2", b"good for ever").write()
            )
            first = await device.take(mqtt5.PublishPacket)
            second = await device.take(mqtt5.PublishPacket)
    assert (first.topic, first.message_expiry_interval) == ("news/1", 100)
    assert (second.topic, second.message_expiry_interval) == ("news/2", None)


# On trio every direct message waits in the session's buffer for the connection's
# delivery task (asyncio's plain TCP writes an idle connection's at once, unexpired).
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_qos_0_message_that_expired_in_the_buffer_is_not_sent() -> None:
    async with watched("news/#") as (clock, listener, device):
        sender = listener.node.connect()
        sender.publish("news/1", b"stale soon", ttl=1)
        sender.publish("news/2", b"still good", ttl=100)
        clock.advance(5)  # before the delivery task has run
        sender.publish("news/3", b"no expiry")
        await device.read_until(lambda: b"no expiry" in device.payloads())
        assert device.payloads() == [b"still good", b"no expiry"]
        assert listener.statistics().expired == 1


async def test_a_qos_0_will_keeps_its_expiry_interval() -> None:
    async with watched("status/#") as (_, listener, watcher):
        will = mqtt5.Will("status/device", payload=b"gone", message_expiry_interval=60)
        device = await login(listener.port, connect("device", will=will))
        await device.stream.aclose()  # no DISCONNECT: the will goes
        got = await watcher.take(mqtt5.PublishPacket)
    assert (got.topic, got.payload, got.message_expiry_interval) == (
        "status/device",
        b"gone",
        60,
    )


async def test_a_retained_qos_0_value_goes_when_it_expires() -> None:
    # MQTT-3.3.2-5: once its interval has passed, no new subscriber gets it.
    clock = ManualClock()
    async with Node(name="edge", clock=clock) as node:
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        sender = await login(listener.port, connect("sender"))
        async with sender.stream:
            await sender.stream.send(
                mqtt5.PublishPacket(
                    "kept/short", b"x", retain=True, message_expiry_interval=2
                ).write()
                + mqtt5.PublishPacket("kept/long", b"y", retain=True).write()
                + mqtt5.PingReqPacket().write()
            )
            await sender.take(mqtt5.PingRespPacket)  # the node read both publishes
        clock.advance(5)
        late = await login(listener.port, connect("late"))
        async with late.stream:
            await late.stream.send(subscribe(1, ("kept/#", 0)))
            await late.take(mqtt5.SubAckPacket)
            node.connect().publish("kept/marker", b"after the retained values")
            await late.read_until(lambda: b"after the retained values" in late.payloads())
            assert late.payloads() == [b"y", b"after the retained values"]


# --- refused client ids get the code for that (MQTT-3.1.3-8; 3.1.1 MQTT-3.1.3-9) ----------


async def test_a_client_id_the_node_cannot_take_is_refused_as_such(
    listener: MqttListener,
) -> None:
    client = Raw(await anyio.connect_tcp("127.0.0.1", listener.port))
    async with client.stream:
        await client.stream.send(connect("plant/line-1"))
        connack = await client.take(mqtt5.ConnAckPacket)
        assert connack.reason_code == 0x85  # client identifier not valid
    async with await anyio.connect_tcp("127.0.0.1", listener.port) as stream:
        await stream.send(connect_311(2, "plant/line-1"))
        assert await stream.receive() == b"\x20\x02\x00\x02"  # identifier rejected


# --- malformed and protocol errors close the connection ----------------------------------


def flags_connect(flags: int, will: bytes = b"") -> bytes:
    """An MQTT 5 CONNECT with these flags, no properties, client id ``f``, then ``will``
    (its properties, topic and payload) when given."""
    body = text("MQTT") + bytes([5, flags]) + b"\x00\x3c" + b"\x00" + text("f") + will
    return packet(0x10, body)


WILL = b"\x00" + text("w/t") + b"\x00\x01x"  # no will properties, topic w/t, payload "x"

REFUSED_CONNECTS = {
    "reserved flag": flags_connect(0x03),
    "will QoS without a will": flags_connect(0x0A),
    "will retain without a will": flags_connect(0x22),
    "will topic with a wildcard": flags_connect(0x06, b"\x00" + text("w/+") + b"\x00\x01x"),
    "empty will topic": flags_connect(0x06, b"\x00" + text("") + b"\x00\x01x"),
    "3.1.1: empty will topic": connect_311(0x06, "f", "", "x"),
}


@pytest.mark.parametrize("sent", REFUSED_CONNECTS.values(), ids=REFUSED_CONNECTS.keys())
async def test_a_connect_that_breaks_the_rules_is_not_accepted(
    listener: MqttListener, sent: bytes
) -> None:
    client = Raw(await anyio.connect_tcp("127.0.0.1", listener.port))
    await client.stream.send(sent)
    assert await client.to_the_end() == []
    assert listener.statistics().logins == 0


async def test_a_valid_will_still_logs_in(listener: MqttListener) -> None:
    client = Raw(await anyio.connect_tcp("127.0.0.1", listener.port))
    async with client.stream:
        await client.stream.send(flags_connect(0x06, WILL))
        assert (await client.take(mqtt5.ConnAckPacket)).reason_code == 0


def subscribe_raw(packet_id: int, body: bytes) -> bytes:
    return packet(0x82, packet_id.to_bytes(2, "big") + b"\x00" + body)


BROKEN_PACKETS = {
    "SUBSCRIBE with reserved option bits": (subscribe_raw(1, text("a/b") + b"\xc1"), 0x81),
    "SUBSCRIBE without a filter": (subscribe_raw(1, b""), 0x82),
    "UNSUBSCRIBE without a filter": (packet(0xA2, b"\x00\x01\x00"), 0x82),
    "SUBSCRIBE with packet id 0": (subscribe_raw(0, text("a/b") + b"\x01"), 0x82),
    "PUBLISH QoS 1 with packet id 0": (packet(0x32, text("a/b") + b"\x00\x00\x00x"), 0x82),
    "PUBLISH with a subscription identifier": (
        packet(0x30, text("a/b") + b"\x02\x0b\x05x"),
        0x82,
    ),
}


@pytest.mark.parametrize(("sent", "reason"), BROKEN_PACKETS.values(), ids=BROKEN_PACKETS.keys())
async def test_a_packet_that_breaks_the_rules_closes_the_connection(
    listener: MqttListener, sent: bytes, reason: int
) -> None:
    client = await login(listener.port, connect("breaker"))
    await client.stream.send(sent)
    packets = await client.to_the_end()
    assert [(type(p), p.reason_code) for p in packets] == [(mqtt5.DisconnectPacket, reason)]


# --- what a shared subscription grants -------------------------------------------------


async def test_a_shared_subscription_grants_the_qos_it_delivers(listener: MqttListener) -> None:
    """A group its first member made at QoS 0 gets direct messages: a later member that
    asks for QoS 1 is granted 0, and what it is sent matches what it was granted
    (MQTT-3.8.4-8)."""
    first = await login(listener.port, connect("first"))
    member = await login(listener.port, connect("worker"))
    async with first.stream, member.stream:
        await first.stream.send(subscribe(1, ("$share/g/jobs/#", 0)))
        await first.take(mqtt5.SubAckPacket)
        await member.stream.send(subscribe(1, ("$share/g/jobs/#", 1)))
        suback = await member.take(mqtt5.SubAckPacket)
        assert [int(code) for code in suback.reason_codes] == [0]
        producer = listener.node.connect()
        for i in range(20):  # each to one member, chosen at random
            await producer.send(f"jobs/{i}", b"work")
        # One at least comes to this member (all 20 to the other: a chance of 2**-20).
        job = await member.take(mqtt5.PublishPacket)
        assert (job.topic[:5], int(job.qos)) == ("jobs/", 0)
