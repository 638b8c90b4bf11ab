"""Messages to and from data frames: every option round trips, every bad type is refused."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshbus import HEADER_LIMITS, DeliveryMode, Message
from meshbus._messages import DEFAULT_OPTIONS, MessageOptions
from meshbus.errors import ProtocolError
from meshbus.transports._codec import (
    BATCH_LIMIT,
    FRAME_MESSAGES,
    FrameTooLarge,
    decode_deliver,
    decode_deliver_batch,
    decode_flow_deliver,
    decode_publish,
    decode_publish_batch,
    encode_deliver,
    encode_deliver_batch,
    encode_flow_deliver,
    encode_publish,
    encode_publish_batch,
    message_to_wire,
    options_from_wire,
    options_to_wire,
    publish_options,
    trail_from_wire,
)
from meshbus.transports._framing import HEADER_LIMIT, FrameDecoder, FrameKind

K = FrameKind


def decode(frame: bytes) -> tuple[int, Any, bytes]:
    [decoded] = FrameDecoder(1 << 20).feed(frame)
    return decoded


texts = st.text(st.characters(codec="utf-8"), max_size=30)
topics = st.lists(st.text("abcxyz-_.é", min_size=1, max_size=5), min_size=1, max_size=4).map(
    "/".join
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=10,
)
header_maps = st.dictionaries(texts, json_values, max_size=5)
timestamps = (
    st.floats(min_value=0, max_value=4e9, allow_nan=False) | st.integers(0, 2**40) | st.none()
)


@st.composite
def messages(draw: st.DrawFn, *, message_id: int | None = None) -> Message:
    return Message(
        draw(topics),
        draw(st.binary(max_size=200)),
        delivery_mode=draw(st.sampled_from(DeliveryMode)),
        headers=draw(header_maps),
        eliding_eligible=draw(st.booleans()),
        reply_to=draw(st.none() | topics),
        correlation_id=draw(st.none() | texts),
        sender=draw(st.none() | texts),
        timestamp=draw(timestamps),
        discard_indication=draw(st.booleans()),
        redelivered=draw(st.booleans()),
        message_id=message_id,
        destination=draw(st.none() | texts),
        origin=draw(st.none() | st.tuples(texts, st.integers(0, 2**63 - 1))),
        hop_count=draw(st.integers(0, 20)),
        # On the sender's clock, read at NOW by both ends below.
        expires_at=draw(st.none() | st.floats(NOW, NOW + 1e6)),
    )


NOW = 1_700_000_000.0  # the clock time both ends of these round trips read


# --- publish (client to node) -----------------------------------------------------------------


def test_a_plain_publish_is_a_one_item_header() -> None:
    frame = encode_publish("a/b", b"body")
    assert decode(frame) == (K.PUBLISH, ["a/b"], b"body")
    assert decode_publish(["a/b"]) == ("a/b", None)


@settings(max_examples=150, deadline=None)
@given(
    topic=topics,
    payload=st.binary(max_size=300),
    headers=st.none() | header_maps,
    eliding=st.booleans(),
    reply_to=st.none() | topics,
    correlation_id=st.none() | texts,
)
def test_publish_round_trips(
    topic: str,
    payload: bytes,
    headers: dict[str, Any] | None,
    eliding: bool,
    reply_to: str | None,
    correlation_id: str | None,
) -> None:
    frame = encode_publish(topic, payload, headers, eliding, reply_to, correlation_id)
    kind, header, body = decode(frame)
    assert kind == K.PUBLISH
    assert body == payload
    got_topic, options = decode_publish(header)
    assert got_topic == topic
    if headers is None and not eliding and reply_to is None and correlation_id is None:
        assert options is None
        return
    assert options is not None
    assert options.get("h", {}) == (headers or {})
    assert options.get("e", False) is eliding
    assert options.get("r") == reply_to
    assert options.get("c") == correlation_id
    decoded = options_from_wire(options)
    assert decoded == MessageOptions(
        headers=headers or {},
        eliding_eligible=eliding,
        reply_to=reply_to,
        correlation_id=correlation_id,
    )


def test_publish_headers_that_are_not_json_are_a_type_error() -> None:
    with pytest.raises(TypeError, match="message headers must be JSON-serializable"):
        encode_publish("t", b"", {"k": b"bytes"})
    with pytest.raises(TypeError, match="JSON-serializable"):
        encode_publish("t", b"", {"k": {1, 2}})


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ([], "PUBLISH header has 0 items, not 1 or 2"),
        (["t", {}, {}], "PUBLISH header has 3 items"),
        ([1], "PUBLISH topic must be a string"),
        ([None], "PUBLISH topic must be a string"),
        ([["t"]], "PUBLISH topic must be a string"),
        ([True, {}], "PUBLISH topic must be a string"),
        (["t", None], "PUBLISH options must be an object"),
        (["t", []], "PUBLISH options must be an object"),
        (["t", "h"], "PUBLISH options must be an object"),
    ],
)
def test_bad_publish_headers(header: list[Any], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_publish(header)


# --- deliver (node to client) -----------------------------------------------------------------


def test_a_plain_delivery_is_a_three_item_header() -> None:
    message = Message("a/b", b"x", sender="c1", timestamp=12.5)
    assert message.options is DEFAULT_OPTIONS
    kind, header, payload = decode(encode_deliver(message))
    assert (kind, header, payload) == (K.DELIVER, ["a/b", "c1", 12.5], b"x")
    got = decode_deliver(header, payload)
    assert got == message
    assert got.options == DEFAULT_OPTIONS


@settings(max_examples=150, deadline=None)
@given(message=messages())
def test_deliver_round_trips_every_option(message: Message) -> None:
    # A time to live travels as the time left: both ends read the clock at NOW.
    kind, header, payload = decode(encode_deliver(message, now=NOW))
    assert kind == K.DELIVER
    plain = message.options is DEFAULT_OPTIONS and message.origin is None and not message.hop_count
    assert len(header) == (3 if plain else 4)
    got = decode_deliver(header, payload, NOW)
    assert got == message
    for name in (
        "topic",
        "payload",
        "sender",
        "timestamp",
        "delivery_mode",
        "headers",
        "eliding_eligible",
        "reply_to",
        "correlation_id",
        "discard_indication",
        "redelivered",
        "destination",
        "origin",
        "hop_count",
    ):
        assert getattr(got, name) == getattr(message, name), name
    assert got.message_id is None
    assert got.expires_at == message.expires_at


def test_a_time_to_live_travels_as_the_time_left() -> None:
    message = Message("t", b"x", origin=("n1", 7), hop_count=2, expires_at=1000.0)
    wire = message_to_wire(message, now=990.0)
    assert wire == {"o": ("n1", 7), "hc": 2, "x": 10.0}
    # The receiver's clock may read anything: the message has 10 s left there.
    received = orjson.loads(orjson.dumps(wire))
    options = options_from_wire(received, now=5.0)
    assert trail_from_wire(received) == (("n1", 7), 2)
    assert options.expires_at == 15.0
    # Past its time: nothing left, never a negative number.
    assert options_to_wire(message.options, now=2000.0)["x"] == 0


def test_a_link_batch_carries_each_messages_hop_count() -> None:
    plain = Message("a", b"1")
    crossed = Message("b", b"2", origin=("n1", 1), hop_count=1)
    [(_, header, payload)] = FrameDecoder(1 << 20).feed(
        encode_deliver_batch([plain, crossed, crossed], hops=[1, 2, 0])
    )
    got = decode_deliver_batch(header, payload)
    assert [m.hop_count for m in got] == [1, 2, 0]
    assert [m.origin for m in got] == [None, ("n1", 1), ("n1", 1)]
    # The same batch without hops: each message's own.
    [(_, header, payload)] = FrameDecoder(1 << 20).feed(encode_deliver_batch([plain, crossed]))
    assert [m.hop_count for m in decode_deliver_batch(header, payload)] == [0, 1]


def test_a_long_batch_is_cut_into_frames_of_at_most_frame_messages() -> None:
    n = 2 * FRAME_MESSAGES + 7
    messages = [Message(f"t/{i}", b"x", origin=("n1", i)) for i in range(n)]
    hops = [i % 3 for i in range(n)]
    frames = FrameDecoder(1 << 24).feed(encode_deliver_batch(messages, hops=hops))
    assert [len(header) for _, header, _ in frames] == [FRAME_MESSAGES, FRAME_MESSAGES, 7]
    got = [m for _, header, payload in frames for m in decode_deliver_batch(header, payload)]
    assert [(m.topic, m.origin, m.hop_count) for m in got] == [
        (m.topic, m.origin, hop) for m, hop in zip(messages, hops, strict=True)
    ]


def test_options_travel_as_short_keys_holding_only_what_differs() -> None:
    options = MessageOptions(
        DeliveryMode.PERSISTENT,
        {"k": [1, {"x": None}]},
        True,
        "reply/here",
        "corr-1",
        True,
        True,
        99,  # the message id never travels in the options
        "queue-a",
    )
    wire = options_to_wire(options)
    assert wire == {
        "m": "persistent",
        "h": {"k": [1, {"x": None}]},
        "e": True,
        "r": "reply/here",
        "c": "corr-1",
        "d": True,
        "rd": True,
        "q": "queue-a",
    }
    assert options_to_wire(DEFAULT_OPTIONS) == {}
    assert options_to_wire(MessageOptions(DeliveryMode.NON_PERSISTENT)) == {"m": "non-persistent"}
    assert options_from_wire(wire) == MessageOptions(
        DeliveryMode.PERSISTENT,
        {"k": [1, {"x": None}]},
        True,
        "reply/here",
        "corr-1",
        True,
        True,
        None,
        "queue-a",
    )
    assert options_from_wire(wire, 99) == options


def test_unknown_option_keys_are_ignored() -> None:
    assert options_from_wire({"zz": [1], "new": {"a": 1}}) == DEFAULT_OPTIONS
    message = decode_deliver(["t", None, 1, {"future": True, "e": True}], b"")
    assert message.eliding_eligible


def test_a_sender_may_be_null_and_a_timestamp_an_integer() -> None:
    message = decode_deliver(["t", None, 17], b"p")
    assert message.sender is None
    assert message.timestamp == 17


def test_a_timestamp_may_be_null() -> None:
    for message in (
        decode_deliver(["t", "s", None], b"p"),
        decode_deliver_batch([["t", "s", None, 1]], b"p")[0],
    ):
        assert message.timestamp is None
    _, header, payload = decode(encode_deliver(Message("t", b"p")))
    assert decode_deliver(header, payload).timestamp is None


# --- flow deliver -----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    flow=st.integers(min_value=0, max_value=2**63 - 1),
    message_id=st.integers(min_value=0, max_value=2**63 - 1),
)
def test_flow_deliver_round_trips_with_the_message_id(
    data: st.DataObject, flow: int, message_id: int
) -> None:
    message = data.draw(messages(message_id=message_id))
    kind, header, payload = decode(encode_flow_deliver(flow, message_id, message, NOW))
    assert kind == K.FLOW_DELIVER
    assert len(header) == 6
    got_flow, got = decode_flow_deliver(header, payload, NOW)
    assert got_flow == flow
    assert got.message_id == message_id
    assert got == message


def test_the_flow_message_id_is_the_one_in_the_frame() -> None:
    message = Message("q/t", b"x", delivery_mode=DeliveryMode.PERSISTENT, message_id=5)
    _, header, payload = decode(encode_flow_deliver(3, 8, message))
    flow, got = decode_flow_deliver(header, payload)
    assert (flow, got.message_id) == (3, 8)
    assert got.delivery_mode is DeliveryMode.PERSISTENT


# --- type errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ([], "DELIVER header has 0 items, not 3 or 4"),
        (["t", None], "DELIVER header has 2 items"),
        (["t", None, 1, {}, {}], "DELIVER header has 5 items"),
        ([1, None, 1.0], "message topic must be a string"),
        ([None, None, 1.0], "message topic must be a string"),
        (["t", 5, 1.0], "message sender must be a string or null"),
        (["t", ["s"], 1.0], "message sender must be a string or null"),
        (["t", True, 1.0], "message sender must be a string or null"),
        (["t", None, "1"], "message timestamp must be a number"),
        (["t", None, True], "message timestamp must be a number"),
        (["t", None, [1.0]], "message timestamp must be a number"),
        (["t", None, 1.0, None], "message options must be an object"),
        (["t", None, 1.0, []], "message options must be an object"),
        (["t", None, 1.0, "m"], "message options must be an object"),
    ],
)
def test_bad_deliver_headers(header: list[Any], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_deliver(header, b"")


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        ({"m": "sometimes"}, "unknown delivery mode 'sometimes'"),
        ({"m": None}, "unknown delivery mode None"),
        ({"m": 1}, "unknown delivery mode 1"),
        ({"m": True}, "unknown delivery mode True"),
        ({"m": ["direct"]}, r"unknown delivery mode \['direct'\]"),  # unhashable
        ({"m": {"a": 1}}, "unknown delivery mode"),  # unhashable
        ({"m": "DIRECT"}, "unknown delivery mode 'DIRECT'"),
        ({"h": []}, r"message headers has the wrong type \(list\)"),
        ({"h": None}, r"message headers has the wrong type \(NoneType\)"),
        ({"h": "k=v"}, r"message headers has the wrong type \(str\)"),
        ({"h": True}, r"message headers has the wrong type \(bool\)"),
        ({"r": 1}, r"message reply_to has the wrong type \(int\)"),
        ({"r": True}, r"message reply_to has the wrong type \(bool\)"),
        ({"r": ["t"]}, "message reply_to has the wrong type"),
        ({"c": 1.5}, r"message correlation_id has the wrong type \(float\)"),
        ({"c": {}}, "message correlation_id has the wrong type"),
        ({"q": 7}, r"message destination has the wrong type \(int\)"),
        ({"e": 1}, r"message eliding flag has the wrong type \(int\)"),
        ({"e": "yes"}, "message eliding flag has the wrong type"),
        ({"e": None}, "message eliding flag has the wrong type"),
        ({"d": 0}, r"message discard indication has the wrong type \(int\)"),
        ({"d": "true"}, "message discard indication has the wrong type"),
        ({"rd": 1}, r"message redelivered flag has the wrong type \(int\)"),
        ({"rd": []}, "message redelivered flag has the wrong type"),
        ({"o": "n1"}, r"message origin must be \[node id, message id\]"),
        ({"o": ["n1"]}, "message origin must be"),
        ({"o": ["n1", "7"]}, "message origin must be"),
        ({"o": [1, 7]}, "message origin must be"),
        ({"o": ["n1", True]}, "message origin must be"),
        ({"o": ["n1", 7, 8]}, "message origin must be"),
        # An origin and a hop count is what links mostly carry: a quicker path decodes it.
        ({"o": ["n1", 7], "hc": -1}, "message hop count must not be negative"),
        ({"o": ["n1", 7], "hc": True}, "message hop count has the wrong type"),
        ({"o": ["n1", 7], "hc": 1.0}, r"message hop count has the wrong type \(float\)"),
        ({"o": ["n1", "7"], "hc": 1}, "message origin must be"),
        ({"o": ["n1", 7], "e": 1}, "message eliding flag has the wrong type"),
        ({"hc": "1"}, r"message hop count has the wrong type \(str\)"),
        ({"hc": True}, "message hop count has the wrong type"),
        ({"hc": -1}, "message hop count must not be negative"),
        ({"x": "soon"}, r"message time to live has the wrong type \(str\)"),
        ({"x": -1}, "message time to live must be a finite number"),
        ({"x": 1e400}, "message time to live must be a finite number"),
    ],
)
def test_bad_options(wire: dict[str, Any], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):  # what decoders read of the wire keys
        (trail_from_wire(wire), options_from_wire(wire))
    with pytest.raises(ProtocolError, match=match):
        decode_deliver(["t", "s", 1.0, wire], b"")
    with pytest.raises(ProtocolError, match=match):
        decode_flow_deliver([1, 2, "t", "s", 1.0, wire], b"")
    with pytest.raises(ProtocolError, match=match):
        decode_deliver_batch([["t", "s", 1.0, 0, wire]], b"")


@pytest.mark.parametrize(
    "wire", [{"o": ["n1", 7]}, {"o": ["n1", 7], "hc": 0}, {"o": ["n1", 7], "hc": 3}]
)
def test_a_batch_decodes_an_origin_and_hop_count_as_options_from_wire_does(
    wire: dict[str, Any],
) -> None:
    (message,) = decode_deliver_batch([["t", "s", 1.0, 1, wire]], b"x")
    assert message.options == options_from_wire(wire)
    assert message.size == 1


@pytest.mark.parametrize("wire", [None, [], "x", 1, True])
def test_options_must_be_an_object(wire: Any) -> None:
    with pytest.raises(ProtocolError, match="message options must be an object"):
        options_from_wire(wire)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ([], "FLOW_DELIVER header has 0 items, not 6"),
        ([1, 2, "t", None, 1.0], "FLOW_DELIVER header has 5 items, not 6"),
        ([1, 2, "t", None, 1.0, {}, {}], "FLOW_DELIVER header has 7 items"),
        (["1", 2, "t", None, 1.0, {}], r"message flow has the wrong type \(str\)"),
        ([True, 2, "t", None, 1.0, {}], r"message flow has the wrong type \(bool\)"),
        ([1.0, 2, "t", None, 1.0, {}], r"message flow has the wrong type \(float\)"),
        ([None, 2, "t", None, 1.0, {}], "message flow has the wrong type"),
        ([1, "2", "t", None, 1.0, {}], r"message id has the wrong type \(str\)"),
        ([1, False, "t", None, 1.0, {}], r"message id has the wrong type \(bool\)"),
        ([1, 2.5, "t", None, 1.0, {}], r"message id has the wrong type \(float\)"),
        ([1, [2], "t", None, 1.0, {}], "message id has the wrong type"),
        ([1, 2, 3, None, 1.0, {}], "message topic must be a string"),
        ([1, 2, "t", 4, 1.0, {}], "message sender must be a string or null"),
        ([1, 2, "t", None, "now", {}], "message timestamp must be a number"),
        ([1, 2, "t", None, 1.0, None], "message options must be an object"),
        ([1, 2, "t", None, 1.0, [["m", "direct"]]], "message options must be an object"),
    ],
)
def test_bad_flow_deliver_headers(header: list[Any], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_flow_deliver(header, b"")


wire_options = st.dictionaries(
    st.sampled_from(["m", "h", "e", "r", "c", "d", "rd", "q", "x"]),
    json_values | st.sampled_from([m.value for m in DeliveryMode]),
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(
    header=st.lists(
        json_values | wire_options | topics | st.integers(min_value=-1, max_value=12), max_size=7
    ),
    payload=st.binary(max_size=10),
)
def test_any_array_header_decodes_or_is_a_protocol_error(header: list[Any], payload: bytes) -> None:
    decoders: list[Any] = [
        lambda: decode_publish(header),
        lambda: decode_deliver(header, payload),
        lambda: decode_flow_deliver(header, payload),
        lambda: decode_publish_batch(header, payload),
        lambda: decode_deliver_batch(header, payload),
        lambda: decode_publish_batch([header], payload),
        lambda: decode_deliver_batch([header], payload),
    ]
    for decoder in decoders:
        with contextlib.suppress(ProtocolError):
            decoder()


# --- batches ----------------------------------------------------------------------------------

publish_entries = st.lists(
    st.tuples(
        topics,
        st.binary(max_size=50),
        st.none()
        | st.builds(
            publish_options,
            st.none() | header_maps,
            st.booleans(),
            st.none() | topics,
            st.none() | texts,
        ),
    ),
    max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(entries=publish_entries)
def test_publish_batch_round_trips(entries: list[tuple[str, bytes, dict[str, Any] | None]]) -> None:
    kind, header, payload = decode(encode_publish_batch(entries))
    assert kind == K.PUBLISH_BATCH
    assert payload == b"".join(body for _, body, _ in entries)
    assert decode_publish_batch(header, payload) == entries


def test_publish_options_are_none_for_the_defaults() -> None:
    assert publish_options(None, False, None, None) is None
    assert publish_options({}, False, None, None) == {}
    assert publish_options({"k": 1}, True, "r", "c") == {
        "h": {"k": 1},
        "e": True,
        "r": "r",
        "c": "c",
    }


def test_publish_batch_headers_that_are_not_json_are_a_type_error() -> None:
    with pytest.raises(TypeError, match="message headers must be JSON-serializable"):
        encode_publish_batch([("t", b"", {"h": {"k": b"bytes"}})])


@settings(max_examples=100, deadline=None)
@given(batch=st.lists(messages(), min_size=1, max_size=6))
def test_deliver_batch_round_trips_every_option(batch: list[Message]) -> None:
    kind, header, payload = decode(encode_deliver_batch(batch, now=NOW))
    assert kind == K.DELIVER_BATCH
    assert decode_deliver_batch(header, payload, NOW) == batch


@pytest.mark.parametrize(
    ("header", "payload", "match"),
    [
        ([["t"]], b"", "PUBLISH_BATCH entry must be"),
        ([["t", 0, None, 1]], b"", "PUBLISH_BATCH entry must be"),
        (["t"], b"", "PUBLISH_BATCH entry must be"),
        ([{"t": 0}], b"", "PUBLISH_BATCH entry must be"),
        ([[1, 0]], b"", "malformed topic or size"),
        ([["t", "0"]], b"", "malformed topic or size"),
        ([["t", True]], b"x", "malformed topic or size"),
        ([["t", -1]], b"", "malformed topic or size"),
        ([["t", 1.0]], b"x", "malformed topic or size"),
        ([["t", 2]], b"x", "sizes exceed the payload"),
        ([["t", 1], ["u", 1]], b"x", "sizes exceed the payload"),
        ([["t", 1]], b"xy", "sizes do not add up to the payload"),
        ([], b"x", "sizes do not add up to the payload"),
        ([["t", 0, []]], b"", "PUBLISH_BATCH options must be an object"),
        ([["t", 0, "h"]], b"", "PUBLISH_BATCH options must be an object"),
    ],
)
def test_bad_publish_batches(header: list[Any], payload: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_publish_batch(header, payload)


@pytest.mark.parametrize(
    ("header", "payload", "match"),
    [
        (["t"], b"", "DELIVER_BATCH entry must be an array"),
        ([{"t": 1}], b"", "DELIVER_BATCH entry must be an array"),
        ([["t", None, 1.0]], b"", "DELIVER_BATCH entry has 3 items, not 4 or 5"),
        ([["t", None, 1.0, 0, {}, 0]], b"", "DELIVER_BATCH entry has 6 items"),
        ([["t", None, 1.0, "0"]], b"", "DELIVER_BATCH entry has a bad size"),
        ([["t", None, 1.0, True]], b"x", "DELIVER_BATCH entry has a bad size"),
        ([["t", None, 1.0, -1]], b"", "DELIVER_BATCH entry has a bad size"),
        ([["t", None, 1.0, 2]], b"x", "DELIVER_BATCH entry has a bad size"),
        ([[1, None, 1.0, 0]], b"", "malformed topic, sender or timestamp"),
        ([["t", 1, 1.0, 0]], b"", "malformed topic, sender or timestamp"),
        ([["t", None, "1", 0]], b"", "malformed topic, sender or timestamp"),
        ([["t", None, False, 0]], b"", "malformed topic, sender or timestamp"),
        ([["t", None, 1.0, 0, None]], b"", "message options must be an object"),
        ([["t", None, 1.0, 0, {"m": []}]], b"", "unknown delivery mode"),
        ([["t", None, 1.0, 0, {"rd": 1}]], b"", "redelivered flag has the wrong type"),
        ([["t", None, 1.0, 1]], b"xy", "sizes do not add up to the payload"),
        ([], b"x", "sizes do not add up to the payload"),
    ],
)
def test_bad_deliver_batches(header: list[Any], payload: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_deliver_batch(header, payload)


# --- frame limits ---------------------------------------------------------------------------


def delivered(frames: list[tuple[int, Any, bytes]]) -> list[Message]:
    out: list[Message] = []
    for kind, header, payload in frames:
        assert kind == K.DELIVER_BATCH
        out += decode_deliver_batch(header, payload)
    return out


def test_batches_larger_than_the_peer_reads_are_written_as_frames_that_fit() -> None:
    batch = [Message(f"t/{i}", bytes(1000), headers={"n": i}) for i in range(50)]
    frames = FrameDecoder(10_000).feed(encode_deliver_batch(batch, 10_000))  # refuses more
    assert len(frames) > 5
    assert delivered(frames) == batch
    entries: list[tuple[str, bytes, dict[str, Any] | None]] = [
        (f"t/{i}", bytes(1000), None) for i in range(50)
    ]
    frames = FrameDecoder(10_000).feed(encode_publish_batch(entries, 10_000))
    assert len(frames) > 5
    assert [e for _, h, p in frames for e in decode_publish_batch(h, p)] == entries


def test_batch_headers_stay_within_the_header_limit() -> None:
    topic = "x" * 245 + "/long"
    batch = [Message(topic, b"") for _ in range(5_000)]  # 1.3 MB of topics
    frames = FrameDecoder(1 << 30).feed(encode_deliver_batch(batch))  # refuses long headers
    assert len(frames) > 1
    assert delivered(frames) == batch
    entries: list[tuple[str, bytes, dict[str, Any] | None]] = [(topic, b"", None)] * 5_000
    frames = FrameDecoder(1 << 30).feed(encode_publish_batch(entries))
    assert [e for _, h, p in frames for e in decode_publish_batch(h, p)] == entries


def test_a_publish_batch_holds_a_bounded_number_of_messages() -> None:
    """A node decodes a PUBLISH_BATCH in one step, so it takes at most
    BATCH_LIMIT in one (116,000 tiny ones fit in a header's 1 MiB and took
    70 ms to decode); the encoder never writes more, in frames a node reads."""
    over = BATCH_LIMIT + 1
    with pytest.raises(ProtocolError, match=f"holds {over} messages, more than the limit"):
        decode_publish_batch([["t", 0]] * over, b"")
    assert len(decode_publish_batch([["t", 0]] * BATCH_LIMIT, b"")) == over - 1
    entries: list[tuple[str, bytes, dict[str, Any] | None]] = [("t", b"x", None)] * over
    frames = FrameDecoder(1 << 30).feed(encode_publish_batch(entries))
    assert len(frames) == 2
    assert [e for _, h, p in frames for e in decode_publish_batch(h, p)] == entries


def test_a_message_too_large_for_the_peer_is_refused_not_written() -> None:
    big = Message("t", bytes(2000))
    with pytest.raises(FrameTooLarge) as caught:
        encode_deliver(big, 1000)
    assert caught.value.limit == 1000
    assert caught.value.size == len(encode_deliver(big))
    with pytest.raises(FrameTooLarge):
        encode_deliver_batch([Message("t", b"small"), big], 1000)
    with pytest.raises(FrameTooLarge):
        encode_publish_batch([("t", b"small", None), ("t", bytes(2000), None)], 1000)
    # A header longer than any frame may carry is refused whatever the frame limit.
    with pytest.raises(FrameTooLarge):
        encode_deliver(Message("t", b"", headers={"k": "v" * HEADER_LIMIT}))


def test_options_read_from_the_wire_carry_what_their_headers_hold() -> None:
    headers = {"k": "v" * 100, "n": [1, 2, {}]}
    options = options_from_wire({"h": headers, "r": "a/b", "c": "42"})
    assert options.size == HEADER_LIMITS.check(headers, "a/b", "42") > 100
    assert options_from_wire({"e": True}).size == 0


def nested_value(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_batch_options_may_nest_as_deep_as_message_headers_and_no_deeper() -> None:
    # A batch's own structure is flat; only an entry's options can nest, so the batch
    # decoders check them (the frame decoder leaves batch frames to them).
    depth = HEADER_LIMITS.max_depth
    at_limit = {"h": {"k": nested_value(depth - 1)}}  # headers `depth` levels deep
    too_deep = {"h": {"k": nested_value(depth)}}
    assert decode_publish_batch([["t", 0, at_limit]], b"")[0][2] == at_limit
    for options in (too_deep, {"x": nested_value(depth + 1)}):
        with pytest.raises(ProtocolError, match="nested deeper than"):
            decode_publish_batch([["t", 0, options]], b"")
    assert decode_deliver_batch([["t", None, 0, 0, at_limit]], b"")[0].headers == at_limit["h"]
    with pytest.raises(ProtocolError, match="nested deeper than"):
        decode_deliver_batch([["t", None, 0, 0, too_deep]], b"")
    # The frame decoder checks any other frame as a whole (a PUBLISH wraps two levels).
    head = orjson.dumps(["t", {"h": {"k": nested_value(depth + 1)}}])
    frame = struct.pack("!IBI", 5 + len(head), K.PUBLISH, len(head)) + head
    with pytest.raises(ProtocolError, match="nested deeper than"):
        FrameDecoder(1 << 20).feed(frame)
