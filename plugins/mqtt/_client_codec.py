"""The client side of MQTT, for bridges to external brokers: what a client sends, and
reading what a broker sends, in MQTT 5 (``mqtt5``) and 3.1.1 (by hand, into the same
packet classes, as the server side does)."""

from __future__ import annotations

import struct

import mqtt5
from mqtt5 import (
    ConnAckPacket,
    ConnAckReasonCode,
    PingRespPacket,
    QoS,
    SubAckPacket,
    SubAckReasonCode,
    TopicFilter,
    UnsubAckPacket,
)

from ._codec import (
    MQTT_5,
    Codec,
    MalformedPacket,
    ReadPacket,
    _Cursor,
    _length,
    _read5,
    _read311,
    _remaining_start,
)

__all__ = ["ClientCodec"]

_U16 = struct.Struct(">H")

# MQTT 3.1.1 CONNACK return codes as MQTT 5 reason codes.
_CONNACK_5 = {0: 0, 1: 0x84, 2: 0x85, 3: 0x88, 4: 0x86, 5: 0x87}


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _U16.pack(len(raw)) + raw


class ClientCodec(Codec):
    """A :class:`Codec` for the client end of a connection (a bridge's)."""

    def connect(
        self,
        client_id: str,
        *,
        clean_start: bool,
        keep_alive: int,
        username: str | None,
        password: str | None,
        session_expiry: int,
        receive_max: int,
    ) -> bytes:
        """CONNECT (a 3.1.1 session lasts while ``clean_start`` is false)."""
        secret = None if password is None else password.encode("utf-8")
        if self.v5:
            return mqtt5.ConnectPacket(
                client_id,
                username=username,
                password=secret,
                clean_start=clean_start,
                keep_alive=keep_alive,
                session_expiry_interval=session_expiry,
                receive_max=receive_max,
            ).write()
        flags = 0x02 if clean_start else 0
        payload = _text(client_id)
        if username is not None:
            flags |= 0x80
            payload += _text(username)
            if secret is not None:
                flags |= 0x40
                payload += _U16.pack(len(secret)) + secret
        body = _text("MQTT") + bytes((4, flags)) + _U16.pack(keep_alive) + payload
        return b"\x10" + _length(len(body)) + body

    def subscribe(self, packet_id: int, filters: list[tuple[str, int]]) -> bytes:
        """SUBSCRIBE (on MQTT 5 with no-local: a bridge is never sent back what it sent)."""
        if self.v5:
            return mqtt5.SubscribePacket(
                packet_id,
                [
                    TopicFilter(f, max_qos=QoS(q), no_local=True, retain_as_published=True)
                    for f, q in filters
                ],
            ).write()
        body = _U16.pack(packet_id) + b"".join(_text(f) + bytes((q,)) for f, q in filters)
        return b"\x82" + _length(len(body)) + body

    def unsubscribe(self, packet_id: int, filters: list[str]) -> bytes:
        if self.v5:
            return mqtt5.UnsubscribePacket(packet_id, filters).write()
        body = _U16.pack(packet_id) + b"".join(_text(f) for f in filters)
        return b"\xa2" + _length(len(body)) + body

    def pingreq(self) -> bytes:
        return b"\xc0\x00"

    def goodbye(self) -> bytes:
        """DISCONNECT, normal."""
        return b"\xe0\x00"

    def read_server(self, data: bytes) -> ReadPacket:
        """A packet from the broker, as the packet classes; :class:`MalformedPacket`."""
        if self.level == MQTT_5:
            return _read5(data)
        kind = data[0] >> 4
        c = _Cursor(data, _remaining_start(data))
        if kind == 2:
            flags = c.byte()
            code = c.byte()
            c.done()
            return ConnAckPacket(
                session_present=bool(flags & 1),
                reason_code=ConnAckReasonCode(_CONNACK_5.get(code, 0x80)),
            )
        if kind == 9:
            packet_id = c.u16()
            codes = []
            while c.at < c.end:
                code = c.byte()
                codes.append(SubAckReasonCode(code if code in (0, 1, 2) else 0x80))
            return SubAckPacket(packet_id, codes)
        if kind == 11:
            packet_id = c.u16()
            c.done()
            return UnsubAckPacket(packet_id, [])
        if kind == 13:
            c.done()
            return PingRespPacket()
        if kind == 3 or kind in (4, 5, 6, 7):
            return _read311(data)
        raise MalformedPacket(f"packet type {kind} is not one a broker sends")
