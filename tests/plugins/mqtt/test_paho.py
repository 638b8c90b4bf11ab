"""paho-mqtt clients (MQTT 3.1.1 and 5) against a meshbus node's MQTT listener (SPEC 13)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from meshbus import AclProfile, DeliveryMode, Message, Node
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener

from ._clients import V5, V311, Paho, eventually, user_properties

pytestmark = pytest.mark.anyio

BOTH = pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with Node(name="edge") as running:
        yield running


@pytest.fixture
async def listener(node: Node) -> MqttListener:
    return await start_mqtt_listener(node, MqttListenerSettings(port=0))


def drain(session) -> list[Message]:  # type: ignore[no-untyped-def]
    return list(iter(session.receive_nowait, None))


@BOTH
async def test_wildcards_and_qos_reach_subscribers(listener: MqttListener, protocol: int) -> None:
    sub = Paho(listener.port, "sub", protocol)
    pub = Paho(listener.port, "pub", protocol)
    await sub.connect()
    await pub.connect()
    assert await sub.subscribe(("plant/+/temp", 0), ("alarms/#", 1)) == [0, 1]
    await pub.publish("plant/boiler/temp", b"71", qos=0)
    await pub.publish("plant/boiler/pressure", b"no", qos=0)  # matches nothing
    await pub.publish("alarms", b"parent", qos=1)  # '#' matches the parent level too
    await pub.publish("alarms/fire/1", b"hot", qos=1)
    got = await sub.receive_many(3)
    assert sorted((m.topic, m.payload, m.qos) for m in got) == [
        ("alarms", b"parent", 1),
        ("alarms/fire/1", b"hot", 1),
        ("plant/boiler/temp", b"71", 0),
    ]
    await anyio.sleep(0.1)
    assert sub.nothing_more()
    await sub.disconnect()
    await pub.disconnect()


@BOTH
async def test_mqtt_clients_and_native_sessions_exchange_messages_both_ways(
    node: Node, listener: MqttListener, protocol: int
) -> None:
    native = node.connect(client_name="native")
    native.subscribe("up/>")
    device = Paho(listener.port, "device-7", protocol)
    await device.connect()
    await device.subscribe(("down/#", 1))
    await device.publish("up/reading", b"42", qos=0)
    await device.publish("up/event", b"door", qos=1)
    await eventually(lambda: len(native.egress) >= 2)
    got = drain(native)
    assert [(m.topic, m.payload, m.sender) for m in got] == [
        ("up/reading", b"42", "device-7"),
        ("up/event", b"door", "device-7"),
    ]
    native.publish("down/cmd", b"open")
    await native.send("down/cmd", b"close")
    got_mqtt = await device.receive_many(2)
    # MQTT orders the messages of one topic and QoS: across QoS levels, either first.
    assert sorted((m.topic, m.payload, m.qos) for m in got_mqtt) == [
        ("down/cmd", b"close", 1),
        ("down/cmd", b"open", 0),
    ]
    await device.disconnect()


async def test_shared_subscriptions_split_the_messages(listener: MqttListener) -> None:
    members = [Paho(listener.port, f"worker-{i}", V5) for i in range(2)]
    for member in members:
        await member.connect()
        await member.subscribe(("$share/workers/jobs/#", 0))
    pub = Paho(listener.port, "producer", V5)
    await pub.connect()
    for i in range(20):
        await pub.publish(f"jobs/{i}", b"%d" % i, qos=1)
    await eventually(lambda: sum(m.messages.qsize() for m in members) == 20)
    counts = [m.messages.qsize() for m in members]
    assert all(counts), counts  # each member took some, and none was given twice
    payloads = []
    for member in members:
        payloads += [int(x.payload) for x in await member.receive_many(member.messages.qsize())]
    assert sorted(payloads) == list(range(20))


@BOTH
async def test_retained_values_reach_later_subscribers_flagged(
    listener: MqttListener, protocol: int
) -> None:
    pub = Paho(listener.port, "pub", protocol)
    await pub.connect()
    await pub.publish("state/boiler", b"on", qos=1, retain=True)
    await pub.publish("state/pump", b"off", qos=0, retain=True)
    await pub.publish("state/pump", b"", qos=1, retain=True)  # cleared
    live = Paho(listener.port, "late", protocol)
    await live.connect()
    await live.subscribe(("state/#", 1))
    (message,) = await live.receive_many(1)
    assert (message.topic, message.payload, message.retain) == ("state/boiler", b"on", True)
    await pub.publish("state/boiler", b"off", qos=1, retain=True)
    message = await live.receive()
    assert (message.payload, message.retain) == (b"off", False)  # live: not flagged
    await anyio.sleep(0.1)
    assert live.nothing_more()


async def test_retain_handling_and_retain_as_published(listener: MqttListener) -> None:
    pub = Paho(listener.port, "pub", V5)
    await pub.connect()
    await pub.publish("r/a", b"kept", qos=1, retain=True)
    client = Paho(listener.port, "c", V5)
    await client.connect()
    never = SubscribeOptions(qos=0, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
    await client.subscribe(("r/#", never))
    rap = SubscribeOptions(qos=0, retainAsPublished=True)
    await client.subscribe(("r/+", rap))
    first = await client.receive()  # the second subscription sends the kept value
    assert (first.payload, first.retain) == (b"kept", True)
    await pub.publish("r/a", b"live", qos=0, retain=True)
    live = await client.receive()
    assert (live.payload, live.retain) == (b"live", True)  # kept as published


@BOTH
async def test_a_persistent_session_gets_qos1_messages_published_while_it_was_away(
    listener: MqttListener, protocol: int
) -> None:
    options = {"clean_session": False} if protocol == V311 else {}
    device = Paho(listener.port, "sleepy", protocol, **options)
    await device.connect(clean_start=False, session_expiry=3600)
    await device.subscribe(("orders/#", 1))
    await device.disconnect()
    pub = Paho(listener.port, "shop", protocol)
    await pub.connect()
    for i in range(5):
        await pub.publish(f"orders/{i}", b"%d" % i, qos=1)
    await pub.disconnect()
    again = Paho(listener.port, "sleepy", protocol, **options)
    await again.connect(clean_start=False, session_expiry=3600)
    assert again.connack[0].session_present
    got = await again.receive_many(5)
    assert [(m.topic, m.qos) for m in got] == [(f"orders/{i}", 1) for i in range(5)]
    await again.disconnect()


async def test_a_clean_session_forgets_its_subscriptions_and_queue(
    node: Node, listener: MqttListener
) -> None:
    device = Paho(listener.port, "forgetful", V5)
    await device.connect(clean_start=True, session_expiry=0)
    await device.subscribe(("t/#", 1))
    assert "mqtt/forgetful" in {q.settings.name for q in node.guaranteed._queues.values()}  # type: ignore[attr-defined]
    await device.disconnect()
    await eventually(lambda: not listener.registry.sessions)
    assert "mqtt/forgetful" not in {q.settings.name for q in node.guaranteed._queues.values()}  # type: ignore[attr-defined]
    again = Paho(listener.port, "forgetful", V5)
    await again.connect(clean_start=False, session_expiry=60)
    assert not again.connack[0].session_present


@BOTH
async def test_a_will_is_published_when_the_connection_is_lost_not_after_disconnect(
    listener: MqttListener, protocol: int
) -> None:
    watcher = Paho(listener.port, "watcher", protocol)
    await watcher.connect()
    await watcher.subscribe(("status/#", 1))
    polite = Paho(listener.port, "polite", protocol)
    await polite.connect(will=("status/polite", b"gone", 1, False))
    await polite.disconnect()
    crasher = Paho(listener.port, "crasher", protocol)
    await crasher.connect(will=("status/crasher", b"lost", 1, True))
    await crasher.drop()
    will = await watcher.receive()
    assert (will.topic, will.payload) == ("status/crasher", b"lost")
    await anyio.sleep(0.1)
    assert watcher.nothing_more()  # nothing from the polite one
    late = Paho(listener.port, "late", protocol)
    await late.connect()
    await late.subscribe(("status/crasher", 0))
    kept = await late.receive()  # a retained will is kept
    assert (kept.payload, kept.retain) == (b"lost", True)


async def test_no_local_keeps_a_client_s_own_messages_from_it(listener: MqttListener) -> None:
    chat = Paho(listener.port, "alice", V5)
    await chat.connect()
    await chat.subscribe(("chat/#", SubscribeOptions(qos=1, noLocal=True)))
    other = Paho(listener.port, "bob", V5)
    await other.connect()
    await chat.publish("chat/room", b"from alice", qos=1)
    await other.publish("chat/room", b"from bob", qos=1)
    message = await chat.receive()
    assert message.payload == b"from bob"
    await anyio.sleep(0.1)
    assert chat.nothing_more()


async def test_user_properties_and_request_reply_properties_cross_as_headers(
    node: Node, listener: MqttListener
) -> None:
    native = node.connect(client_name="native")
    native.subscribe("req/>")
    client = Paho(listener.port, "requester", V5)
    await client.connect()
    await client.subscribe(("reply/#", 0))
    properties = user_properties([("unit", "bar"), ("site", "north")])
    properties.ResponseTopic = "reply/requester"
    properties.CorrelationData = b"\x00\x01id"
    properties.ContentType = "text/plain"
    await client.publish("req/pressure", b"?", qos=1, properties=properties)
    await eventually(lambda: len(native.egress) >= 1)
    (request,) = drain(native)
    assert request.headers == {"unit": "bar", "site": "north", "content-type": "text/plain"}
    assert request.reply_to == "reply/requester"
    native.publish(
        request.reply_to,
        b"3.2",
        correlation_id=request.correlation_id,
        headers={"unit": "bar", "n": 1},
    )
    reply = await client.receive()
    props = reply.properties
    assert reply.payload == b"3.2"
    assert props.CorrelationData == b"\x00\x01id"
    assert sorted(props.UserProperty) == [("n", "1"), ("unit", "bar")]


@pytest.mark.parametrize("qos", [0, 1])
async def test_repeated_user_properties_and_the_payload_format_cross_unaltered(
    node: Node, listener: MqttListener, qos: int
) -> None:
    # MQTT 5: a name may come more than once (every value kept, in order), the
    # properties reach subscribers in the order they were sent (MQTT-3.3.2-18), and the
    # payload format indicator goes to every subscriber as it was sent (MQTT-3.3.2-4).
    native = node.connect(client_name="native")
    native.subscribe("sensor/>")
    reader = Paho(listener.port, "reader", V5)
    await reader.connect()
    await reader.subscribe(("sensor/#", qos))
    writer = Paho(listener.port, "writer", V5)
    await writer.connect()
    properties = user_properties([("tag", "a"), ("unit", "bar"), ("tag", "b"), ("tag", "c")])
    properties.PayloadFormatIndicator = 1
    await writer.publish("sensor/1", b"1.5 bar", qos=qos, properties=properties)
    got = await reader.receive()
    assert got.properties.UserProperty == properties.UserProperty
    assert got.properties.PayloadFormatIndicator == 1
    await eventually(lambda: len(native.egress) >= 1)
    (seen,) = drain(native)
    assert seen.headers == {
        "tag": ["a", "b", "c"],
        "unit": "bar",
        "user-property-order": ["tag", "unit", "tag", "tag"],
        "payload-format": "utf-8",
    }
    # without the indicator, none is sent; a native list of strings is one property each
    native.publish("sensor/2", b"\x00", headers={"tag": ["x", "y"], "n": [1, 2]})
    got = await reader.receive()
    assert got.properties.UserProperty == [("tag", "x"), ("tag", "y"), ("n", "[1,2]")]
    assert not hasattr(got.properties, "PayloadFormatIndicator")


async def test_topic_aliases_from_the_client_are_resolved(
    node: Node, listener: MqttListener
) -> None:
    native = node.connect()
    native.subscribe("alias/>")
    client = Paho(listener.port, "aliaser", V5)
    await client.connect()
    first = Properties(PacketTypes.PUBLISH)
    first.TopicAlias = 3
    await client.publish("alias/long/topic", b"1", qos=1, properties=first)
    again = Properties(PacketTypes.PUBLISH)
    again.TopicAlias = 3
    await client.publish("", b"2", qos=1, properties=again)
    await eventually(lambda: len(native.egress) >= 2)
    assert [(m.topic, m.payload) for m in drain(native)] == [
        ("alias/long/topic", b"1"),
        ("alias/long/topic", b"2"),
    ]


async def test_a_new_connection_takes_the_client_id_over(listener: MqttListener) -> None:
    first = Paho(listener.port, "same", V5)
    await first.connect()
    second = Paho(listener.port, "same", V5)
    await second.connect()
    await anyio.to_thread.run_sync(lambda: first.disconnected.wait(5))
    assert first.disconnected.is_set()
    assert int(first.disconnect_reason.value) == 0x8E  # session taken over
    await second.subscribe(("t", 0))
    await second.publish("t", b"still works", qos=1)
    assert (await second.receive()).payload == b"still works"


async def test_logins_and_acls_are_the_vpn_s_own(node: Node) -> None:
    vpn = node.create_vpn("plant", authentication="basic")
    vpn.add_acl_profile(
        AclProfile(
            "sensors", publish_default="deny", publish_exceptions=("sensors/$client-username/>",)
        )
    )
    vpn.add_user("meter", password="s3cret", acl_profile="sensors")
    listener = await start_mqtt_listener(node, MqttListenerSettings(port=0, vpn="plant"))
    wrong = Paho(listener.port, "x", V5)
    reason = await wrong.connect(username="meter", password="nope")
    assert reason.is_failure
    assert int(reason.value) == 0x86
    v3_wrong = Paho(listener.port, "y", V311)
    reason = await v3_wrong.connect(username="meter", password="nope")
    assert reason.is_failure
    meter = Paho(listener.port, "meter-1", V5)
    assert not (await meter.connect(username="meter", password="s3cret")).is_failure
    watcher = await node.login("plant", username="meter", password="s3cret", client_name="w")
    watcher.subscribe(">")
    await meter.publish("sensors/meter/kwh", b"12", qos=1)
    denied = meter.client.publish("valves/open", b"!", qos=1)
    await anyio.to_thread.run_sync(lambda: denied.wait_for_publish(5))
    await eventually(lambda: len(watcher.egress) >= 1)
    assert [m.topic for m in drain(watcher)] == ["sensors/meter/kwh"]
    assert listener.statistics().refused_publishes == 1


async def test_qos2_publishes_are_taken_once(node: Node, listener: MqttListener) -> None:
    native = node.connect()
    native.subscribe("q2/>")
    client = Paho(listener.port, "exactly", V5)
    await client.connect()
    for i in range(3):
        await client.publish(f"q2/{i}", b"x", qos=2)
    await eventually(lambda: len(native.egress) >= 3)
    got = drain(native)
    assert [m.topic for m in got] == ["q2/0", "q2/1", "q2/2"]
    assert {m.delivery_mode for m in got} == {DeliveryMode.DIRECT}  # the direct copies


async def test_statistics_show_under_the_vpn(node: Node, listener: MqttListener) -> None:
    client = Paho(listener.port, "counted", V5)
    await client.connect()
    await client.publish("c", b"1", qos=1)
    figures = node.plugins.hook.meshbus_vpn_statistics(vpn=node.vpn())
    mqtt = next(f["mqtt"] for f in figures if f and "mqtt" in f)
    (counts,) = mqtt["listeners"].values()
    assert counts["logins"] == 1
    assert counts["received"] == 1
    assert mqtt["sessions"] == 1


async def test_a_connection_taken_over_publishes_its_will(listener: MqttListener) -> None:
    # MQTT 5, 3.1.4: the existing client's will is published when it is taken over.
    watcher = Paho(listener.port, "watcher", V5)
    await watcher.connect()
    await watcher.subscribe(("status/#", 1))
    first = Paho(listener.port, "device", V5)
    await first.connect(will=("status/device", b"replaced", 1, False))
    second = Paho(listener.port, "device", V5)
    await second.connect()
    will = await watcher.receive()
    assert (will.topic, will.payload) == ("status/device", b"replaced")


def identified(number: int) -> Properties:
    """SUBSCRIBE properties with subscription identifier ``number``."""
    properties = Properties(PacketTypes.SUBSCRIBE)
    properties.SubscriptionIdentifier = number
    return properties


def identifiers(message: Any) -> list[int]:
    return list(getattr(message.properties, "SubscriptionIdentifier", []))


async def test_subscription_identifiers_come_back_with_what_each_subscription_brings(
    node: Node, listener: MqttListener
) -> None:
    pub = Paho(listener.port, "pub", V5)
    await pub.connect()
    await pub.publish("r/1", b"kept", qos=0, retain=True)
    client = Paho(listener.port, "ids", V5)
    await client.connect()
    # Absent means available (MQTT 5, 3.2.2.3.12); before, it said 0.
    assert getattr(client.connack[2], "SubscriptionIdentifierAvailable", 1) == 1
    await client.subscribe(("r/1", 0), properties=identified(22))
    kept = await client.receive()  # the retained value, for this subscription only
    await client.subscribe(("r/#", 0), properties=identified(21))
    again = await client.receive()
    assert [(m.payload, identifiers(m)) for m in (kept, again)] == [
        (b"kept", [22]),
        (b"kept", [21]),
    ]
    await client.subscribe(("ids/#", 0), properties=identified(5))
    await client.subscribe(("ids/a", 0), properties=identified(9))
    await client.subscribe(("$share/g/shared/#", 0), properties=identified(7))
    await client.subscribe(("q/#", 1), properties=identified(11))
    await client.subscribe(("plain/#", 0))
    for topic, qos in (("ids/a", 0), ("ids/b", 0), ("shared/x", 0), ("q/1", 1), ("plain/1", 0)):
        await pub.publish(topic, b"", qos=qos)
    got = await client.receive_many(5)
    assert sorted((m.topic, m.qos, identifiers(m)) for m in got) == [
        ("ids/a", 0, [5, 9]),
        ("ids/b", 0, [5]),
        ("plain/1", 0, []),
        ("q/1", 1, [11]),
        ("shared/x", 0, [7]),
    ]
    # Subscribed again without one, a subscription has none from then on.
    await client.subscribe(("ids/a", 0))
    await pub.publish("ids/a", b"", qos=0)
    assert identifiers(await client.receive()) == [5]
