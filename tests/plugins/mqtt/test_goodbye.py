"""A node that stops, or a listener that closes (a reload removed it), tells each
MQTT 5 client why before it closes the connection: a DISCONNECT with "server
shutting down" (0x8B), after which nothing more is written. MQTT 3.1.1 has no
server DISCONNECT: its clients see the connection close, as before."""

from __future__ import annotations

import anyio
import mqtt5
import pytest

from meshbus import Node
from meshbus.plugins.mqtt import MqttListenerSettings, start_mqtt_listener

from ._clients import V5, Paho
from ._packets import CONNECT_311
from ._raw import login

pytestmark = pytest.mark.anyio


async def test_a_stopping_node_says_goodbye_to_mqtt_5_clients() -> None:
    async with Node(name="edge") as node:
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        client = await login(listener.port)
        old = await anyio.connect_tcp("127.0.0.1", listener.port)
        await old.send(CONNECT_311)
        assert await old.receive() == b"\x20\x02\x00\x00"  # CONNACK, accepted
    packets = await client.to_the_end()
    assert [(type(p), p.reason_code) for p in packets] == [  # type: ignore[attr-defined]
        (mqtt5.DisconnectPacket, 0x8B)
    ]
    async with old:
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await old.receive()  # 3.1.1: closed, with nothing written


async def test_a_closed_listener_says_goodbye_and_the_node_serves_on() -> None:
    async with Node(name="edge") as node:
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        other = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        client = await login(listener.port)
        await listener.aclose()
        packets = await client.to_the_end()
        assert [(type(p), p.reason_code) for p in packets] == [  # type: ignore[attr-defined]
            (mqtt5.DisconnectPacket, 0x8B)
        ]
        paho = Paho(other.port, "still-served", V5)
        await paho.connect()
        await paho.disconnect()


async def test_paho_hears_why() -> None:
    async with Node(name="edge") as node:
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        paho = Paho(listener.port, "told", V5)
        await paho.connect()
    assert await anyio.to_thread.run_sync(paho.disconnected.wait, 5)
    assert paho.disconnect_reason == "Server shutting down"
    paho.client.loop_stop()
