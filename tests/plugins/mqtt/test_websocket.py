"""MQTT over WebSocket (MQTT 5, chapter 6): paho clients of both protocol levels on a
``ws://`` and a ``wss://`` listener, talking with TCP clients and native sessions of
the same VPN; packets that span WebSocket messages and messages that hold several
packets; and every upgrade or frame that breaks the rules closing its connection only,
answered as HTTP and WebSocket say, while a healthy client goes on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import attrs
import mqtt5
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    Request,
)

from meshbus import ConfigurationError, Node
from meshbus.app._config import load_config
from meshbus.plugins.mqtt import (
    DEFAULT_WS_PORT,
    DEFAULT_WSS_PORT,
    MqttListener,
    MqttListenerSettings,
    start_mqtt_listener,
)
from meshbus.plugins.mqtt._websocket import WebSocketStream
from meshbus.transports import TlsSettings

from ._clients import V5, V311, Paho, eventually
from ._packets import CONNECT_5

BOTH = pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
MAX_PACKET = 2048


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    async with Node(name="edge") as node:
        yield node


@pytest.fixture
async def listener(node: Node) -> MqttListener:
    settings = MqttListenerSettings(port=0, websocket=True, max_packet_size=MAX_PACKET)
    return await start_mqtt_listener(node, settings)


# --- real clients ----------------------------------------------------------------------


@pytest.mark.anyio
@BOTH
async def test_paho_over_websocket_talks_with_tcp_clients_and_native_sessions(
    node: Node, listener: MqttListener, protocol: int
) -> None:
    assert listener.url == f"ws://127.0.0.1:{listener.port}/mqtt"
    tcp = await start_mqtt_listener(node, MqttListenerSettings(port=0))
    native = node.connect(client_name="native")
    native.subscribe("to-native/>")
    browser = Paho(listener.port, "browser", protocol, transport="websockets")
    await browser.connect()
    await browser.subscribe(("to-browser/#", 1))
    device = Paho(tcp.port, "device", protocol)
    await device.connect()
    await device.subscribe(("to-device/#", 1))

    await browser.publish("to-device/1", b"from the browser", qos=1)
    await browser.publish("to-native/1", b"also from the browser", qos=0)
    got = await device.receive()
    assert (got.topic, got.payload, got.qos) == ("to-device/1", b"from the browser", 1)
    await eventually(lambda: len(native.egress) == 1)
    assert native.receive_nowait().payload == b"also from the browser"  # type: ignore[union-attr]

    await device.publish("to-browser/a", b"from the device", qos=1)
    await native.send("to-browser/b", b"from a native session")
    got = await browser.receive_many(2)
    assert sorted((m.topic, m.payload, m.qos) for m in got) == [
        ("to-browser/a", b"from the device", 1),
        ("to-browser/b", b"from a native session", 1),
    ]
    for client in (browser, device):
        await client.disconnect()
    assert listener.statistics().logins == 1


@pytest.mark.anyio
async def test_secure_websocket(node: Node, certs: Path) -> None:
    tls = TlsSettings(certificate=certs / "server.pem", private_key=certs / "server-key.pem")
    secure = await start_mqtt_listener(
        node, MqttListenerSettings(port=0, websocket=True, tls=tls, websocket_path="/ws")
    )
    assert secure.url == f"wss://127.0.0.1:{secure.port}/ws"
    native = node.connect(client_name="native")
    native.subscribe("secure/>")
    browser = Paho(
        secure.port,
        "browser",
        V5,
        transport="websockets",
        ws_path="/ws",
        ca=certs / "ca.pem",
        host="localhost",
    )
    await browser.connect()
    await browser.publish("secure/1", b"encrypted", qos=1)
    await eventually(lambda: len(native.egress) == 1)
    assert native.receive_nowait().payload == b"encrypted"  # type: ignore[union-attr]
    await browser.disconnect()


# --- a client made by hand -------------------------------------------------------------


class WsClient:
    """A WebSocket client made with wsproto, writing what the test chooses."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.events: list[Any] = []
        self.mqtt = b""

    @classmethod
    async def open(cls, port: int, target: str = "/mqtt", protocols: tuple[str, ...] = ("mqtt",)):
        client = cls(await anyio.connect_tcp("127.0.0.1", port))
        request = Request(host="localhost", target=target, subprotocols=list(protocols))
        await client.stream.send(client.ws.send(request))
        return client

    async def read_until(self, done: Any, timeout: float = 10) -> None:
        with anyio.fail_after(timeout):
            while not done():
                try:
                    data = await self.stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    self.events.append("closed")
                    return
                self.ws.receive_data(data)
                for event in self.ws.events():
                    if isinstance(event, BytesMessage):
                        self.mqtt += bytes(event.data)
                    self.events.append(event)

    def kinds(self) -> list[type]:
        return [type(e) for e in self.events if not isinstance(e, str)]

    async def upgraded(self) -> None:
        await self.read_until(lambda: self.events)
        assert isinstance(self.events[0], AcceptConnection), self.events
        assert self.events[0].subprotocol == "mqtt"
        self.events.clear()

    async def send(self, data: bytes) -> None:
        await self.stream.send(self.ws.send(BytesMessage(data=data)))

    async def packets(self, count: int) -> list[Any]:
        found: list[Any] = []

        def enough() -> bool:
            while self.mqtt:
                try:
                    packet, used = mqtt5.read(self.mqtt)
                except IndexError:
                    break
                found.append(packet)
                self.mqtt = self.mqtt[used:]
            return len(found) >= count

        await self.read_until(enough)
        return found

    async def closed(self) -> None:
        await self.read_until(lambda: "closed" in self.events)


@pytest.mark.anyio
async def test_packets_span_messages_and_messages_hold_packets(
    node: Node, listener: MqttListener
) -> None:
    native = node.connect(client_name="native")
    native.subscribe("split/>")
    client = await WsClient.open(listener.port)
    async with client.stream:
        await client.upgraded()
        await client.send(CONNECT_5[:5])  # a CONNECT in two messages
        await client.send(CONNECT_5[5:])
        (connack,) = await client.packets(1)
        assert type(connack) is mqtt5.ConnAckPacket
        two = b"".join(mqtt5.PublishPacket(f"split/{i}", b"x").write() for i in range(2))
        await client.send(two)  # two PUBLISHes in one message
        await eventually(lambda: len(native.egress) == 2)
        await client.stream.send(client.ws.send(Ping(b"hi")))
        await client.read_until(lambda: Pong in client.kinds())
        await client.stream.send(client.ws.send(CloseConnection(code=1000)))
        await client.read_until(lambda: CloseConnection in client.kinds())
    assert [m.topic for m in (native.receive_nowait(), native.receive_nowait())] == [  # type: ignore[union-attr]
        "split/0",
        "split/1",
    ]


# --- what is refused ---------------------------------------------------------------------

UPGRADE = (
    "GET {target} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{more}\r\n"
)


async def answer_to(port: int, request: bytes) -> bytes:
    """Everything the listener writes to a connection that sent ``request``, until it
    closes the connection (it must, by itself)."""
    got = b""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request)
        with anyio.fail_after(5):
            while True:
                try:
                    got += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return got


REFUSED = {
    "another path": (UPGRADE.format(target="/other", more="Sec-WebSocket-Protocol: mqtt\r\n"), 404),
    "no subprotocol": (UPGRADE.format(target="/mqtt", more=""), 400),
    "another subprotocol": (
        UPGRADE.format(target="/mqtt", more="Sec-WebSocket-Protocol: chat\r\n"),
        400,
    ),
    "not an upgrade": ("GET /mqtt HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
    "MQTT without the upgrade": (CONNECT_5.decode("latin-1"), 400),
}


@pytest.mark.anyio
@pytest.mark.parametrize(("request_text", "status"), REFUSED.values(), ids=REFUSED.keys())
async def test_a_refused_upgrade_is_answered_and_closed(
    listener: MqttListener, request_text: str, status: int
) -> None:
    healthy = Paho(listener.port, "healthy", V5, transport="websockets")
    await healthy.connect()
    await healthy.subscribe(("ok/#", 1))
    answer = await answer_to(listener.port, request_text.encode("latin-1"))
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer
    await eventually(lambda: listener.statistics().malformed == 1)
    await healthy.publish("ok/1", b"still here", qos=1)
    assert (await healthy.receive()).payload == b"still here"
    await healthy.disconnect()


@pytest.mark.anyio
async def test_an_older_client_offering_only_mqttv3_1_is_taken(listener: MqttListener) -> None:
    client = await WsClient.open(listener.port, protocols=("mqttv3.1",))
    async with client.stream:
        await client.read_until(lambda: client.events)
        (accepted,) = client.events
        assert isinstance(accepted, AcceptConnection)
        assert accepted.subprotocol == "mqttv3.1"


@pytest.mark.anyio
async def test_a_refusal_is_an_http_answer(listener: MqttListener) -> None:
    client = await WsClient.open(listener.port, target="/elsewhere")
    async with client.stream:
        await client.read_until(lambda: client.events)
        assert isinstance(client.events[0], RejectConnection)
        assert client.events[0].status_code == 404


async def attack(port: int, frames: list[bytes]) -> WsClient:
    """A logged-in connection that then writes ``frames`` (raw bytes) and is closed."""
    client = await WsClient.open(port)
    async with client.stream:
        await client.upgraded()
        await client.send(CONNECT_5)
        await client.packets(1)
        await client.stream.send(b"".join(frames))
        await client.closed()
    return client


def masked(first: int, payload: bytes, length: int | None = None) -> bytes:
    """A client frame: ``first`` (FIN, opcode), a mask of zeros, ``payload``; the length
    it claims is ``length`` when given (it may lie)."""
    size = len(payload) if length is None else length
    if size < 126:
        head = bytes([first, 0x80 | size])
    elif size < 1 << 16:
        head = bytes([first, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([first, 0x80 | 127]) + size.to_bytes(8, "big")
    return head + b"\x00\x00\x00\x00" + payload


BIG_PUBLISH = mqtt5.PublishPacket("t", b"x" * (MAX_PACKET * 2)).write()

ATTACKS = {
    "a text message": ([masked(0x81, b"hello")], 1003),
    "an unmasked frame": ([b"\x82\x02\x30\x00"], 1002),
    "an unknown opcode": ([masked(0x83, b"")], 1002),
    "a fragmented ping": ([masked(0x09, b"")], 1002),
    "a frame of 2**40 bytes holding a packet over the limit": (
        [masked(0x82, BIG_PUBLISH[:64], length=1 << 40)],
        None,
    ),
    "a packet over the limit, its header in two frames": (
        [masked(0x02, BIG_PUBLISH[:2]), masked(0x80, BIG_PUBLISH[2:3])],
        None,
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize(("frames", "code"), ATTACKS.values(), ids=ATTACKS.keys())
async def test_a_hostile_frame_closes_its_connection_only(
    listener: MqttListener, frames: list[bytes], code: int | None
) -> None:
    healthy = Paho(listener.port, "healthy", V311, transport="websockets")
    await healthy.connect()
    await healthy.subscribe(("ok/#", 1))
    client = await attack(listener.port, frames)
    closes = [e for e in client.events if isinstance(e, CloseConnection)]
    if code is not None:
        assert [c.code for c in closes] == [code]
    else:  # the MQTT packet size check closed it, saying why first (MQTT 5)
        disconnect, used = mqtt5.read(client.mqtt)
        assert used == len(client.mqtt)
        assert type(disconnect) is mqtt5.DisconnectPacket
        assert disconnect.reason_code == 0x95  # packet too large
        assert listener.statistics().malformed == 1
    await eventually(lambda: listener.statistics().connected == 1)
    await healthy.publish("ok/1", b"still here", qos=1)
    assert (await healthy.receive()).payload == b"still here"
    await healthy.disconnect()


# --- fuzzing the stream ------------------------------------------------------------------


class Scripted(anyio.abc.ByteStream):
    """A byte stream that hands out ``chunks``, then its end; it keeps what is written."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.written: list[bytes] = []

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self.chunks:
            raise anyio.EndOfStream
        return self.chunks.pop(0)

    async def send(self, item: bytes) -> None:
        self.written.append(item)

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def upgraded_server() -> WSConnection:
    server, client = WSConnection(ConnectionType.SERVER), WSConnection(ConnectionType.CLIENT)
    server.receive_data(client.send(Request(host="h", target="/mqtt", subprotocols=["mqtt"])))
    (request,) = server.events()
    assert isinstance(request, Request)
    server.send(AcceptConnection(subprotocol="mqtt"))
    return server


frame_parts = st.one_of(
    st.binary(max_size=64),
    st.builds(
        masked,
        st.sampled_from([0x82, 0x02, 0x00, 0x80, 0x81, 0x88, 0x89, 0x8A, 0x83, 0xC2, 0x09]),
        st.binary(max_size=40),
        st.one_of(st.none(), st.integers(0, 1 << 63)),
    ),
)


@settings(max_examples=400, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(chunks=st.lists(frame_parts, max_size=6))
def test_any_bytes_after_the_upgrade_are_data_or_an_end(chunks: list[bytes]) -> None:
    """Nothing but bytes, or the stream's end (EndOfStream, BrokenResourceError), comes
    out of a WebSocket stream, whatever the client writes after the upgrade."""

    async def read_all() -> None:
        stream = WebSocketStream(Scripted(list(chunks)), upgraded_server())
        with anyio.fail_after(5):
            while True:
                try:
                    data = await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
                assert isinstance(data, bytes)
                assert data

    anyio.run(read_all)


# --- configuration --------------------------------------------------------------------------


def test_websocket_listeners_in_the_file(tmp_path: Path, certs: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text(
        f"""
[[mqtt.listeners]]
websocket = true

[[mqtt.listeners]]
websocket = true
websocket_path = "/devices"
[mqtt.listeners.tls]
certificate = "{certs / "server.pem"}"
private_key = "{certs / "server-key.pem"}"
""",
        encoding="utf-8",
    )
    plain, secure = load_config(path, environ={}).section("mqtt")
    assert plain == MqttListenerSettings(port=DEFAULT_WS_PORT, websocket=True)
    assert plain.label == "ws://127.0.0.1:8000/mqtt"
    assert attrs.evolve(secure, tls=None) == MqttListenerSettings(
        port=DEFAULT_WSS_PORT, websocket=True, websocket_path="/devices"
    )
    assert secure.label == "wss://127.0.0.1:8443/devices"


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"websocket": "yes"}, "websocket must be true or false"),
        ({"websocket_path": "mqtt"}, "websocket_path must be a URL path"),
        ({"websocket_path": "/mqtt?x=1"}, "websocket_path must be a URL path"),
    ],
)
def test_bad_websocket_settings(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        MqttListenerSettings(**settings)
