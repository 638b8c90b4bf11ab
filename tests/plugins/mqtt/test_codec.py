"""The MQTT codec's PUBLISH, written and read back, at the sizes where the remaining
length takes one more byte (127/128, 16,383/16,384, 2,097,151/2,097,152), both
protocol levels, QoS 0 and 1; the remaining length is read here on its own."""

from __future__ import annotations

import mqtt5
import pytest

from meshbus.plugins.mqtt import MQTT_5, MQTT_311
from meshbus.plugins.mqtt._codec import Codec

TOPIC = "meters/a"
BOUNDARIES = [127, 128, 16383, 16384, 2097151, 2097152]


def remaining_length(data: bytes) -> tuple[int, int]:
    """The remaining length of ``data`` and where the variable header starts."""
    value, shift, at = 0, 0, 1
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        shift, at = shift + 7, at + 1
        if not byte & 0x80:
            return value, at


@pytest.mark.parametrize("level", [MQTT_311, MQTT_5], ids=["3.1.1", "5"])
@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("remaining", BOUNDARIES)
def test_publish_round_trip_at_remaining_length_boundaries(
    level: int, qos: int, remaining: int
) -> None:
    codec = Codec(level)
    header = 2 + len(TOPIC) + (2 if qos else 0) + (1 if level == MQTT_5 else 0)
    payload = bytes(range(256)) * (remaining // 256) + b"x" * (remaining % 256)
    payload = payload[: remaining - header]
    packet_id = 513 if qos else None
    data = codec.publish(TOPIC, payload, qos, packet_id, False, False, None)
    size, start = remaining_length(data)
    assert size == remaining == len(data) - start
    assert start == 1 + len(_length_bytes(remaining))
    read = codec.read(data)
    assert (read.topic, bytes(read.payload), int(read.qos), read.packet_id) == (
        TOPIC,
        payload,
        qos,
        packet_id,
    )


def _length_bytes(size: int) -> list[int]:
    out = []
    while True:
        size, byte = size >> 7, size & 0x7F
        out.append(byte | (0x80 if size else 0))
        if not size:
            return out


@pytest.mark.parametrize("remaining", [0, *BOUNDARIES])
@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("flags", [(False, False), (True, False), (False, True)])
def test_an_mqtt5_publish_without_properties_is_the_packet_class_one(
    remaining: int, qos: int, flags: tuple[bool, bool]
) -> None:
    """The node writes a PUBLISH without properties itself: byte for byte what
    ``mqtt5.PublishPacket`` writes."""
    retain, duplicate = flags
    topic = "m\u00e9ters/\u00fc"
    payload = b"z" * remaining
    packet_id = 65535 if qos else None
    ours = Codec(MQTT_5).publish(topic, payload, qos, packet_id, retain, duplicate, None)
    theirs = mqtt5.PublishPacket(
        topic, payload, qos=mqtt5.QoS(qos), packet_id=packet_id, retain=retain, duplicate=duplicate
    ).write()
    assert ours == theirs
