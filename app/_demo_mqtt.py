"""The demo's MQTT section: a device speaking MQTT 5 to the node's own listener.

The device is a small MQTT 5 client written with the same ``mqtt5`` packet codec the
listener uses, over a plain TCP socket, so the demo needs nothing besides meshbus;
paho-mqtt, ``mosquitto_pub`` and ``mosquitto_sub`` connect the same way
(``examples/mqtt_devices.py`` uses paho-mqtt). A web dashboard is the same client
over a WebSocket, as a page's MQTT library would be.
"""

from __future__ import annotations

import anyio
import anyio.abc
import mqtt5

from meshbus import Node, Session


class _Device:
    """Just enough of an MQTT 5 client for the demo: connect, subscribe, publish, read."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> mqtt5.Packet:
        while True:
            if self.buffer:
                try:
                    packet, used = mqtt5.read(memoryview(self.buffer))
                except IndexError:  # not all of it yet
                    pass
                else:
                    self.buffer = self.buffer[used:]
                    return packet
            self.buffer += await self.stream.receive()

    async def send(self, packet: object) -> None:
        await self.stream.send(packet.write())  # type: ignore[attr-defined]


async def _websocket(port: int) -> anyio.abc.ByteStream:
    """A WebSocket for MQTT to ``port``, upgraded."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, Request

    from meshbus.plugins.mqtt._websocket import WebSocketStream

    stream = await anyio.connect_tcp("127.0.0.1", port)
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send(ws.send(Request(host="127.0.0.1", target="/mqtt", subprotocols=["mqtt"])))
    while True:
        ws.receive_data(await stream.receive())
        if any(isinstance(event, AcceptConnection) for event in ws.events()):
            return WebSocketStream(stream, ws)


async def mqtt_demo() -> None:
    from meshbus.plugins.mqtt import MqttListenerSettings, start_mqtt_listener

    print("\n== MQTT devices on the node's own listener, retained values (SPEC 12, 13)")
    async with Node(name="edge") as node:
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        web = await start_mqtt_listener(node, MqttListenerSettings(port=0, websocket=True))
        app = node.connect(client_name="app")
        app.subscribe("readings/>")
        board = _Device(await _websocket(web.port))
        await board.send(mqtt5.ConnectPacket("dashboard", clean_start=True))
        await board.next()  # its CONNACK
        await board.send(mqtt5.SubscribePacket(1, [mqtt5.TopicFilter("readings/#")]))
        await board.next()  # its SUBACK
        async with await anyio.connect_tcp("127.0.0.1", listener.port) as stream:
            device = _Device(stream)
            await device.send(mqtt5.ConnectPacket("meter-1", clean_start=True, keep_alive=30))
            connack = await device.next()
            assert isinstance(connack, mqtt5.ConnAckPacket)
            print(
                f"MQTT 5 client 'meter-1' connected to {listener.url}: {connack.reason_code.name}"
            )
            await device.send(
                mqtt5.SubscribePacket(
                    1, [mqtt5.TopicFilter("commands/meter-1/#", max_qos=mqtt5.QoS(1))]
                )
            )
            suback = await device.next()
            assert isinstance(suback, mqtt5.SubAckPacket)
            await device.send(
                mqtt5.PublishPacket(
                    "readings/meter-1/kwh",
                    b"42",
                    qos=mqtt5.QoS(1),
                    packet_id=2,
                    user_properties=[("unit", "kWh")],
                )
            )
            await device.next()  # its PUBACK: the node holds it
            await device.send(
                mqtt5.PublishPacket(
                    "state/meter-1", b"online", qos=mqtt5.QoS(1), packet_id=3, retain=True
                )
            )
            await device.next()  # its PUBACK: the value is kept
            with anyio.fail_after(10):
                reading = await app.receive()
            print(
                f"native app got {reading.topic} = {reading.payload.decode()} from "
                f"'{reading.sender}', headers {dict(reading.headers)}"
            )
            with anyio.fail_after(10):
                shown = await board.next()
            assert isinstance(shown, mqtt5.PublishPacket)
            print(
                f"web dashboard on {web.url} (MQTT over WebSocket) got "
                f"{shown.topic} = {shown.payload.decode()}"
            )
            await app.send("commands/meter-1/reset", b"now")
            with anyio.fail_after(10):
                command = await device.next()
            assert isinstance(command, mqtt5.PublishPacket)
            await device.send(mqtt5.PubAckPacket(command.packet_id or 0))
            print(
                f"meter-1 got {command.topic} = {command.payload.decode()} "
                f"at QoS {int(command.qos)} (its queue: mqtt/meter-1)"
            )
            late = node.connect(client_name="late")
            late.subscribe("state/*")
            kept = late.receive_nowait()
            assert kept is not None
            print(
                f"a session subscribing later gets {kept.topic} = {kept.payload.decode()} "
                f"(retained={kept.retained})"
            )
            await device.send(mqtt5.DisconnectPacket())
        await _workers(listener.port, app)
        await board.send(mqtt5.DisconnectPacket())
        await board.stream.aclose()
        figures = listener.statistics()
        print(
            f"listener: {figures.logins} logins, {figures.received} publishes in, "
            f"{figures.sent} out"
        )


async def _workers(port: int, app: Session) -> None:
    """Two workers share the jobs of a ``$share`` subscription at QoS 1: each job
    reaches one of them (the group is a queue the node keeps while it has members)."""
    workers = []
    for name in ("worker-a", "worker-b"):
        worker = _Device(await anyio.connect_tcp("127.0.0.1", port))
        await worker.send(mqtt5.ConnectPacket(name, clean_start=True))
        await worker.next()  # its CONNACK
        share = mqtt5.TopicFilter("$share/workers/jobs/#", max_qos=mqtt5.QoS(1))
        await worker.send(mqtt5.SubscribePacket(1, [share]))
        await worker.next()  # its SUBACK: granted QoS 1
        workers.append((name, worker))
    for n in (1, 2):
        await app.send(f"jobs/{n}", b"resize")
    taken = []
    for name, worker in workers:
        with anyio.fail_after(10):
            job = await worker.next()
        assert isinstance(job, mqtt5.PublishPacket)
        await worker.send(mqtt5.PubAckPacket(job.packet_id or 0))
        taken.append(f"{job.topic} to {name}")
        await worker.send(mqtt5.DisconnectPacket())
        await worker.stream.aclose()
    print(f"a $share group at QoS 1 gave {' and '.join(sorted(taken))}: each job once")
