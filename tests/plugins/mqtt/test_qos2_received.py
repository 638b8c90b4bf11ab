"""A QoS 2 publish a device sent is taken once, though the device sends it again on a
later connection: which packet ids the node has taken and not yet seen released
(PUBREL) is part of the session (MQTT 5, 4.3.3 and 4.1), not of one connection, and a
node with a data directory keeps them in the session's file before it answers, so a
restart or a crash changes nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import mqtt5
import orjson
import pytest
from mqtt5 import QoS

from meshbus import Node
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener
from meshbus.plugins.mqtt._listener import REGISTRY

from ._raw import Raw

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def edge(data_dir: Path | None = None) -> AsyncIterator[MqttListener]:
    async with Node(name="edge", data_dir=data_dir) as node:
        node.guaranteed.create_queue("readings", subscriptions=["meters/>"])
        yield await start_mqtt_listener(node, MqttListenerSettings(port=0))


async def connect(port: int, present: bool, clean: bool = False) -> Raw:
    device = Raw(await anyio.connect_tcp("127.0.0.1", port))
    connect = mqtt5.ConnectPacket("meter", clean_start=clean, session_expiry_interval=600)
    await device.stream.send(connect.write())
    connack = await device.take(mqtt5.ConnAckPacket)
    assert connack.session_present is present
    return device


def publish(packet_id: int, payload: bytes, duplicate: bool = False) -> bytes:
    packet = mqtt5.PublishPacket(
        "meters/1", payload, qos=QoS.EXACTLY_ONCE, packet_id=packet_id, duplicate=duplicate
    )
    return packet.write()


def stored(listener: MqttListener) -> int:
    return listener.node.guaranteed.queue("readings").usage()[0]


async def test_a_publish_sent_again_on_a_later_connection_is_taken_once() -> None:
    async with edge() as listener:
        device = await connect(listener.port, present=False)
        async with device.stream:
            await device.stream.send(publish(7, b"reading"))
            await device.take(mqtt5.PubRecPacket)
        # Gone before it could act on the PUBREC: it sends the PUBLISH again.
        again = await connect(listener.port, present=True)
        async with again.stream:
            await again.stream.send(publish(7, b"reading", duplicate=True))
            received = await again.take(mqtt5.PubRecPacket)
            assert (received.packet_id, received.reason_code) == (7, 0)
            await again.stream.send(mqtt5.PubRelPacket(7).write())
            complete = await again.take(mqtt5.PubCompPacket)
            assert (complete.packet_id, complete.reason_code) == (7, 0)
            assert stored(listener) == 1
            # Released: the same packet id is a new message now.
            await again.stream.send(publish(7, b"next"))
            await again.take(mqtt5.PubRecPacket)
            assert stored(listener) == 2


async def test_a_release_on_a_later_connection_completes_the_exchange() -> None:
    async with edge() as listener:
        device = await connect(listener.port, present=False)
        async with device.stream:
            await device.stream.send(publish(9, b"reading"))
            await device.take(mqtt5.PubRecPacket)
        again = await connect(listener.port, present=True)
        async with again.stream:
            await again.stream.send(mqtt5.PubRelPacket(9).write())
            complete = await again.take(mqtt5.PubCompPacket)
            assert (complete.packet_id, complete.reason_code) == (9, 0)  # not 0x92


async def test_a_clean_start_forgets_what_was_taken() -> None:
    async with edge() as listener:
        device = await connect(listener.port, present=False)
        async with device.stream:
            await device.stream.send(publish(7, b"reading"))
            await device.take(mqtt5.PubRecPacket)
        again = await connect(listener.port, present=False, clean=True)
        async with again.stream:
            await again.stream.send(publish(7, b"another"))  # a new session: a new message
            await again.take(mqtt5.PubRecPacket)
            assert stored(listener) == 2


async def test_the_session_file_holds_a_taken_id_before_the_pubrec_goes(
    tmp_path: Path,
) -> None:
    """A crash right after the PUBREC finds the id in the file: nothing written later
    is needed for the resend to be recognised. After the PUBCOMP it is gone from the
    file, so a crash then does not make a new message with that id look like a resend."""
    async with edge(tmp_path) as listener:
        files = listener.node.stash[REGISTRY].files
        path = files.path("default", "meter")
        device = await connect(listener.port, present=False)
        async with device.stream:
            await device.stream.send(publish(7, b"reading"))
            await device.take(mqtt5.PubRecPacket)
            assert orjson.loads(path.read_bytes())["received"] == [7]
            await device.stream.send(mqtt5.PubRelPacket(7).write())
            await device.take(mqtt5.PubCompPacket)
            assert orjson.loads(path.read_bytes())["received"] == []


async def test_a_restart_keeps_what_was_taken(tmp_path: Path) -> None:
    async with edge(tmp_path) as listener:
        device = await connect(listener.port, present=False)
        async with device.stream:
            await device.stream.send(publish(7, b"reading"))
            await device.take(mqtt5.PubRecPacket)
    async with edge(tmp_path) as listener:
        assert stored(listener) == 1
        again = await connect(listener.port, present=True)
        async with again.stream:
            await again.stream.send(publish(7, b"reading", duplicate=True))
            await again.take(mqtt5.PubRecPacket)
            await again.stream.send(mqtt5.PubRelPacket(7).write())
            complete = await again.take(mqtt5.PubCompPacket)
            assert complete.reason_code == 0
            assert stored(listener) == 1
