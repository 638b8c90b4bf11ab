"""MQTT packets in and out: framing, MQTT 5 through ``mqtt5``, MQTT 3.1.1 by hand.

Bytes from a connection go through a :class:`PacketReader`, which cuts them into
whole packets by their fixed header and refuses one longer than its limit as soon
as the header says so, before any of it is kept. Each packet is then decoded for
the version the client's CONNECT asked for:

* **MQTT 5** by the ``mqtt5`` package, a maintained Rust codec (about 0.4 µs per
  PUBLISH read here). It raises ``ValueError``/``IndexError`` on what it refuses,
  but a string field that is not UTF-8 makes it *panic*: a ``BaseException`` that
  is not an ``Exception``. :func:`_read5` checks a PUBLISH topic itself (the common
  case, and the cheap one) and turns any panic into :class:`MalformedPacket`, so
  a hostile packet closes its connection and nothing else.
* **MQTT 3.1.1** by the small decoder and encoders here: ``mqtt5`` speaks version 5
  only. They produce and take the same packet classes, so the connection logic
  above is written once for both versions.

Either way a packet that cannot be decoded is a :class:`MalformedPacket`, never
another exception.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, TypeAlias

import mqtt5
from mqtt5 import (
    ConnAckPacket,
    ConnectPacket,
    DisconnectPacket,
    Packet,
    PingReqPacket,
    PubAckPacket,
    PubCompPacket,
    PublishPacket,
    PubRecPacket,
    PubRelPacket,
    QoS,
    SubscribePacket,
    TopicFilter,
    UnsubscribePacket,
    Will,
)

__all__ = [
    "MQTT_311",
    "MQTT_5",
    "Codec",
    "MalformedPacket",
    "PacketReader",
    "PacketTooLarge",
    "codec_for",
    "read_connect",
]

MQTT_311 = 4
"""Protocol level of MQTT 3.1.1 in CONNECT."""
MQTT_5 = 5
"""Protocol level of MQTT 5."""

_CONNECT = 1
_PUBLISH = 3


class MalformedPacket(Exception):
    """A packet that breaks the protocol: its connection is closed.

    :ivar reason_code: the MQTT 5 reason code to close with (0x81 malformed packet,
        0x82 protocol error, 0x95 packet too large).
    """

    def __init__(self, why: str, reason_code: int = 0x81) -> None:
        super().__init__(why)
        self.reason_code = reason_code


class PacketTooLarge(MalformedPacket):
    """A packet longer than the connection accepts (refused before it is read)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a packet of {size} bytes is over the limit of {limit}", 0x95)
        self.size = size
        self.limit = limit


class PacketReader:
    """Cuts a byte stream into whole packets (sans-IO: bytes in, packets out)."""

    __slots__ = ("_buffer", "limit")

    def __init__(self, limit: int) -> None:
        #: Longest packet accepted, fixed header included.
        self.limit = limit
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held that are not a whole packet yet."""
        return len(self._buffer)

    def feed(self, data: bytes, most: int = -1) -> list[bytes]:
        """The whole packets ``data`` completes, in order; no more than ``most`` (when
        given): the rest stays buffered, unread, for a later call (``feed(b"")``).

        :raises PacketTooLarge: a packet's fixed header says it is over :attr:`limit`.
        :raises MalformedPacket: a remaining length of more than four bytes.
        """
        buffer = self._buffer
        buffer += data
        packets: list[bytes] = []
        start = 0
        end = len(buffer)
        while end - start >= 2 and len(packets) != most:
            length = 0
            shift = 0
            at = start + 1
            while True:
                if at >= end:
                    if at - start > 4:
                        raise MalformedPacket("remaining length longer than four bytes")
                    length = -1  # the length itself is not all here yet
                    break
                byte = buffer[at]
                length |= (byte & 0x7F) << shift
                at += 1
                if not byte & 0x80:
                    break
                shift += 7
                if shift > 21:
                    raise MalformedPacket("remaining length longer than four bytes")
            if length < 0:
                break
            total = at - start + length
            if total > self.limit:
                raise PacketTooLarge(total, self.limit)
            if end - start < total:
                break
            packets.append(bytes(buffer[start : start + total]))
            start += total
        if start:
            del buffer[:start]
        return packets


# --- MQTT 5 -----------------------------------------------------------------------


def _remaining_start(data: bytes) -> int:
    at = 1
    while data[at] & 0x80:
        at += 1
    return at + 1


def _read5(data: bytes) -> Packet:
    kind = data[0] >> 4
    if kind == _PUBLISH:
        at = 2 if data[1] < 0x80 else 3 if data[2] < 0x80 else _remaining_start(data)
        if len(data) >= at + 2:
            size = (data[at] << 8) | data[at + 1]
            try:
                data[at + 2 : at + 2 + size].decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedPacket("PUBLISH topic is not UTF-8") from None
            qos = data[0] & 0x06
            pid = at + 2 + size  # where a QoS 1 or 2 PUBLISH has its packet identifier
            if qos and len(data) >= pid + 2 and not (data[pid] or data[pid + 1]):
                raise MalformedPacket("packet identifier 0", 0x82)  # MQTT-2.2.1-3
            # Properties: a zero length (the common case) is one byte to look at.
            props = at + 2 + size + (2 if qos else 0)
            if props < len(data) and data[props]:
                _check_strings5(data, kind)
    elif kind in _CHECKED5:
        _check_strings5(data, kind)
    try:
        # bytes as they are: the codec takes any buffer (its stub says memoryview),
        # and wrapping one costs a third of a read
        packet, used = mqtt5.read(data)  # type: ignore[arg-type]
    except (ValueError, IndexError, TypeError, OverflowError) as exc:
        raise MalformedPacket(str(exc) or type(exc).__name__) from None
    except BaseException as exc:  # the codec's panic (not an Exception): contain it
        if type(exc).__name__ != "PanicException":
            raise
        raise MalformedPacket("the packet could not be decoded (a string is not UTF-8?)") from None
    if used != len(data):
        raise MalformedPacket("bytes left over after the packet")
    return packet


# Which MQTT 5 property holds what (SPEC of MQTT 5, 2.2.2.2), for the check below.
_BYTE, _U16P, _U32, _VARINT, _STRING, _BINARY, _PAIR = range(7)
_PROPERTIES = {
    0x01: _BYTE, 0x02: _U32, 0x03: _STRING, 0x08: _STRING, 0x09: _BINARY, 0x0B: _VARINT,
    0x11: _U32, 0x12: _STRING, 0x13: _U16P, 0x15: _STRING, 0x16: _BINARY, 0x17: _BYTE,
    0x18: _U32, 0x19: _BYTE, 0x1A: _STRING, 0x1C: _STRING, 0x1F: _STRING, 0x21: _U16P,
    0x22: _U16P, 0x23: _U16P, 0x24: _BYTE, 0x25: _BYTE, 0x26: _PAIR, 0x27: _U32,
    0x28: _BYTE, 0x29: _BYTE, 0x2A: _BYTE,
}  # fmt: skip
_CHECKED5 = frozenset({1, 4, 5, 6, 7, 8, 10, 14, 15})  # every packet a client sends but PINGREQ


def _varint(c: _Cursor) -> int:
    value = shift = 0
    while True:
        byte = c.byte()
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        if shift > 21:
            raise MalformedPacket("variable byte integer longer than four bytes")


def _properties(c: _Cursor, refused: int = -1) -> None:
    """Step over a property list, checking that every string in it is UTF-8 (and that
    it does not hold property ``refused``: a protocol error)."""
    length = _varint(c)
    end = c.at + length
    if end > c.end:
        raise MalformedPacket("properties longer than the packet")
    while c.at < end:
        identifier = _varint(c)
        if identifier == refused:
            raise MalformedPacket(f"property {identifier:#04x} is not for this packet", 0x82)
        kind = _PROPERTIES.get(identifier)
        if kind is None:
            raise MalformedPacket("unknown property")
        if kind == _STRING:
            c.text()
        elif kind == _PAIR:
            c.text()
            c.text()
        elif kind == _BINARY:
            c.binary()
        elif kind == _VARINT:
            _varint(c)
        else:
            c.at += (1, 2, 4)[kind]  # _BYTE, _U16P, _U32
    if c.at != end:
        raise MalformedPacket("a property runs past the property list")


def _check_strings5(data: bytes, kind: int) -> None:
    """Check the strings of an MQTT 5 packet the codec would otherwise *panic* on.

    The ``mqtt5`` codec checks everything else, but a string that is not UTF-8
    makes it panic (a ``BaseException`` that also prints a Rust backtrace on
    standard error, once per packet): a client could flood the node's log with
    them. So the packets that hold strings are walked here first, cheaply (a plain
    PUBLISH without properties never comes here), and one whose strings cannot be
    reached as the packet's lengths say (a property list running past its end, say)
    is malformed here too: left to the codec, it would read those strings anyway."""
    c = _Cursor(data, _remaining_start(data))
    if kind == _PUBLISH:
        c.text()
        if data[0] & 0x06:
            c.u16()
        _properties(c, refused=0x0B)  # a client sends no subscription identifier (3.3.4-6)
    elif kind in (8, 10):  # SUBSCRIBE, UNSUBSCRIBE: filters after the properties
        if not c.u16():
            raise MalformedPacket("packet identifier 0", 0x82)  # MQTT-2.2.1-3
        _properties(c)
        if c.at >= c.end:
            raise MalformedPacket("no topic filter", 0x82)  # MQTT-3.8.3-2, 3.10.3-2
        while c.at < c.end:
            c.text()
            if kind == 8 and c.byte() & 0xC0:
                raise MalformedPacket("reserved subscription option bits set")  # 3.8.3-5
    elif kind == _CONNECT:
        c.binary()  # the protocol name (checked by read_connect)
        c.byte()
        flags = c.byte()
        _check_connect_flags(flags)
        c.u16()
        _properties(c)
        c.text()  # the client id
        if flags & 0x04:  # a will: its properties, topic and payload
            _properties(c)
            c.text()
            c.binary()
        if flags & 0x80:
            c.text()
    else:  # acks, DISCONNECT, AUTH: a reason code, then properties, when present
        if kind in (4, 5, 6, 7):
            c.u16()
        if c.at < c.end:
            c.byte()
            if c.at < c.end:
                _properties(c)


def _check_connect_flags(flags: int) -> None:
    """The rules of a CONNECT's flags both protocol levels share (MQTT-3.1.2-3, -11,
    -13; 3.1.1 the same)."""
    if flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag is set")
    will_flag = bool(flags & 0x04)
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    if will_qos == 3 or (not will_flag and (will_qos or will_retain)):
        raise MalformedPacket("CONNECT will flags are inconsistent")


def _check_will_topic(connect: ConnectPacket) -> None:
    """A will's topic is a topic name: not empty, no wildcard (MQTT-3.1.3-11)."""
    will = connect.will
    if will is not None and (not will.topic or "+" in will.topic or "#" in will.topic):
        raise MalformedPacket(f"will topic {will.topic!r} is not a topic name", 0x90)


# --- MQTT 3.1.1 -------------------------------------------------------------------


class _Cursor:
    __slots__ = ("at", "data", "end")

    def __init__(self, data: bytes, at: int) -> None:
        self.data = data
        self.at = at
        self.end = len(data)

    def byte(self) -> int:
        if self.at >= self.end:
            raise MalformedPacket("packet ends early")
        value = self.data[self.at]
        self.at += 1
        return value

    def u16(self) -> int:
        if self.at + 2 > self.end:
            raise MalformedPacket("packet ends early")
        value = (self.data[self.at] << 8) | self.data[self.at + 1]
        self.at += 2
        return value

    def binary(self) -> bytes:
        size = self.u16()
        if self.at + size > self.end:
            raise MalformedPacket("packet ends early")
        value = self.data[self.at : self.at + size]
        self.at += size
        return value

    def text(self) -> str:
        raw = self.binary()
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket("a string is not UTF-8") from None
        if "\x00" in value:
            raise MalformedPacket("a string holds U+0000")
        return value

    def rest(self) -> bytes:
        value = self.data[self.at :]
        self.at = self.end
        return value

    def done(self) -> None:
        if self.at != self.end:
            raise MalformedPacket("bytes left over after the packet")


def _connect311(c: _Cursor) -> ConnectPacket:
    flags = c.byte()
    keep_alive = c.u16()
    _check_connect_flags(flags)
    will_flag = bool(flags & 0x04)
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    if flags & 0x40 and not flags & 0x80:
        raise MalformedPacket("CONNECT has a password without a username")
    client_id = c.text()
    will = None
    if will_flag:
        topic = c.text()
        payload = c.binary()
        will = Will(topic, payload=payload, qos=QoS(will_qos), retain=will_retain)
    username = c.text() if flags & 0x80 else None
    password = c.binary() if flags & 0x40 else None
    c.done()
    clean = bool(flags & 0x02)
    return ConnectPacket(
        client_id,
        username=username,
        password=password,
        clean_start=clean,
        will=will,
        keep_alive=keep_alive,
        # A 3.1.1 session without clean session lasts until the client cleans it.
        session_expiry_interval=0 if clean else 0xFFFFFFFF,
    )


_QOS = (QoS(0), QoS(1), QoS(2))


class Publish311:
    """An MQTT 3.1.1 PUBLISH as read: the attributes of ``mqtt5.PublishPacket`` that
    3.1.1 has (the MQTT 5 properties read as absent). A plain slotted class costs
    half what building the codec's own packet object does, on the per-message path."""

    __slots__ = ("duplicate", "packet_id", "payload", "qos", "retain", "topic")

    topic_alias = None
    message_expiry_interval = None
    content_type = None
    response_topic = None
    correlation_data = None
    payload_format_indicator = 0
    user_properties: tuple[()] = ()
    subscription_ids: tuple[()] = ()

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        packet_id: int | None,
        duplicate: bool,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.packet_id = packet_id
        self.duplicate = duplicate

    def __repr__(self) -> str:
        return f"Publish311({self.topic!r}, {self.payload!r}, qos={self.qos})"


#: A publish as the codec reads it: the packet class's, or the 3.1.1 reader's own.
AnyPublish: TypeAlias = PublishPacket | Publish311
#: Any packet as the codec reads it.
ReadPacket: TypeAlias = Packet | Publish311


def _read311(data: bytes) -> ReadPacket:
    try:
        first = data[0]
        if first >> 4 == _PUBLISH:  # the per-message packet: one call less
            return _publish311(data, first)
        return _decode311(data)
    except ValueError as exc:  # the packet classes refuse, say, a misplaced wildcard
        raise MalformedPacket(str(exc) or "invalid packet") from None


def _decode311(data: bytes) -> ReadPacket:
    first = data[0]
    kind = first >> 4
    if kind == _PUBLISH:
        return _publish311(data, first)
    flags = first & 0x0F
    c = _Cursor(data, _remaining_start(data))
    expected = _FLAGS.get(kind)
    if expected is None:
        raise MalformedPacket(f"packet type {kind} is not one a client sends")
    if flags != expected:
        raise MalformedPacket("invalid fixed header flags")
    if kind in (4, 5, 6, 7):  # PUBACK, PUBREC, PUBREL, PUBCOMP
        packet_id = c.u16()
        c.done()
        return _ACKS[kind](packet_id)
    if kind == 8:  # SUBSCRIBE
        packet_id = c.u16()
        filters: list[TopicFilter] = []
        while c.at < c.end:
            pattern = c.text()
            options = c.byte()
            if options & 0xFC or options & 0x03 == 3:
                raise MalformedPacket("SUBSCRIBE options are invalid in MQTT 3.1.1")
            filters.append(
                TopicFilter(pattern, max_qos=QoS(options & 0x03), retain_as_published=False)
            )
        if not filters or not packet_id:
            raise MalformedPacket("SUBSCRIBE without a topic filter or packet identifier")
        return SubscribePacket(packet_id, filters)
    if kind == 10:  # UNSUBSCRIBE
        packet_id = c.u16()
        patterns: list[str] = []
        while c.at < c.end:
            patterns.append(c.text())
        if not patterns or not packet_id:
            raise MalformedPacket("UNSUBSCRIBE without a topic filter or packet identifier")
        return UnsubscribePacket(packet_id, patterns)
    c.done()
    if kind == 12:
        return PingReqPacket()
    if kind == 14:
        return DisconnectPacket()
    if kind == _CONNECT:
        raise MalformedPacket("a second CONNECT", 0x82)
    raise MalformedPacket(f"packet type {kind} is not one a client sends")


def _publish311(data: bytes, first: int) -> Publish311:
    """A 3.1.1 PUBLISH: the per-message path, so read inline rather than by a cursor."""
    qos = (first >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH QoS 3")
    at = 2 if data[1] < 0x80 else 3 if data[2] < 0x80 else _remaining_start(data)
    end = len(data)
    if at + 2 > end:
        raise MalformedPacket("packet ends early")
    start = at + 2
    stop = start + ((data[at] << 8) | data[at + 1])
    if stop > end:
        raise MalformedPacket("packet ends early")
    try:
        topic = data[start:stop].decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("a string is not UTF-8") from None
    if "\x00" in topic:
        raise MalformedPacket("a string holds U+0000")
    packet_id = None
    if qos:
        if stop + 2 > end:
            raise MalformedPacket("packet ends early")
        packet_id = (data[stop] << 8) | data[stop + 1]
        if not packet_id:
            raise MalformedPacket("packet identifier 0")
        stop += 2
    if "+" in topic or "#" in topic or not topic:
        raise MalformedPacket("a PUBLISH topic is empty or holds a wildcard", 0x90)
    return Publish311(topic, data[stop:], qos, bool(first & 0x01), packet_id, bool(first & 0x08))


_FLAGS = {1: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 10: 2, 12: 0, 14: 0}
_Ack: TypeAlias = PubAckPacket | PubRecPacket | PubRelPacket | PubCompPacket
_ACKS: dict[int, type[_Ack]] = {4: PubAckPacket, 5: PubRecPacket, 6: PubRelPacket, 7: PubCompPacket}


def read_connect(data: bytes) -> tuple[int, ConnectPacket]:
    """The protocol level and the CONNECT of a connection's first packet.

    :raises MalformedPacket: not a CONNECT, or not one of MQTT 3.1.1 or 5 (the
        ``reason_code`` 0x84 then asks for an "unsupported protocol version" answer).
    """
    if data[0] != 0x10:
        raise MalformedPacket("the first packet is not CONNECT", 0x82)
    c = _Cursor(data, _remaining_start(data))
    name = c.binary()
    level = c.byte()
    if name == b"MQTT" and level == MQTT_5:
        packet = _read5(data)
        assert isinstance(packet, ConnectPacket)
        _check_will_topic(packet)
        return level, packet
    if name == b"MQTT" and level == MQTT_311:
        try:
            connect = _connect311(c)
        except ValueError as exc:  # a will topic the packet classes refuse
            raise MalformedPacket(str(exc) or "invalid CONNECT") from None
        _check_will_topic(connect)
        return level, connect
    if name in (b"MQTT", b"MQIsdp"):
        raise MalformedPacket(f"protocol level {level} is not supported", 0x84)
    raise MalformedPacket(f"protocol name {name!r} is not MQTT")


# --- encoding ---------------------------------------------------------------------


def _length(size: int) -> bytes:
    if size < 128:
        return bytes((size,))
    out = bytearray()
    while True:
        byte = size & 0x7F
        size >>= 7
        if size:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_U16 = struct.Struct(">H")
_HEAD_SHORT = struct.Struct(">BBH")  # first byte, a one-byte remaining length, topic size
_HEAD_MEDIUM = struct.Struct(">BBBH")  # the same with a two-byte remaining length


class Codec:
    """Decoding and encoding for one protocol level (3.1.1 or 5)."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.v5 = level == MQTT_5
        #: ``read(packet) -> Packet``: one whole packet (from a :class:`PacketReader`)
        #: decoded into the ``mqtt5`` package's packet classes, whatever the level;
        #: :class:`MalformedPacket` for anything that is not a valid client packet.
        self.read: Callable[[bytes], ReadPacket] = _read5 if self.v5 else _read311
        #: ``publish(topic, payload, qos, packet_id, retain, duplicate, properties)``:
        #: the PUBLISH bytes (``properties`` are MQTT 5's, ignored on 3.1.1).
        self.publish: Callable[..., bytes] = _publish5 if self.v5 else _publish311_bytes

    def connack(self, session_present: bool, reason: int, **properties: Any) -> bytes:
        """CONNACK; ``reason`` is the MQTT 5 code (mapped to a 3.1.1 return code)."""
        if self.v5:
            return ConnAckPacket(
                session_present=session_present,
                reason_code=mqtt5.ConnAckReasonCode(reason),
                **properties,
            ).write()
        code = _CONNACK_311.get(reason, 5 if reason else 0)
        return bytes((0x20, 2, 1 if session_present and not code else 0, code))

    def ack(self, kind: int, packet_id: int, reason: int = 0) -> bytes:
        """PUBACK (4), PUBREC (5), PUBREL (6) or PUBCOMP (7)."""
        first = (kind << 4) | (2 if kind == 6 else 0)
        if self.v5 and reason:
            return bytes((first, 3)) + _U16.pack(packet_id) + bytes((reason,))
        return bytes((first, 2)) + _U16.pack(packet_id)

    def suback(self, packet_id: int, codes: list[int]) -> bytes:
        """SUBACK: granted QoS or failure per filter (0x80 and up fail; 3.1.1: 0x80)."""
        if not self.v5:
            codes = [c if c < 0x80 else 0x80 for c in codes]
        body = _U16.pack(packet_id) + (b"\x00" if self.v5 else b"") + bytes(codes)
        return bytes((0x90,)) + _length(len(body)) + body

    def unsuback(self, packet_id: int, codes: list[int]) -> bytes:
        """UNSUBACK (reason codes only on MQTT 5)."""
        if not self.v5:
            return bytes((0xB0, 2)) + _U16.pack(packet_id)
        body = _U16.pack(packet_id) + b"\x00" + bytes(codes)
        return bytes((0xB0,)) + _length(len(body)) + body

    def pingresp(self) -> bytes:
        return b"\xd0\x00"

    def disconnect(self, reason: int, why: str | None = None) -> bytes:
        """DISCONNECT from the server (MQTT 5 only: 3.1.1 closes without a word)."""
        if not self.v5:
            return b""
        return DisconnectPacket(
            reason_code=mqtt5.DisconnectReasonCode(reason), reason_str=why
        ).write()


_CONNACK_311 = {
    0x84: 1,  # unacceptable protocol version
    0x85: 2,  # identifier rejected
    0x88: 3,  # server unavailable
    0x86: 4,  # bad user name or password
    0x87: 5,  # not authorized
}


def _publish5(
    topic: str,
    payload: bytes,
    qos: int,
    packet_id: int | None,
    retain: bool,
    duplicate: bool,
    properties: dict[str, Any] | None,
) -> bytes:
    if properties:
        return PublishPacket(
            topic,
            payload,
            qos=_QOS[qos],
            packet_id=packet_id,
            retain=retain,
            duplicate=duplicate,
            **properties,
        ).write()
    # None: an empty property length, written here (the packet class takes twice as long)
    return _publish_bytes(topic, payload, qos, packet_id, retain, duplicate, b"\x00")


def _publish311_bytes(
    topic: str,
    payload: bytes,
    qos: int,
    packet_id: int | None,
    retain: bool,
    duplicate: bool,
    properties: dict[str, Any] | None,
) -> bytes:
    return _publish_bytes(topic, payload, qos, packet_id, retain, duplicate, b"")


def _publish_bytes(
    topic: str,
    payload: bytes,
    qos: int,
    packet_id: int | None,
    retain: bool,
    duplicate: bool,
    properties: bytes,
) -> bytes:
    """A PUBLISH whose ``properties`` are written already (MQTT 5), or none (3.1.1)."""
    name = topic.encode("utf-8")
    first = 0x30 | (qos << 1) | (1 if retain else 0) | (0x08 if duplicate else 0)
    size = len(name)
    remaining = size + 2 + len(properties) + len(payload) + (2 if qos else 0)
    if remaining < 128:
        head = _HEAD_SHORT.pack(first, remaining, size)
    elif remaining < 16384:  # two bytes of remaining length: most messages
        head = _HEAD_MEDIUM.pack(first, (remaining & 0x7F) | 0x80, remaining >> 7, size)
    else:
        head = bytes((first,)) + _length(remaining) + _U16.pack(size)
    if qos:
        return b"".join((head, name, _U16.pack(packet_id or 0), properties, payload))
    return b"".join((head, name, properties, payload))


def codec_for(level: int) -> Codec:
    """The codec of a connection that logged in with protocol level ``level``."""
    return Codec(level)
