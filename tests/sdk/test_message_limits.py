"""What a message may carry and what it costs (SPEC 2, 4 and 10): header limits applied
where messages come in, and a message's whole size counted against egress and spool limits."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshbus import (
    HEADER_LIMITS,
    ClientProfile,
    ConfigurationError,
    HeaderLimits,
    Message,
    Node,
    PublishRejectedError,
)
from meshbus.plugins.guaranteed._service import GuaranteedService


def service(node: Node) -> GuaranteedService:
    svc = node.guaranteed
    assert isinstance(svc, GuaranteedService)
    return svc


def slow_user(node: Node, name: str, **limits: int) -> None:
    node.vpn().add_client_profile(ClientProfile(name, **limits))
    node.vpn().add_user(name, client_profile=name)


def parsed(encoded: bytes) -> dict[str, Any]:
    """Fresh header objects, as a node's wire ingress makes them for every message."""
    value = orjson.loads(encoded)
    assert isinstance(value, dict)
    return value


# --- header limits -----------------------------------------------------------------------


def exactly(size: int) -> dict[str, str]:
    """Headers whose JSON is ``size`` bytes long."""
    headers = {"k": "v" * (size - 8)}
    assert len(orjson.dumps(headers)) == size
    return headers


def nested(depth: int) -> dict[str, Any]:
    """Headers ``depth`` levels deep, the headers object itself being the first."""
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return {"k": value}


def test_header_limits_are_validated() -> None:
    assert (HEADER_LIMITS.max_bytes, HEADER_LIMITS.max_depth) == (64 * 1024, 32)
    for bad in ({"max_bytes": 0}, {"max_depth": 0}, {"max_depth": 251}, {"max_bytes": True}):
        with pytest.raises(ConfigurationError):
            HeaderLimits(**bad)  # type: ignore[arg-type]


def test_headers_at_the_limits_pass_and_one_more_is_refused() -> None:
    limits = HeaderLimits(max_bytes=1_000, max_depth=5)
    assert limits.check(exactly(1_000)) > 1_000
    with pytest.raises(PublishRejectedError) as caught:
        limits.check(exactly(1_001))
    assert (caught.value.reason, caught.value.limit, caught.value.size) == (
        "headers-too-large",
        1_000,
        1_001,
    )
    assert limits.check(nested(5)) > 0
    with pytest.raises(PublishRejectedError) as caught:
        limits.check(nested(6))
    assert (caught.value.reason, caught.value.limit, caught.value.size) == (
        "headers-too-deep",
        5,
        6,
    )
    # Brackets inside strings do not make headers deep.
    assert limits.check({"k": "[[[[[[[[{{{{{{{{"}) > 0


def test_reply_to_and_correlation_id_count_with_the_headers() -> None:
    limits = HeaderLimits(max_bytes=1_000)
    assert limits.check(exactly(900), "r" * 48, "c" * 48) > 0  # 900 + 50 + 50 bytes
    with pytest.raises(PublishRejectedError) as caught:
        limits.check(exactly(900), "r" * 48, "c" * 49)
    assert (caught.value.reason, caught.value.size) == ("headers-too-large", 1_001)
    with pytest.raises(PublishRejectedError):
        limits.check(None, "\x01" * 200)  # JSON writes a control character in 6 bytes
    assert limits.check(None, "é" * 400) > 0  # 2 bytes each in UTF-8
    with pytest.raises(TypeError, match="must be a str"):
        limits.check(None, 42)  # type: ignore[arg-type]


def test_headers_deeper_than_json_can_write_or_cyclic_are_too_deep() -> None:
    with pytest.raises(PublishRejectedError) as caught:
        HEADER_LIMITS.check(nested(300))
    assert (caught.value.reason, caught.value.size) == ("headers-too-deep", 300)
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(PublishRejectedError) as caught:
        HEADER_LIMITS.check({"k": cycle})
    assert (caught.value.reason, caught.value.size) == ("headers-too-deep", None)


def test_values_json_cannot_hold_are_measured_by_their_length() -> None:
    small = HEADER_LIMITS.check({"k": b"x" * 10})
    assert HEADER_LIMITS.check({"k": b"x" * 10_000}) >= small + 9_990
    with pytest.raises(PublishRejectedError, match="headers-too-large"):
        HEADER_LIMITS.check({"k": bytes(HEADER_LIMITS.max_bytes)})
    assert HEADER_LIMITS.check({1: {2, 3}}) > 0  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="JSON-serializable"):
        HEADER_LIMITS.check({"k": 2**70})


def deep_size(value: Any) -> int:
    """Bytes of every object reachable from ``value``, each counted once (singletons not)."""
    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen or item is None or type(item) is bool:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if type(item) is dict:
            stack += [*item.keys(), *item.values()]
        elif type(item) is list:
            stack += item
    return total


json_text = st.text(max_size=6).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text
    | st.text(alphabet=st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF), max_size=3),
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(json_text, inner, max_size=12),
    max_leaves=30,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(json_text, json_values, min_size=1, max_size=10))
def test_the_memory_estimate_covers_headers_read_from_json(headers: dict[str, Any]) -> None:
    parsed = orjson.loads(orjson.dumps(headers))
    assert HEADER_LIMITS.check(parsed) >= deep_size(parsed)


@pytest.mark.parametrize(
    "item",
    [b"{}", b"[]", b"[1.5]", b'{"":1.5}', b'{"":0}', b"1.5", b"1000", b'"\xf0\x9f\x98\x80"'],
)
def test_the_memory_estimate_covers_the_costliest_shapes(item: bytes) -> None:
    encoded = b'{"k":[' + b",".join([item] * 2_000) + b"]}"
    parsed = orjson.loads(encoded)
    held = HEADER_LIMITS.check(parsed)
    assert deep_size(parsed) <= held <= 100 * len(encoded)


async def test_sessions_refuse_headers_over_the_limits_and_change_nothing(
    meshbus_node: Node,
) -> None:
    svc = service(meshbus_node)
    svc.create_queue("q", subscriptions=["h/>"])
    watcher = meshbus_node.connect()
    watcher.subscribe("h/>")
    session = meshbus_node.connect()
    too_big = exactly(HEADER_LIMITS.max_bytes + 1)
    too_deep = nested(HEADER_LIMITS.max_depth + 1)
    for headers, reason in ((too_big, "headers-too-large"), (too_deep, "headers-too-deep")):
        with pytest.raises(PublishRejectedError, match=reason):
            session.publish("h/1", b"x", headers=headers)
        with pytest.raises(PublishRejectedError, match=reason):
            await session.send("h/2", b"x", headers=headers)
        with pytest.raises(PublishRejectedError, match=reason):
            await session.send_many([("h/3", b"x")], headers=headers)
        with pytest.raises(PublishRejectedError, match=reason):
            await session.send_to_queue("q", b"x", headers=headers)
    with pytest.raises(PublishRejectedError, match="headers-too-large"):
        session.publish("h/4", b"x", reply_to="r" * HEADER_LIMITS.max_bytes)
    assert watcher.receive_nowait() is None
    assert svc.store.stats("default/q").messages == 0
    # At the limits, everything goes through.
    at_limit = exactly(HEADER_LIMITS.max_bytes)
    session.publish("h/5", b"x", headers=at_limit)
    await session.send_to_queue("q", b"x", headers=nested(HEADER_LIMITS.max_depth))
    [message] = iter(watcher.receive_nowait, None)
    assert (message.topic, message.headers) == ("h/5", at_limit)
    assert message.size == 1 + HEADER_LIMITS.check(at_limit)
    with anyio.fail_after(2):  # h/5 matched the queue too, spooled in the background
        while svc.store.stats("default/q").messages < 2:
            await anyio.sleep(0.01)


def test_a_message_size_is_its_payload_plus_its_headers_as_held() -> None:
    assert Message("t", b"abc").size == 3
    headers = {"trace": "abc123", "n": [1, 2, 3]}
    message = Message("t", b"abc", headers=headers)
    assert message.size >= 3 + len(orjson.dumps(headers))
    assert message.evolve(discard_indication=True).size == message.size
    assert message.evolve(headers={}).size == 3
    with_reply = Message("t", b"abc", reply_to="reply/here", correlation_id="42")
    assert with_reply.size > 3 + len("reply/here") + len("42")


async def test_a_published_message_has_the_size_its_constructor_gives() -> None:
    # Session.publish works sizes out itself (texts_size() of a request inlined, the
    # sum make_message() makes): they must agree with the message's own.
    cases: list[dict[str, Any]] = [
        {},
        {"eliding_eligible": True},
        {"reply_to": "reply/here"},
        {"reply_to": "r" * 5_000},  # beyond the short-text fast path
        {"reply_to": "reply/here", "correlation_id": "42"},
        {"correlation_id": "42"},
        {"headers": {"trace": "abc123", "n": [1, 2, 3]}, "reply_to": "reply/here"},
    ]
    async with Node() as node:
        consumer = node.connect()
        consumer.subscribe("t")
        publisher = node.connect()
        for options in cases:
            publisher.publish("t", b"abc", **options)
            received = consumer.receive_nowait()
            assert received is not None
            assert received.size == Message("t", b"abc", **options).size, options


# --- a message's whole size against the limits ---------------------------------------------


async def test_a_slow_consumer_counts_headers_against_its_byte_limit(meshbus_node: Node) -> None:
    limit = 1024 * 1024
    slow_user(meshbus_node, "slow", egress_max_bytes=limit)
    slow = meshbus_node.connect(username="slow")
    slow.subscribe("h/>")
    publisher = meshbus_node.connect()
    encoded = orjson.dumps({"k": "v" * 50_000})
    for i in range(100):  # 5 MB of headers, empty payloads
        publisher.publish(f"h/{i}", b"", headers=parsed(encoded))
    stats = slow.statistics()
    assert stats.discarded > 0
    assert stats.egress_messages == 100 - stats.discarded
    assert stats.egress_messages * len(encoded) <= stats.egress_bytes <= limit
    held = list(iter(slow.receive_nowait, None))
    assert sum(m.size for m in held) == stats.egress_bytes
    assert held[0].discard_indication
    assert slow.statistics().egress_bytes == 0


async def test_the_memory_a_slow_consumer_holds_stays_within_its_byte_limit(
    meshbus_node: Node,
) -> None:
    # Empty objects cost the most memory per byte of JSON (about 24 times).
    limit = 2 * 1024 * 1024
    slow_user(meshbus_node, "slow", egress_max_bytes=limit)
    slow = meshbus_node.connect(username="slow")
    slow.subscribe("h/>")
    publisher = meshbus_node.connect()
    encoded = orjson.dumps({"k": [{} for _ in range(6_000)]})
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(60):  # about 20 MiB of parsed headers in all
            publisher.publish(f"h/{i}", b"", headers=parsed(encoded))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert slow.statistics().discarded > 0
    assert grown <= limit + 256 * 1024


async def test_max_message_size_counts_headers(meshbus_node: Node) -> None:
    svc = service(meshbus_node)
    svc.create_queue("small", subscriptions=["s/>"], max_message_size=1_000)
    session = meshbus_node.connect()
    headers = {"k": "v" * 2_000}
    with pytest.raises(PublishRejectedError) as caught:
        await session.send_to_queue("small", b"x" * 100, headers=headers)
    assert (caught.value.reason, caught.value.limit) == ("too-large", 1_000)
    assert caught.value.size is not None
    assert caught.value.size > 2_100
    with pytest.raises(PublishRejectedError) as caught:
        await session.send("s/1", b"x" * 100, headers=headers)
    assert caught.value.reason == "too-large"
    [result] = await session.send_many([("s/2", b"x" * 100)], headers=headers)
    assert isinstance(result, PublishRejectedError)
    assert result.reason == "too-large"
    session.publish("s/3", b"x" * 100, headers=headers)  # direct: the queue discards it
    await session.send("s/4", b"x" * 100, headers={"k": "v"})
    assert svc.store.stats("default/small").messages == 1
    assert svc.queue("small").discarded == 1
