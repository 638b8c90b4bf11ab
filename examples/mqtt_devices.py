"""MQTT devices on a meshbus node: an edge gateway in one process.

A node opens an MQTT listener on a free port. Two "devices" are paho-mqtt clients
(pip install paho-mqtt): a meter that publishes readings (QoS 0), its state
(retained) and a will, and a valve that keeps a persistent session with a QoS 1
subscription. The application beside them is a native meshbus session: it reads
what the devices publish and sends commands back, one of them while the valve is
offline, which the valve gets when it reconnects. Two workers share the jobs of a
``$share`` subscription at QoS 1: each job reaches one of them. A dashboard in a web page would
speak MQTT over WebSocket: a second listener takes those, and a paho client over
WebSocket stands in for it.

Run: python examples/mqtt_devices.py
"""

from __future__ import annotations

import queue
from collections.abc import Callable

import anyio
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from meshbus import Node
from meshbus.plugins.mqtt import MqttListenerSettings, start_mqtt_listener


def device(
    port: int, client_id: str, *, clean: bool = True, transport: str = "tcp"
) -> tuple[mqtt.Client, queue.Queue]:
    """A connected paho client whose messages land in a queue."""
    inbox: queue.Queue = queue.Queue()
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean, transport=transport
    )
    client.on_message = lambda c, u, m: inbox.put(m)
    client.on_subscribe = lambda c, u, mid, codes, p: inbox.put("subscribed")
    connected: queue.Queue = queue.Queue()
    client.on_connect = lambda c, u, flags, reason, p: connected.put(flags.session_present)
    client.will_set(f"devices/{client_id}/online", b"false", qos=1, retain=True)
    client.connect("127.0.0.1", port)
    client.loop_start()
    client.session_present = connected.get(timeout=5)  # type: ignore[attr-defined]
    return client, inbox


def run_devices(port: int, web_port: int, command: Callable[[str, bytes], None]) -> None:
    dashboard, board = device(web_port, "dashboard", transport="websockets")
    dashboard.subscribe("readings/#", qos=0)
    assert board.get(timeout=5) == "subscribed"
    meter, _ = device(port, "meter-1")
    meter.publish("devices/meter-1/online", b"true", qos=1, retain=True).wait_for_publish(5)
    for kwh in (40, 41):
        meter.publish("readings/meter-1/kwh", str(kwh).encode(), qos=0)
    for _ in range(2):
        message = board.get(timeout=5)
        print(f"dashboard (WebSocket) got {message.topic}: {message.payload.decode()}")
    dashboard.disconnect()
    dashboard.loop_stop()

    valve, inbox = device(port, "valve-3", clean=False)
    valve.subscribe("commands/valve-3/#", qos=1)
    assert inbox.get(timeout=5) == "subscribed"
    command("commands/valve-3/open", b"50%")
    message = inbox.get(timeout=5)
    print(f"valve-3 got {message.topic}: {message.payload.decode()} (QoS {message.qos})")
    valve.disconnect()
    valve.loop_stop()
    command("commands/valve-3/close", b"now")  # while the valve is away

    valve, inbox = device(port, "valve-3", clean=False)
    print(f"valve-3 back, session present: {valve.session_present}")  # type: ignore[attr-defined]
    message = inbox.get(timeout=5)
    print(f"valve-3 got {message.topic}: {message.payload.decode()} (QoS {message.qos})")
    valve.disconnect()
    valve.loop_stop()

    workers = {name: device(port, name) for name in ("worker-1", "worker-2")}
    for worker, inbox in workers.values():
        worker.subscribe("$share/workers/jobs/#", qos=1)
        assert inbox.get(timeout=5) == "subscribed"
    for n in range(4):
        command(f"jobs/{n}", b"resize image")
    taken: dict[str, list[str]] = {}
    while sum(len(jobs) for jobs in taken.values()) < 4:
        for name, (_, inbox) in workers.items():
            try:
                job = inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            taken.setdefault(name, []).append(job.topic)
    jobs = sorted(topic for topics in taken.values() for topic in topics)
    print(f"$share group at QoS 1 took {', '.join(jobs)} once each, over {len(taken)} workers")
    for worker, _ in workers.values():
        worker.disconnect()
        worker.loop_stop()
    meter.loop_stop()
    meter.socket().close()  # the meter loses power: its will is published


async def main() -> None:
    async with Node(name="edge") as node:
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        web = await start_mqtt_listener(node, MqttListenerSettings(port=0, websocket=True))
        print(f"devices connect to {listener.url}, web pages to {web.url}")
        app = node.connect(client_name="app")
        app.subscribe("readings/>")
        app.subscribe("devices/*/online")

        def command(topic: str, payload: bytes) -> None:  # from the devices' thread
            anyio.from_thread.run(app.send, topic, payload)

        await anyio.to_thread.run_sync(run_devices, listener.port, web.port, command)
        while listener.statistics().wills == 0:  # the node notices the meter's cut
            await anyio.sleep(0.01)
        for message in iter(app.receive_nowait, None):
            flag = " (retain)" if message.retain else ""
            body = message.payload.decode()
            print(f"app got {message.topic}: {body} from {message.sender}{flag}")
        late = node.connect(client_name="late")
        late.subscribe("devices/*/online")
        kept = late.receive_nowait()
        assert kept is not None
        print(f"a late subscriber is told {kept.topic}: {kept.payload.decode()}")
        figures = listener.statistics()
        print(f"listener: {figures.logins} logins, {figures.wills} will")


if __name__ == "__main__":
    anyio.run(main)
