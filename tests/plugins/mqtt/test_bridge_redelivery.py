"""A broker's redelivery across an MQTT bridge keeps its flag (SPEC 4, 13).

A broker sends a QoS 1 message again, with the DUP flag, when it saw no PUBACK for
it: the bridge may have spooled it already. Here a broker made by hand (no mosquitto
needed) welcomes the bridge and sends one message flagged DUP and one not; the
node's queue and its direct subscriber must get the first flagged ``redelivered``,
as they would a second copy over a meshbus link.
"""

from __future__ import annotations

import anyio
import anyio.abc
import mqtt5
import pytest

from meshbus import LinkState, Node
from meshbus.plugins.bridge import BridgeSettings, TopicMapping, open_bridge

pytestmark = pytest.mark.anyio

_QOS1 = mqtt5.QoS.AT_LEAST_ONCE


async def _broker(stream: anyio.abc.ByteStream, acked: list[int]) -> None:
    """Answer CONNECT and SUBSCRIBE, then send the two messages; note the PUBACKs."""
    buffer = b""
    async with stream:
        while True:
            try:
                buffer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return
            while buffer:
                try:
                    packet, used = mqtt5.read(buffer)
                except ValueError:
                    break  # a partial packet: read more (mqtt5 says so this way)
                buffer = buffer[used:]
                if isinstance(packet, mqtt5.ConnectPacket):
                    await stream.send(mqtt5.ConnAckPacket(session_present=False).write())
                elif isinstance(packet, mqtt5.SubscribePacket):
                    granted = [mqtt5.SubAckReasonCode.GRANTED_QOS_AT_LEAST_ONCE]
                    again = mqtt5.PublishPacket(
                        "in/1", b"again", qos=_QOS1, packet_id=1, duplicate=True
                    )
                    first = mqtt5.PublishPacket("in/2", b"first", qos=_QOS1, packet_id=2)
                    await stream.send(
                        mqtt5.SubAckPacket(
                            packet.packet_id, granted * len(packet.topic_filters)
                        ).write()
                        + again.write()
                        + first.write()
                    )
                elif isinstance(packet, mqtt5.PubAckPacket):
                    acked.append(packet.packet_id)
                elif isinstance(packet, mqtt5.PingReqPacket):
                    await stream.send(mqtt5.PingRespPacket().write())


async def test_a_message_the_broker_sends_again_is_flagged_redelivered() -> None:
    acked: list[int] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, Node(name="edge") as node, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, lambda stream: _broker(stream, acked))
        node.guaranteed.create_queue("inbox", subscriptions=["in/>"])
        direct = node.connect(client_name="direct")
        direct.subscribe("in/>")
        bridge = open_bridge(
            node.vpn(),
            BridgeSettings(
                "cloud",
                remotes=[f"mqtt://127.0.0.1:{port}"],
                mqtt={"protocol": 5},
                topics=[TopicMapping("in/>", mode="SUB")],
                backoff=None,
            ),
        )
        with anyio.fail_after(10):
            await bridge.wait_for(LinkState.IN_SYNC)
            while acked != [1, 2]:
                await anyio.sleep(0.01)
        flow = await node.connect(client_name="consumer").bind("inbox")
        with anyio.fail_after(10):
            spooled = [await flow.receive(), await flow.receive()]
        assert [(m.payload, m.redelivered) for m in spooled] == [
            (b"again", True),
            (b"first", False),
        ]
        copies = list(iter(direct.receive_nowait, None))
        assert [(m.payload, m.redelivered) for m in copies] == [(b"again", True), (b"first", False)]
        bridge.stop()
        tg.cancel_scope.cancel()
