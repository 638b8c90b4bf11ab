"""The DUP flag of a QoS 1 PUBLISH the node sends says the device may have had the
message already: set when the session sent that PUBLISH before (again with its packet
id, MQTT-4.4.0-1), and whenever the node's queue flags the message ``redelivered``
(SPEC 4: nothing comes twice without the flag), though that may be its first sending
to this device: stored again by a remote sender that got no answer, or handed to a
connection that ended before writing it. MQTT's DUP means "may be a redelivery"."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import mqtt5
import pytest
from mqtt5 import QoS, TopicFilter

from meshbus import Node
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener

from ._raw import Raw

pytestmark = pytest.mark.anyio


@pytest.fixture
async def listener() -> AsyncIterator[MqttListener]:
    async with Node(name="edge") as node:
        yield await start_mqtt_listener(node, MqttListenerSettings(port=0))


async def connect(port: int, present: bool) -> Raw:
    """A persistent session's connection (it acknowledges nothing unless told to)."""
    device = Raw(await anyio.connect_tcp("127.0.0.1", port))
    connect = mqtt5.ConnectPacket("meter", clean_start=False, session_expiry_interval=600)
    await device.stream.send(connect.write())
    connack = await device.take(mqtt5.ConnAckPacket)
    assert connack.session_present is present
    return device


async def subscribed(port: int) -> Raw:
    device = await connect(port, present=False)
    await device.stream.send(
        mqtt5.SubscribePacket(1, [TopicFilter("meters/#", max_qos=QoS.AT_LEAST_ONCE)]).write()
    )
    await device.take(mqtt5.SubAckPacket)
    return device


async def test_a_message_stored_again_by_its_sender_comes_with_dup(
    listener: MqttListener,
) -> None:
    """A remote client that got no answer to a send makes it again; the node stores it
    flagged ``redelivered``, since its subscribers may have it already: an MQTT device
    gets it with DUP."""
    device = await subscribed(listener.port)
    async with device.stream:
        sender = listener.node.connect()
        # What the node's transport does with a remote client's send made again.
        await sender._send_again("meters/1", None, b"reading")
        first = await device.take(mqtt5.PublishPacket)
        assert (first.payload, first.qos, first.duplicate) == (b"reading", QoS.AT_LEAST_ONCE, True)


async def test_a_publish_sent_again_on_a_later_connection_has_dup_and_its_packet_id(
    listener: MqttListener,
) -> None:
    device = await subscribed(listener.port)
    async with device.stream:
        await listener.node.connect().send("meters/1", b"reading")
        first = await device.take(mqtt5.PublishPacket)
        assert first.duplicate is False
    # gone without acknowledging it
    again = await connect(listener.port, present=True)
    async with again.stream:
        resent = await again.take(mqtt5.PublishPacket)
        assert (resent.payload, resent.duplicate) == (b"reading", True)
        assert resent.packet_id == first.packet_id
        await again.stream.send(mqtt5.PubAckPacket(resent.packet_id).write())
        # Acknowledged: what comes next is a first sending again.
        await listener.node.connect().send("meters/2", b"next")
        second = await again.take(mqtt5.PublishPacket)
        assert (second.payload, second.duplicate) == (b"next", False)
