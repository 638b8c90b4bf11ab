"""MQTT packets made by hand for the hostile-input tests: builders, a corpus of valid
client packets of both protocol levels, and what the fuzz tests do with bytes."""

from __future__ import annotations

import sys
from collections.abc import Callable

import mqtt5
from hypothesis import strategies as st
from mqtt5 import QoS, TopicFilter, Will

from meshbus.plugins.mqtt import MQTT_5, MQTT_311, MalformedPacket

CONNECT_5 = mqtt5.ConnectPacket("hostile", clean_start=True).write()  # keepalive 0: none
CONNECT_311 = bytes.fromhex("100c00044d5154540402003c0000")  # keepalive 60 s, empty id


def text(value: str) -> bytes:
    raw = value.encode()
    return len(raw).to_bytes(2, "big") + raw


def packet(first: int, body: bytes) -> bytes:
    """A packet: its first byte, the remaining length, ``body``."""
    size, length = len(body), bytearray()
    while True:
        size, byte = size >> 7, size & 0x7F
        length.append(byte | (0x80 if size else 0))
        if not size:
            return bytes([first, *length]) + body


def connect_311(flags: int, *fields: str, level: int = 4, name: str = "MQTT") -> bytes:
    head = text(name) + bytes([level, flags]) + (60).to_bytes(2, "big")
    return packet(0x10, head + b"".join(text(f) for f in fields))


PUBLISH_WITH_PROPERTY = mqtt5.PublishPacket("t", b"x", user_properties=[("k", "\u00e9")]).write()
CONNECT_WITH_ID = mqtt5.ConnectPacket("\u00e9", clean_start=True).write()


def not_utf8(data: bytes) -> bytes:
    """``data`` with its "é" (two UTF-8 bytes) made two bytes no UTF-8 text holds."""
    assert data.count("\u00e9".encode()) == 1
    return data.replace("\u00e9".encode(), b"\xff\xff")


VALID_5 = (
    mqtt5.ConnectPacket(
        "dev-1",
        username="u",
        password=b"p",
        will=Will("w/t", payload=b"x", qos=QoS(1), user_properties=[("a", "b")]),
        keep_alive=30,
        session_expiry_interval=60,
        user_properties=[("k", "v")],
    ).write(),
    mqtt5.PublishPacket(
        "a/b",
        b"payload",
        qos=QoS(1),
        packet_id=7,
        user_properties=[("k", "v")],
        content_type="text/plain",
        response_topic="r/t",
        correlation_data=b"c",
        message_expiry_interval=5,
        topic_alias=2,
    ).write(),
    mqtt5.PublishPacket("a", b"").write(),
    mqtt5.SubscribePacket(
        1, [TopicFilter("a/#", max_qos=QoS(1), no_local=True), TopicFilter("$share/g/x")]
    ).write(),
    mqtt5.UnsubscribePacket(2, ["a/#", "b"]).write(),
    mqtt5.PubAckPacket(3, reason_str="ok").write(),
    mqtt5.PubRelPacket(4).write(),
    mqtt5.PingReqPacket().write(),
    mqtt5.DisconnectPacket(session_expiry_interval=0, reason_str="bye").write(),
)
VALID_311 = (
    connect_311(0xEE, "dev-1", "w/t", "x", "user", "pw"),  # will QoS 1 retained, login
    packet(0x32, text("a/b") + b"\x00\x07payload"),
    packet(0x30, text("a")),
    packet(0x82, b"\x00\x01" + text("a/#") + b"\x01" + text("$share/g/x") + b"\x00"),
    packet(0xA2, b"\x00\x02" + text("a/#")),
    bytes.fromhex("40020003"),
    bytes.fromhex("62020004"),
    b"\xc0\x00",
    b"\xe0\x00",
)
VALID = {MQTT_5: VALID_5, MQTT_311: VALID_311}

#: Bytes a mutation sets: the edges of lengths and flags, UTF-8 lead bytes, separators.
SPECIAL = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0xC0, 0xED, ord("/"), ord("$"), ord("+"), ord("#")]


def mutate(data: bytes, draw: st.DrawFn) -> bytes:
    """``data`` with one to three flips, settings, insertions, deletions or a truncation
    (``tests.fuzzing.mutate``, with bytes that matter to MQTT rather than to JSON)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        if op == "flip" and out:
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and out:
            out[at] = draw(st.sampled_from(SPECIAL))
        elif op == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del out[at : at + draw(st.integers(1, 8))]
        else:
            del out[at:]
    return bytes(out)


def escapes(work: Callable[[], None], unraisable: list[str] | None = None) -> str | None:
    """What ``work()`` raised that is not a :class:`MalformedPacket` (a codec panic is a
    ``BaseException``), or ``None``. What was reported to ``sys.unraisablehook`` on the
    way (a codec panic reports the error it met there) goes to ``unraisable``."""
    reported = unraisable if unraisable is not None else []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: reported.append(u.exc_type.__name__)
    try:
        work()
    except MalformedPacket:
        return None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    finally:
        sys.unraisablehook = hook
    return None
