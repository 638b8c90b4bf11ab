"""Real MQTT clients for the tests: paho-mqtt in its own thread, driven from async tests,
and the mosquitto broker and command-line clients from Debian's packages."""

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Callable
from typing import Any

import anyio
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

V311 = mqtt.MQTTv311
V5 = mqtt.MQTTv5
WAIT = 10.0  # seconds a test waits for something a real client must see


def needs(program: str) -> Any:
    """Skip a test when ``program`` is not installed (``bash scripts/bench-peers``)."""
    found = shutil.which(program) or shutil.which(program, path="/usr/sbin")
    return pytest.mark.skipif(
        found is None, reason=f"{program} is not installed: bash scripts/bench-peers"
    )


class Paho:
    """One paho-mqtt client: its network loop in paho's thread, its calls in workers."""

    def __init__(self, port: int, client_id: str, protocol: int = V5, **options: Any) -> None:
        """``options``: ``clean_session`` (3.1.1), ``transport="websockets"`` with
        ``ws_path``, ``ca`` (a CA file: TLS) and ``host`` (default 127.0.0.1)."""
        self.port = port
        self.protocol = protocol
        self.host = options.pop("host", "127.0.0.1")
        transport = options.pop("transport", "tcp")
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            clean_session=options.pop("clean_session", None) if protocol != V5 else None,
            transport=transport,
        )
        if transport == "websockets":
            self.client.ws_set_options(path=options.pop("ws_path", "/mqtt"))
        ca = options.pop("ca", None)
        if ca is not None:
            self.client.tls_set(ca_certs=str(ca))
        self.options = options
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connack: Any = None
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.disconnect_reason: Any = None
        self.subacks: queue.Queue[list[Any]] = queue.Queue()
        self.client.on_message = lambda c, u, m: self.messages.put(m)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subacks.put(list(codes))
        self.unsubacks: queue.Queue[int] = queue.Queue()
        self.client.on_unsubscribe = lambda c, u, mid, codes, props: self.unsubacks.put(mid)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connack = (flags, reason, props)
        self.connected.set()

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any
    ) -> None:
        self.disconnect_reason = reason
        self.disconnected.set()

    async def connect(
        self,
        *,
        username: str | None = None,
        password: str | None = None,
        clean_start: bool = True,
        session_expiry: int | None = None,
        keepalive: int = 60,
        will: tuple[str, bytes, int, bool] | None = None,
        will_properties: Properties | None = None,
    ) -> Any:
        """Connect and wait for the CONNACK; its reason code (0 or 'Success': accepted)."""
        client = self.client
        if username is not None:
            client.username_pw_set(username, password)
        if will is not None:
            topic, payload, qos, retain = will
            client.will_set(topic, payload, qos, retain, properties=will_properties)
        properties = None
        if self.protocol == V5:
            properties = Properties(PacketTypes.CONNECT)
            if session_expiry is not None:
                properties.SessionExpiryInterval = session_expiry

        def connect() -> None:
            if self.protocol == V5:
                client.connect(
                    self.host,
                    self.port,
                    keepalive=keepalive,
                    clean_start=clean_start,
                    properties=properties,
                )
            else:
                client.connect(self.host, self.port, keepalive=keepalive)
            client.loop_start()
            if not self.connected.wait(WAIT):
                raise TimeoutError("no CONNACK")

        await anyio.to_thread.run_sync(connect)
        return self.connack[1]

    async def subscribe(
        self, *topics: tuple[str, Any], properties: Properties | None = None
    ) -> list[Any]:
        """Subscribe and wait for the SUBACK; its codes."""
        self.client.subscribe(list(topics), properties=properties)
        return await anyio.to_thread.run_sync(lambda: self.subacks.get(timeout=WAIT))

    async def unsubscribe(self, *topics: str) -> None:
        """Unsubscribe and wait for the UNSUBACK."""
        self.client.unsubscribe(list(topics))
        await anyio.to_thread.run_sync(lambda: self.unsubacks.get(timeout=WAIT))

    async def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> None:
        """Publish and, for QoS 1 and 2, wait until the broker acknowledged it."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if qos:
            await anyio.to_thread.run_sync(lambda: info.wait_for_publish(WAIT))
            assert info.is_published()

    async def wait_published(self, info: mqtt.MQTTMessageInfo) -> None:
        """Wait until the broker acknowledged the publish ``info`` is about."""
        await anyio.to_thread.run_sync(lambda: info.wait_for_publish(WAIT))
        assert info.is_published()

    async def receive(self, timeout: float = WAIT) -> mqtt.MQTTMessage:
        """The next message (fails the test after ``timeout`` seconds)."""
        return await anyio.to_thread.run_sync(lambda: self.messages.get(timeout=timeout))

    async def receive_many(self, count: int, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        return [await self.receive(timeout) for _ in range(count)]

    def nothing_more(self) -> bool:
        return self.messages.empty()

    async def disconnect(self) -> None:
        def stop() -> None:
            self.client.disconnect()
            self.client.loop_stop()

        await anyio.to_thread.run_sync(stop)

    async def drop(self) -> None:
        """Lose the connection without a DISCONNECT (what a crash or a cut cable does)."""

        def cut() -> None:
            sock = self.client.socket()
            self.client.loop_stop()
            if sock is not None:
                sock.close()

        await anyio.to_thread.run_sync(cut)


def user_properties(pairs: list[tuple[str, str]]) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = pairs
    return properties


async def eventually(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    """Wait until ``condition`` holds (real sockets and threads: polled)."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)
