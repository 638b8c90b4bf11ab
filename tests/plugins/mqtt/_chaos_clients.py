"""The wire side of the MQTT chaos test (``test_mqtt_chaos.py``): clients made by hand
(MQTT 5 packets through ``mqtt5``, 3.1.1 byte by byte), what they read, and the
constants the run draws from. A client tells the run (``Chaos``, in ``_chaos.py``)
what it got and what it found wrong."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import attrs
import mqtt5
import pytest
from mqtt5 import QoS, RetainHandling, TopicFilter

from ._packets import packet, text

if TYPE_CHECKING:
    from ._chaos import Chaos

pytestmark = pytest.mark.anyio

STEPS = int(os.environ.get("CHAOS_STEPS", "250"))
WAIT = 10.0  # seconds any one answer of the node may take
DUE = 3.0  # seconds what is due to connected clients may take to come (localhost)
MAX_INFLIGHT = 100  # the listener's max_inflight (the window of a 3.1.1 client)

TOPICS = ("t/a", "t/b", "t/a/x", "u/a", "u/b/c")
FILTERS = ("t/a", "t/b", "t/+", "t/#", "t/a/#", "u/#", "u/+/c", "+/a", "+/+")
MARK_Q, MARK_D = "z/q/", "z/d/"  # the end's markers: no chaos filter matches them
WILLS = "z/w/"  # every connection's will goes to z/w/<client id>: none matches it either

# How often each kind of step is drawn.
ACTIONS, WEIGHTS = zip(
    *{
        "connect": 12,
        "disconnect": 5,
        "drop": 5,
        "takeover": 3,
        "subscribe": 14,
        "unsubscribe": 5,
        "publish": 26,
        "burst": 6,
        "publish-drop": 2,
        "hold": 4,
        "release": 4,
        "restart": 2,
        "settle": 5,
    }.items(),
    strict=True,
)

Action = tuple[str, tuple[Any, ...]]
"""A step: what (``"publish"``, ``"drop"`` ...) and with what (all drawn already)."""


@attrs.frozen
class Kind:
    """A client id's protocol and habits."""

    v5: bool
    persistent: bool  # comes back to its session (clean start 0 and, on 5, an expiry)
    receive_max: int = 65535  # MQTT 5


IDENTITIES = {
    "p5": Kind(v5=True, persistent=True, receive_max=3),  # a small window: held acks fill it
    "q5": Kind(v5=True, persistent=True),
    "p3": Kind(v5=False, persistent=True),
    "c5": Kind(v5=True, persistent=False),
    "c3": Kind(v5=False, persistent=False),
}
AUDIT = "audit"  # a clean MQTT 5 client of the end, reading the retained values


def _mid(payload: bytes) -> int | None:
    """The message a payload names (``m<number>``); ``None`` for anything else."""
    return int(payload[1:]) if payload.startswith(b"m") else None


def matches(mqtt_filter: str, topic: str) -> bool:
    """MQTT's matching of a topic filter (``+``, ``#``) and a topic without ``$``."""
    f, t = mqtt_filter.split("/"), topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


@attrs.define
class In:
    """A packet from the node."""

    kind: str  # connack, publish, puback, suback, unsuback, pingresp, disconnect
    pid: int | None = None
    topic: str = ""
    payload: bytes = b""
    qos: int = 0
    dup: bool = False
    retain: bool = False
    codes: list[int] = attrs.Factory(list)
    present: bool = False


def _read5(buffer: bytes) -> tuple[In, int] | None:
    try:
        got, used = mqtt5.read(buffer)
    except IndexError:  # incomplete
        return None
    kind = type(got)
    if kind is mqtt5.PublishPacket:
        return In(
            "publish",
            got.packet_id,
            got.topic,
            bytes(got.payload),
            int(got.qos),
            bool(got.duplicate),
            bool(got.retain),
        ), used
    if kind is mqtt5.ConnAckPacket:
        return In("connack", codes=[int(got.reason_code)], present=got.session_present), used
    if kind is mqtt5.PubAckPacket:
        return In("puback", got.packet_id, codes=[int(got.reason_code)]), used
    if kind is mqtt5.SubAckPacket:
        return In("suback", got.packet_id, codes=[int(c) for c in got.reason_codes]), used
    if kind is mqtt5.UnsubAckPacket:
        return In("unsuback", got.packet_id, codes=[int(c) for c in got.reason_codes]), used
    if kind is mqtt5.PingRespPacket:
        return In("pingresp"), used
    if kind is mqtt5.DisconnectPacket:
        return In("disconnect", codes=[int(got.reason_code)]), used
    return In(kind.__name__), used


def _read311(buffer: bytes) -> tuple[In, int] | None:
    """One MQTT 3.1.1 packet a server sends, read by hand (not with the node's codec)."""
    size, shift, at = 0, 0, 1
    while True:
        if at >= len(buffer):
            return None
        byte = buffer[at]
        size |= (byte & 0x7F) << shift
        shift += 7
        at += 1
        if not byte & 0x80:
            break
    if len(buffer) < at + size:
        return None
    first, body, used = buffer[0], buffer[at : at + size], at + size
    kind = first >> 4
    if kind == 3:
        qos = (first >> 1) & 3
        length = int.from_bytes(body[:2], "big")
        topic = body[2 : 2 + length].decode()
        at = 2 + length
        pid = None
        if qos:
            pid = int.from_bytes(body[at : at + 2], "big")
            at += 2
        return In("publish", pid, topic, body[at:], qos, bool(first & 8), bool(first & 1)), used
    if kind == 2:
        return In("connack", codes=[body[1]], present=bool(body[0] & 1)), used
    if kind in (4, 11):
        name = "puback" if kind == 4 else "unsuback"
        return In(name, int.from_bytes(body[:2], "big"), codes=[0]), used
    if kind == 9:
        return In("suback", int.from_bytes(body[:2], "big"), codes=list(body[2:])), used
    if kind == 13:
        return In("pingresp"), used
    return In(f"type {kind}"), used


class Ended(Exception):
    """The node closed a connection a step was waiting on."""


@attrs.define(eq=False)
class Got:
    """A PUBLISH a client got."""

    name: str
    serial: int  # its connection
    incarnation: int  # the session that connection had
    mid: int | None  # the message (None: an empty payload, or a marker)
    topic: str
    payload: bytes
    qos: int
    dup: bool
    retain: bool
    pid: int | None
    order: int  # in all that arrived, everywhere
    step: int
    window: int | None  # the subscribe step it came after (None: none going on)
    acked: bool = False  # the client sent its PUBACK (a QoS 1 one)
    acked_in: int | None = None  # the connection's write that had the PUBACK
    resent: bool = False  # a retained value sent again (DUP) on a later connection


class Conn:
    """One MQTT connection made by hand: MQTT 5 through ``mqtt5``, 3.1.1 byte by byte.
    What the node sends is read by its own task; QoS 1 publishes are acknowledged at
    once, or held while :attr:`hold` is set."""

    def __init__(self, chaos: Chaos, name: str, serial: int) -> None:
        self.chaos = chaos
        self.name = name
        self.kind = IDENTITIES.get(name, Kind(v5=True, persistent=False))
        self.v5 = self.kind.v5
        self.serial = serial
        self.incarnation = 0
        self.clean = True
        self.stream: anyio.abc.ByteStream | None = None
        self.buffer = b""
        self.got: list[In] = []  # everything but PUBLISH, in order
        self.changed = anyio.Event()
        self.closed = False
        self.expected_close = False
        self.lock = anyio.Lock()
        self.next_pid = 0
        self.unacked: dict[int, int | None] = {}  # QoS 1 received, not acked: pid -> mid
        self.hold = False
        self.held: list[int] = []
        self.window: int | None = None
        self.markers: set[bytes] = set()
        self.pings = 0
        self.writes = 0  # counted: the node has read up to :attr:`Chaos.read_upto`

    def __repr__(self) -> str:
        return f"{self.name}#{self.serial}"

    def pid(self) -> int:
        self.next_pid = self.next_pid % 65535 + 1
        return self.next_pid

    @property
    def will(self) -> tuple[str, bytes]:
        """Its will's topic and payload (QoS 1, no delay): it names the connection."""
        return WILLS + self.name, b"w%d" % self.serial

    async def open(self, port: int) -> In:
        self.stream = await anyio.connect_tcp("127.0.0.1", port)
        self.chaos.tg.start_soon(self.read)
        kind = self.kind
        topic, payload = self.will
        if self.v5:
            expiry = 3600 if kind.persistent else 0
            data = mqtt5.ConnectPacket(
                self.name,
                clean_start=self.clean,
                session_expiry_interval=expiry,
                receive_max=kind.receive_max,
                will=mqtt5.Will(topic, payload=payload, qos=QoS.AT_LEAST_ONCE),
            ).write()
        else:
            flags = (0x02 if self.clean else 0) | 0x04 | 0x08  # a will, at QoS 1
            head = text("MQTT") + bytes([4, flags]) + (60).to_bytes(2, "big")
            will = text(topic) + len(payload).to_bytes(2, "big") + payload
            data = packet(0x10, head + text(self.name) + will)
        await self.send(data)
        return await self.until(lambda: self._first("connack"), "CONNACK")

    def _first(self, kind: str, pid: int | None = None) -> In | None:
        for each in self.got:
            if each.kind == kind and (pid is None or each.pid == pid):
                return each
        return None

    async def send(self, data: bytes) -> int:
        """Write ``data``; the number of that write on this connection."""
        assert self.stream is not None
        try:
            async with self.lock:
                self.writes += 1
                await self.stream.send(data)
                return self.writes
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self._ended()
            return self.writes

    async def until(self, done: Callable[[], Any], what: str) -> Any:
        """Wait until ``done()`` gives something (an answer of the node)."""
        with anyio.fail_after(WAIT):
            while True:
                found = done()
                if found:
                    return found
                if self.closed:
                    raise Ended(f"{self!r} closed while waiting for {what}")
                self.changed = anyio.Event()
                await self.changed.wait()

    def _ended(self) -> None:
        self.closed = True
        self.changed.set()

    async def read(self) -> None:
        read = _read5 if self.v5 else _read311
        stream = self.stream
        assert stream is not None
        try:
            while True:
                self.buffer += await stream.receive()
                while self.buffer:
                    found = read(self.buffer)
                    if found is None:
                        break
                    got, used = found
                    self.buffer = self.buffer[used:]
                    await self._take(got)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            self._ended()
            self.chaos.arrived()

    async def _take(self, got: In) -> None:
        if got.kind == "publish":
            await self.chaos.received(self, got)
            if got.qos == 1:
                assert got.pid is not None
                if got.pid in self.unacked:
                    self.chaos.fail(
                        "packet id", f"{self!r} got packet id {got.pid} again while in flight"
                    )
                self.unacked[got.pid] = _mid(got.payload)
                limit = self.kind.receive_max if self.v5 else MAX_INFLIGHT
                if len(self.unacked) > limit:
                    self.chaos.fail(
                        "receive maximum",
                        f"{self!r} has {len(self.unacked)} QoS 1 messages in flight, "
                        f"its receive maximum is {limit}",
                    )
                if self.hold:
                    self.held.append(got.pid)
                else:
                    await self.ack(got.pid)
        else:
            if got.kind == "connack":
                self.chaos.on_connack(self, got)  # before anything after it is read
            if got.kind == "disconnect" and got.codes != [0x8E] and not self.expected_close:
                self.chaos.fail("closed", f"{self!r} got DISCONNECT {got.codes}")
            self.got.append(got)
            if got.kind == "pingresp":
                self.pings += 1
        self.changed.set()

    async def ack(self, pid: int) -> None:
        mid = self.unacked.pop(pid, None)
        got = self.chaos.acked_by_client(self, mid, pid) if mid is not None else None
        data = mqtt5.PubAckPacket(pid).write() if self.v5 else b"\x40\x02" + pid.to_bytes(2, "big")
        written = await self.send(data)
        if got is not None:
            got.acked_in = written

    async def release(self) -> None:
        held, self.held, self.hold = self.held, [], False
        for pid in held:
            await self.ack(pid)

    async def ping(self) -> None:
        """Wait until the node has acted on everything sent before."""
        target = self.pings + 1
        written = await self.send(b"\xc0\x00")
        await self.until(lambda: self.pings >= target, "PINGRESP")
        read = self.chaos.read_upto
        read[self.serial] = max(read.get(self.serial, 0), written)

    def publish_bytes(
        self, pid: int | None, topic: str, payload: bytes, qos: int, retain: bool
    ) -> bytes:
        if self.v5:
            return mqtt5.PublishPacket(
                topic, payload, qos=QoS(qos), retain=retain, packet_id=pid
            ).write()
        first = 0x30 | (qos << 1) | int(retain)
        body = text(topic) + (pid.to_bytes(2, "big") if pid else b"") + payload
        return packet(first, body)

    def subscribe_bytes(
        self, pid: int, mqtt_filter: str, qos: int, no_local: bool, rh: int
    ) -> bytes:
        if self.v5:
            wanted = TopicFilter(
                mqtt_filter,
                max_qos=QoS(qos),
                no_local=no_local,
                retain_as_published=False,
                retain_handling=RetainHandling(rh),
            )
            return mqtt5.SubscribePacket(pid, [wanted]).write()
        return packet(0x82, pid.to_bytes(2, "big") + text(mqtt_filter) + bytes([qos]))

    def unsubscribe_bytes(self, pid: int, mqtt_filter: str) -> bytes:
        if self.v5:
            return mqtt5.UnsubscribePacket(pid, [mqtt_filter]).write()
        return packet(0xA2, pid.to_bytes(2, "big") + text(mqtt_filter))

    async def close(self, *, polite: bool) -> None:
        self.expected_close = True
        if self.stream is None:
            return
        if polite and not self.closed:
            await self.send(b"\xe0\x00")
            with anyio.move_on_after(WAIT, shield=True):
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    await self.stream.aclose()
        await anyio.aclose_forcefully(self.stream)
