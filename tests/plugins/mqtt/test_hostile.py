"""Hostile bytes against an MQTT listener (SPEC 13): "a packet that breaks the protocol
closes its connection only".

Each attack is one raw TCP connection writing bytes made by hand, while a healthy pair
of paho clients (MQTT 3.1.1 or 5) exchanges QoS 1 messages through the same listener.
The node must close the hostile connection by itself, soon (well before any timeout of
the listener's would), answer what MQTT says it answers, count it, log no error, and
the healthy pair must lose nothing.

Then hypothesis feeds arbitrary and mutated bytes to the sans-IO codec (a
``PacketReader`` and a ``Codec``, and ``read_connect`` for a connection's first
packet): nothing but ``MalformedPacket`` may come out of them.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import anyio
import attrs
import mqtt5
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from meshbus import Node
from meshbus.plugins.mqtt import (
    MQTT_5,
    MQTT_311,
    Codec,
    MqttListener,
    MqttListenerSettings,
    PacketReader,
    start_mqtt_listener,
)
from meshbus.plugins.mqtt._codec import read_connect

from ._clients import V5, V311, Paho, eventually
from ._packets import (
    CONNECT_5,
    CONNECT_311,
    CONNECT_WITH_ID,
    PUBLISH_WITH_PROPERTY,
    VALID,
    connect_311,
    escapes,
    mutate,
    not_utf8,
    packet,
    text,
)

CLOSED_WITHIN = 3.0  # seconds; the listener's own timeouts are 10 s (login) and 90 s or more
MAX_PACKET = 2048
CONNECT_PACKET = 256

BAD_TOPIC = bytes.fromhex("30040002ffff")  # PUBLISH to a topic that is not UTF-8


# --- the attacks ------------------------------------------------------------------------------


@attrs.frozen
class Attack:
    """One hostile connection: a valid CONNECT (or none), then ``body``."""

    login: bytes | None
    body: bytes
    eof: bool = False
    """Close our side after ``body`` (a truncated packet and goodbye)."""
    counter: str | None = "malformed"
    """The listener's counter that goes up (``None``: none does)."""
    answer: tuple[bytes, ...] = ()
    """Packets the node writes after the CONNACK of ``login`` (MQTT 5: a DISCONNECT
    whose reason code is what counts, given as its first three bytes)."""


def disconnect(reason: int) -> tuple[bytes, ...]:
    return (bytes([0xE0, 0, reason]),)  # the length byte is not compared


def shape(packet: bytes) -> bytes:
    """What is compared of a packet: a DISCONNECT's type and reason code (its length and
    reason string vary), anything else whole."""
    return packet[:1] + packet[2:3] if packet[0] == 0xE0 else packet


SUBSCRIBE_BAD_5 = bytes.fromhex("82080001000002ffff01")  # filter b"\xff\xff", QoS 1
SUBSCRIBE_BAD_311 = bytes.fromhex("820700010002ffff01")
ATTACKS = {
    "5: PUBLISH topic not UTF-8": Attack(CONNECT_5, BAD_TOPIC, answer=disconnect(0x81)),
    "3.1.1: PUBLISH topic not UTF-8": Attack(CONNECT_311, BAD_TOPIC),
    "PUBLISH topic not UTF-8 before CONNECT": Attack(None, BAD_TOPIC),
    "a valid PUBLISH before CONNECT": Attack(None, packet(0x30, text("a/b") + b"x")),
    "a PINGREQ before CONNECT": Attack(None, b"\xc0\x00"),
    "5-byte remaining length before CONNECT": Attack(None, bytes.fromhex("30ffffffff7f")),
    "5: 5-byte remaining length": Attack(
        CONNECT_5, bytes.fromhex("30ffffffff7f"), answer=disconnect(0x81)
    ),
    "5: header over max_packet_size, no body": Attack(
        CONNECT_5, bytes.fromhex("30a08d06"), answer=disconnect(0x95)
    ),
    "3.1.1: header over max_packet_size, no body": Attack(CONNECT_311, bytes.fromhex("32a08d06")),
    "CONNECT over connect_packet_size": Attack(None, mqtt5.ConnectPacket("x" * 600).write()),
    "CONNECT header over connect_packet_size, no body": Attack(None, bytes.fromhex("10a08d06")),
    "an HTTP request": Attack(None, b"GET / HTTP/1.1\r\nHost: edge\r\nX-Pad: " + b"a" * 80),
    "0xff bytes": Attack(None, b"\xff" * 32),
    "zero bytes": Attack(None, b"\x00" * 8),
    "5: packet type 0": Attack(CONNECT_5, b"\x00\x00", answer=disconnect(0x81)),
    "3.1.1: packet type 0": Attack(CONNECT_311, b"\x00\x00"),
    "5: AUTH (enhanced authentication is not done)": Attack(
        CONNECT_5,
        mqtt5.AuthPacket(
            reason_code=mqtt5.AuthReasonCode(0x18), authentication_method="SCRAM"
        ).write(),
        answer=disconnect(0x82),  # protocol error: CONNACK offered no method
    ),
    "5: truncated PUBLISH, then close": Attack(CONNECT_5, bytes.fromhex("3010000361"), True, None),
    "truncated CONNECT, then close": Attack(None, CONNECT_5[:5], True, None),
    "5: a second CONNECT": Attack(CONNECT_5, CONNECT_5, answer=disconnect(0x82)),
    "3.1.1: a second CONNECT": Attack(CONNECT_311, CONNECT_311),
    "3.1.1: SUBSCRIBE filter not UTF-8": Attack(CONNECT_311, SUBSCRIBE_BAD_311),
    "3.1.1 CONNECT with protocol level 3": Attack(
        None, connect_311(2, "", level=3), counter="refused", answer=(b"\x20\x02\x00\x01",)
    ),
    "3.1 CONNECT (MQIsdp, level 3)": Attack(
        None, connect_311(2, "", level=3, name="MQIsdp"), None, "refused", (b"\x20\x02\x00\x01",)
    ),
}

#: Strings the ``mqtt5`` codec panics on: the plugin checks them before it is called.
#: Until c17c86b only a PUBLISH topic was: the panic was contained, but printed a Rust
#: backtrace and reported to ``sys.unraisablehook``, once per packet.
PANICS = {
    "5: SUBSCRIBE filter not UTF-8": Attack(CONNECT_5, SUBSCRIBE_BAD_5, answer=disconnect(0x81)),
    "5: PUBLISH user property not UTF-8": Attack(
        CONNECT_5, not_utf8(PUBLISH_WITH_PROPERTY), answer=disconnect(0x81)
    ),
    "5: CONNECT client id not UTF-8": Attack(None, not_utf8(CONNECT_WITH_ID)),
}
#: A misplaced wildcard on 3.1.1, where the packet classes the decoder builds raise
#: ``ValueError``: until c17c86b the connection ended as an "internal error" (an ERROR
#: with a traceback), not as a malformed packet.
WILDCARDS = {
    "3.1.1: SUBSCRIBE a/#/b": Attack(
        CONNECT_311, packet(0x82, b"\x00\x01" + text("a/#/b") + b"\0")
    ),
    "3.1.1: UNSUBSCRIBE a/#/b": Attack(CONNECT_311, packet(0xA2, b"\x00\x01" + text("a/#/b"))),
    "3.1.1: CONNECT with will topic w/+": Attack(None, connect_311(0x06, "", "w/+", "x")),
}
#: MQTT 5 packets whose property length runs past the packet, holding a string that
#: is not UTF-8: the check before the codec gives up on the length ("the codec says
#: what is wrong"), the codec reads the string anyway and panics. Contained, but not
#: quietly: see test_no_mqtt5_packet_makes_the_codec_panic.
OVERLONG = {
    "5: PUBLISH, content type after a property length one too long": Attack(
        CONNECT_5, bytes.fromhex("300900017406030002ffff"), answer=disconnect(0x81)
    ),
    "5: SUBSCRIBE, user property after a property length past the end": Attack(
        CONNECT_5, bytes.fromhex("820e0001202600016b0001ff00016100"), answer=disconnect(0x81)
    ),
    "5: PUBACK, reason string after a property length past the end": Attack(
        CONNECT_5, bytes.fromhex("40090001007f1f0002ffff"), answer=disconnect(0x81)
    ),
    "5: DISCONNECT, reason string after a property length past the end": Attack(
        CONNECT_5, bytes.fromhex("e007007f1f0002ffff"), answer=disconnect(0x81)
    ),
    "5: CONNECT, user property after a property length past the end": Attack(
        None, bytes.fromhex("101500044d5154540502003c202600016b0001ff000178")
    ),
}
QUIETLY = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
ALL = {
    **ATTACKS,
    **PANICS,
    **WILDCARDS,
    **{f"{name} (codec panic)": pytest.param(a, marks=QUIETLY) for name, a in OVERLONG.items()},
}
FOUND = {**PANICS, **WILDCARDS}

#: Reason codes MQTT 5 has for a DISCONNECT from the server (3.14.2.1), errors only.
#: (The node once closed with 0x8C, which DISCONNECT has not: mqtt5 refused to write it
#: and the client was told nothing.)
DISCONNECT_REASONS = {0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90}
DISCONNECT_REASONS |= {0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D}
DISCONNECT_REASONS |= {0x9E, 0x9F, 0xA0, 0xA1, 0xA2}


class Pair:
    """Two paho clients exchanging QoS 1 messages; every one sent must arrive, in order."""

    def __init__(self, listener: MqttListener, protocol: int) -> None:
        self.sub = Paho(listener.port, "healthy-sub", protocol)
        self.pub = Paho(listener.port, "healthy-pub", protocol)
        self.sent: list[bytes] = []

    async def start(self) -> None:
        await self.sub.connect()
        await self.pub.connect()
        assert await self.sub.subscribe(("healthy/#", 1)) == [1]

    async def exchange(self, count: int) -> None:
        for _ in range(count):
            payload = b"%d" % len(self.sent)
            await self.pub.publish("healthy/counter", payload, qos=1)
            self.sent.append(payload)

    async def keep_exchanging(self, stop: anyio.Event) -> None:
        while not stop.is_set():
            await self.exchange(1)

    async def check(self) -> None:
        got = await self.sub.receive_many(len(self.sent))
        assert [(m.payload, m.qos) for m in got] == [(p, 1) for p in self.sent]
        await anyio.sleep(0.05)
        assert self.sub.nothing_more()


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    async with Node(name="edge") as running:
        yield running


@pytest.fixture
async def listener(node: Node) -> MqttListener:
    settings = MqttListenerSettings(
        port=0, max_packet_size=MAX_PACKET, connect_packet_size=CONNECT_PACKET
    )
    return await start_mqtt_listener(node, settings)


@pytest.fixture(params=[V311, V5], ids=["healthy 3.1.1", "healthy 5"])
async def pair(listener: MqttListener, request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    healthy = Pair(listener, request.param)
    await healthy.start()
    await healthy.exchange(3)
    yield healthy
    await healthy.sub.disconnect()
    await healthy.pub.disconnect()


async def run(attack: Attack, port: int) -> list[bytes]:
    """Make the hostile connection; what the node wrote before it closed, as packets."""
    with anyio.fail_after(CLOSED_WITHIN):
        stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        reader = PacketReader(1 << 20)
        packets: list[bytes] = []
        with anyio.fail_after(CLOSED_WITHIN):
            if attack.login is not None:
                await stream.send(attack.login)
                while not packets:
                    packets += reader.feed(await stream.receive())
            await stream.send(attack.body)
            if attack.eof:
                await stream.send_eof()
        try:
            with anyio.fail_after(CLOSED_WITHIN):  # the node must close, by itself
                while True:
                    packets += reader.feed(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
        except TimeoutError:
            pytest.fail(f"the node kept the connection open {CLOSED_WITHIN} s")
    assert not reader.buffered, "the node wrote a partial packet"
    return packets


async def attack_beside_the_pair(
    listener: MqttListener, pair: Pair, attack: Attack, caplog: pytest.LogCaptureFixture
) -> None:
    before = listener.statistics()
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(pair.keep_exchanging, stop)
        packets = await run(attack, listener.port)
        stop.set()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]  # logged before the node closed
    if attack.login == CONNECT_5:
        assert packets[0][0] == 0x20, packets  # CONNACK
        assert packets[0][3] == 0, packets  # accepted
    elif attack.login == CONNECT_311:
        assert packets[0] == b"\x20\x02\x00\x00"
    rest = packets[1:] if attack.login is not None else packets
    assert [shape(p) for p in rest] == [shape(a) for a in attack.answer]
    assert all(p[2] in DISCONNECT_REASONS for p in rest if p[0] == 0xE0), rest

    def counted() -> bool:
        after = listener.statistics()
        for name in ("malformed", "refused"):
            expected = getattr(before, name) + (name == attack.counter)
            if getattr(after, name) != expected:
                return False
        return after.connected == 2  # the healthy pair only

    await eventually(counted, timeout=CLOSED_WITHIN)
    assert {client_id for _, client_id in listener.registry.sessions} == {
        "healthy-sub",
        "healthy-pub",
    }
    await pair.exchange(3)
    await pair.check()


@pytest.mark.parametrize("attack", ALL.values(), ids=ALL.keys())
async def test_a_hostile_connection_is_closed_and_harms_no_one(
    listener: MqttListener, pair: Pair, attack: Attack, caplog: pytest.LogCaptureFixture
) -> None:
    await attack_beside_the_pair(listener, pair, attack, caplog)


# --- fuzzing the codec --------------------------------------------------------------------------

LEVELS = pytest.mark.parametrize("level", [MQTT_311, MQTT_5], ids=["3.1.1", "5"])


def fuzz(examples: int) -> Any:
    """Hypothesis settings: ``examples`` new cases each run (about 1 ms each), no database,
    no deadline (a slow CI machine is not a failure)."""
    return settings(
        max_examples=examples,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


@st.composite
def mutated(draw: st.DrawFn, level: int) -> bytes:
    """Valid packets of ``level``, one of them mutated; either as it is (its length may
    now lie) or framed again with its true remaining length (the decoder sees it all)."""
    packets = draw(st.lists(st.sampled_from(VALID[level]), min_size=1, max_size=3))
    at = draw(st.integers(0, len(packets) - 1))
    chosen = packets[at]
    if draw(st.booleans()):
        packets[at] = mutate(chosen, draw)
    else:
        start = 2 if chosen[1] < 0x80 else 3
        first = draw(st.sampled_from([chosen[0], chosen[0] ^ 0x0F, draw(st.integers(0, 255))]))
        packets[at] = packet(first, mutate(chosen[start:], draw))
    return b"".join(packets)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(min(p, len(data)) for p in points)})
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def decode(level: int, limit: int, chunks: list[bytes]) -> None:
    """What a logged-in connection does with bytes: cut them, decode each packet."""
    reader, codec = PacketReader(limit), Codec(level)
    for chunk in chunks:
        for each in reader.feed(chunk):
            codec.read(each)


def serve(chunks: list[bytes]) -> None:
    """What a new connection does: its first packet is a CONNECT of either level, whose
    level decodes the rest, under the larger limit once logged in."""
    reader: PacketReader = PacketReader(CONNECT_PACKET)
    codec: Codec | None = None
    for chunk in chunks:
        for each in reader.feed(chunk):
            if codec is None:
                level, _ = read_connect(each)
                codec, reader.limit = Codec(level), MAX_PACKET
            else:
                codec.read(each)


def contained(work: Callable[[], None], chunks: list[bytes], *, quietly: bool = False) -> None:
    """``work()`` raises nothing but :class:`MalformedPacket` and, ``quietly``, makes
    the codec panic on nothing (a panic, contained or not, reports to
    ``sys.unraisablehook``; the panics of :data:`OVERLONG` are still there)."""
    unraisable: list[str] = []
    assert escapes(work, unraisable) is None, chunks
    if quietly:
        assert unraisable == [], chunks


limits = st.sampled_from([2, 128, MAX_PACKET, 1 << 28])
points = st.lists(st.integers(0, 400), max_size=4)


@LEVELS
@fuzz(1000)
@given(data=st.binary(max_size=400), limit=limits, points=points)
def test_arbitrary_bytes_are_packets_or_malformed(
    level: int, data: bytes, limit: int, points: list[int]
) -> None:
    chunks = cut(data, points)
    contained(lambda: decode(level, limit, chunks), chunks)


@LEVELS
@fuzz(1000)
@given(data=st.data(), limit=limits, points=points)
def test_mutated_packets_are_packets_or_malformed(
    level: int, data: st.DataObject, limit: int, points: list[int]
) -> None:
    chunks = cut(data.draw(mutated(level)), points)
    contained(lambda: decode(level, limit, chunks), chunks)


@LEVELS
@fuzz(600)
@given(data=st.data(), points=points)
def test_mutated_logins_are_accepted_or_malformed(
    level: int, data: st.DataObject, points: list[int]
) -> None:
    login = mutate(VALID[level][0], data.draw)  # the CONNECT, then the others as they are
    chunks = cut(login + b"".join(VALID[level][1:]), points)
    contained(lambda: serve(chunks), chunks)


@pytest.mark.parametrize("attack", FOUND.values(), ids=FOUND.keys())
def test_what_the_first_runs_found_is_malformed_in_the_codec_and_quiet(
    attack: Attack, capfd: pytest.CaptureFixture[str]
) -> None:
    """The inputs these tests found (fixed in c17c86b), in the codec alone: malformed,
    with no panic reported and no Rust backtrace on standard error."""
    contained(lambda: serve([attack.login or b"", attack.body]), [attack.body], quietly=True)
    assert capfd.readouterr().err == ""


@fuzz(1000)
@given(data=st.data(), points=points)
@example(data=None, points=[])  # the inputs of OVERLONG, always tried first
def test_no_mqtt5_packet_makes_the_codec_panic(data: Any, points: list[int]) -> None:
    if data is None:
        streams = [(a.login or b"") + a.body for a in OVERLONG.values()]
    else:
        streams = [
            data.draw(mutated(MQTT_5)),
            mutate(VALID[MQTT_5][0], data.draw) + b"".join(VALID[MQTT_5][1:]),
        ]
    for stream in streams:
        contained(partial(read_5, cut(stream, points)), [stream], quietly=True)


def read_5(chunks: list[bytes]) -> None:
    """A connection's bytes as ``serve`` takes them, or a logged-in MQTT 5 one's."""
    if not chunks:  # a mutation cut everything away: nothing to read
        return
    if chunks[0][:1] == b"\x10":
        serve(chunks)
    else:
        decode(MQTT_5, MAX_PACKET, chunks)
