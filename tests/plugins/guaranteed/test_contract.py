"""The SpoolStore contract (SPEC 4), held against every store (see conftest.make_store)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from meshbus import StateError
from meshbus.plugins.guaranteed._store import (
    EndpointStats,
    NewMessage,
    SpoolEntry,
    SpoolStore,
    StoredMessage,
)

from .conftest import StoreFactory


def ids_of(page: list[SpoolEntry]) -> list[int]:
    return [entry.message.id for entry in page]


async def read_all(store: SpoolStore, endpoint: str, page: int = 1000) -> list[SpoolEntry]:
    entries: list[SpoolEntry] = []
    after = 0
    while chunk := await store.read(endpoint, after, page):
        entries += chunk
        after = chunk[-1].message.id
    return entries


async def test_put_then_read_gives_the_message_back_exactly(store: SpoolStore) -> None:
    headers = {"user": "ada", "n": 3, "nested": {"list": [1, 2.5, None, True]}, "é": "ü"}
    first = await store.put(
        "orders/eu/1",
        b"\x00binary\xff",
        endpoints=["q1"],
        headers=headers,
        persistent=True,
        expires_at=1234.5,
        published_at=1000.25,
    )
    second = await store.put("orders/eu/2", b"", endpoints=["q1"], persistent=False)
    assert second > first > 0
    (a, b) = await store.read("q1")
    assert a == SpoolEntry(
        StoredMessage(first, "orders/eu/1", b"\x00binary\xff", headers, True, 1234.5, 1000.25), 0
    )
    assert not a.redelivered
    assert (b.message.topic, b.message.payload, b.message.headers) == ("orders/eu/2", b"", {})
    assert (b.message.persistent, b.message.expires_at) == (False, None)
    assert isinstance(b.message.published_at, float)
    assert await store.read("other") == []


async def test_headers_come_back_as_json_would_give_them(store: SpoolStore) -> None:
    original: dict[str, Any] = {"pair": (1, 2)}
    await store.put("t", b"x", endpoints=["q"], headers=original)
    original["pair"] = "mutated after the put"
    (entry,) = await store.read("q")
    assert entry.message.headers == {"pair": [1, 2]}


async def test_one_copy_for_all_endpoints_deleted_with_the_last_reference(
    store: SpoolStore,
) -> None:
    message_id = await store.put("t", b"shared", endpoints=["q1", "q2", "q3"])
    assert [store.stats(q) for q in ("q1", "q2", "q3")] == [EndpointStats(1, 6)] * 3
    pages = [await store.read(q) for q in ("q1", "q2", "q3")]
    assert pages[0] == pages[1] == pages[2]
    assert await store.ack("q1", [message_id]) == 1
    assert await store.ack("q2", [message_id]) == 1
    await store.check()  # refcount now 1, the message still stored once
    (entry,) = await store.read("q3")
    assert entry.message.payload == b"shared"
    assert store.endpoints() == ["q3"]
    assert await store.ack("q3", [message_id]) == 1
    assert store.endpoints() == []
    assert [await store.read(q) for q in ("q1", "q2", "q3")] == [[], [], []]
    await store.check()  # no message row without a reference is left behind


async def test_ack_is_idempotent_and_ignores_what_the_endpoint_does_not_hold(
    store: SpoolStore,
) -> None:
    (a, b) = await store.put_many([NewMessage("t", b"a", ["q1"]), NewMessage("t", b"b", ["q2"])])
    assert await store.ack("q1", [b, a, a, 999]) == 1
    assert await store.ack("q1", [a]) == 0
    assert await store.ack("nobody", [b]) == 0
    assert await store.ack("q2", []) == 0
    assert ids_of(await store.read("q2")) == [b]


async def test_each_endpoint_lists_its_messages_in_put_order(store: SpoolStore) -> None:
    expected: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    for i in range(60):
        names = [n for j, n in enumerate("abc") if (i >> j) & 1 or i % 7 == j]
        if not names:
            continue
        message_id = await store.put(f"t/{i}", str(i).encode(), endpoints=names)
        for name in names:
            expected[name].append(message_id)
    for name, ids in expected.items():
        entries = await read_all(store, name, page=7)
        assert ids_of(entries) == ids
        assert ids == sorted(ids)


async def test_paging_with_after_id_limit_and_max_bytes(store: SpoolStore) -> None:
    ids = await store.put_many([NewMessage("t", bytes(i % 50), ["q"]) for i in range(500)])
    assert ids == sorted(ids)
    assert len(set(ids)) == 500
    assert ids_of(await read_all(store, "q", page=64)) == ids
    assert ids_of(await store.read("q", ids[99], 3)) == ids[100:103]
    assert await store.read("q", ids[-1]) == []
    # max_bytes: the page stops at the message reaching it (payload sizes 10, 11, 12...)
    page = await store.read("q", ids[9], 100, max_bytes=30)
    assert [len(e.message.payload) for e in page] == [10, 11, 12]
    # ...and always returns at least one message
    assert ids_of(await store.read("q", ids[48], 100, max_bytes=1)) == [ids[49]]
    # acked messages leave gaps that paging steps over
    await store.ack("q", ids[100:400])
    assert ids_of(await read_all(store, "q", page=50)) == ids[:100] + ids[400:]


async def test_mark_delivered_counts_per_endpoint(store: SpoolStore) -> None:
    a, b = await store.put_many(
        [NewMessage("t", b"a", ["q1", "q2"]), NewMessage("t", b"b", ["q1"])]
    )
    assert await store.mark_delivered("q1", [a, b]) == 2
    assert await store.mark_delivered("q1", [a, 12345]) == 1
    assert await store.mark_delivered("q3", [a]) == 0
    assert [(e.message.id, e.delivery_count) for e in await store.read("q1")] == [(a, 2), (b, 1)]
    assert [e.redelivered for e in await store.read("q1")] == [True, True]
    assert [(e.message.id, e.delivery_count) for e in await store.read("q2")] == [(a, 0)]


async def test_stats_and_endpoints_follow_puts_acks_and_drops(store: SpoolStore) -> None:
    assert store.stats("q1") == EndpointStats(0, 0)
    assert store.endpoints() == []
    a = await store.put("t", b"12345", endpoints=["q1", "q2"])
    b = await store.put("t", b"123", endpoints=["q1"])
    assert store.stats("q1") == EndpointStats(2, 8)
    assert store.stats("q2") == EndpointStats(1, 5)
    assert store.endpoints() == ["q1", "q2"]
    await store.ack("q1", [a])
    assert store.stats("q1") == EndpointStats(1, 3)
    assert store.stats("q2") == EndpointStats(1, 5)
    await store.ack("q1", [b])
    assert store.stats("q1") == EndpointStats(0, 0)
    assert store.endpoints() == ["q2"]


async def test_drop_endpoint_keeps_what_others_hold(store: SpoolStore) -> None:
    a, b, c = await store.put_many(
        [
            NewMessage("t", b"a", ["gone", "kept"]),
            NewMessage("t", b"b", ["gone"]),
            NewMessage("t", b"c", ["kept"]),
        ]
    )
    assert await store.drop_endpoint("gone") == 2
    assert await store.drop_endpoint("gone") == 0
    assert await store.drop_endpoint("never-was") == 0
    assert store.stats("gone") == EndpointStats(0, 0)
    assert store.endpoints() == ["kept"]
    assert ids_of(await store.read("gone")) == []
    assert ids_of(await store.read("kept")) == [a, c]
    await store.check()  # b was deleted with its only reference
    d = await store.put("t", b"d", endpoints=["gone"])  # the name can be used again
    assert d > c > b
    assert ids_of(await store.read("gone")) == [d]


async def test_put_many_is_one_atomic_call_in_order(store: SpoolStore) -> None:
    assert await store.put_many([]) == []
    messages = [NewMessage(f"t/{i}", bytes([i]), ["q"], {"i": i}) for i in range(10)]
    ids = await store.put_many(messages)
    assert ids == list(range(ids[0], ids[0] + 10))
    page = await store.read("q")
    assert [(e.message.topic, e.message.payload, e.message.headers) for e in page] == [
        (m.topic, m.payload, m.headers) for m in messages
    ]


async def test_concurrent_puts_keep_each_publishers_order(store: SpoolStore) -> None:
    got: dict[int, list[int]] = {}

    async def publisher(n: int) -> None:
        got[n] = [
            await store.put(f"t/{n}", f"{n}/{i}".encode(), endpoints=["q"]) for i in range(25)
        ]

    async with anyio.create_task_group() as tg:
        for n in range(40):
            tg.start_soon(publisher, n)
    entries = await read_all(store, "q", page=100)
    assert len(entries) == 40 * 25 == len({e.message.id for e in entries})
    for n, ids in got.items():
        assert ids == sorted(ids)
        mine = [e.message.payload for e in entries if e.message.topic == f"t/{n}"]
        assert mine == [f"{n}/{i}".encode() for i in range(25)]
    assert store.stats("q").messages == 1000


async def test_a_call_cancelled_before_it_starts_changes_nothing(store: SpoolStore) -> None:
    kept = await store.put("t", b"kept", endpoints=["q"])
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.put("t", b"cancelled", endpoints=["q"]),
        lambda: store.ack("q", [kept]),
        lambda: store.mark_delivered("q", [kept]),
        lambda: store.drop_endpoint("q"),
    ]
    for call in calls:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await call()
        assert scope.cancelled_caught
    assert [(e.message.id, e.delivery_count) for e in await store.read("q")] == [(kept, 0)]
    assert store.stats("q") == EndpointStats(1, 4)


BAD_CALLS: list[tuple[str, Callable[[SpoolStore], Awaitable[object]], type[Exception]]] = [
    ("payload str", lambda s: s.put("t", "text", endpoints=["q"]), TypeError),  # type: ignore[arg-type]
    ("payload bytearray", lambda s: s.put("t", bytearray(b"x"), endpoints=["q"]), TypeError),  # type: ignore[arg-type]
    ("topic empty", lambda s: s.put("", b"x", endpoints=["q"]), ValueError),
    ("topic not str", lambda s: s.put(b"t", b"x", endpoints=["q"]), TypeError),  # type: ignore[arg-type]
    ("topic surrogate", lambda s: s.put("t\udc80", b"x", endpoints=["q"]), ValueError),
    ("no endpoints", lambda s: s.put("t", b"x", endpoints=[]), ValueError),
    ("endpoints a str", lambda s: s.put("t", b"x", endpoints="q"), TypeError),
    ("duplicate endpoint", lambda s: s.put("t", b"x", endpoints=["q", "q"]), ValueError),
    ("empty endpoint", lambda s: s.put("t", b"x", endpoints=["q", ""]), ValueError),
    ("endpoint not str", lambda s: s.put("t", b"x", endpoints=[1]), TypeError),  # type: ignore[list-item]
    ("headers int key", lambda s: s.put("t", b"x", endpoints=["q"], headers={1: 2}), TypeError),  # type: ignore[dict-item]
    (
        "headers object",
        lambda s: s.put("t", b"x", endpoints=["q"], headers={"a": object()}),
        TypeError,
    ),
    ("headers a list", lambda s: s.put("t", b"x", endpoints=["q"], headers=[1]), TypeError),  # type: ignore[arg-type]
    (
        "expires NaN",
        lambda s: s.put("t", b"x", endpoints=["q"], expires_at=float("nan")),
        ValueError,
    ),
    ("expires str", lambda s: s.put("t", b"x", endpoints=["q"], expires_at="soon"), TypeError),  # type: ignore[arg-type]
    ("put_many item", lambda s: s.put_many([("t", b"x", ["q"])]), TypeError),  # type: ignore[list-item]
    ("marked a str", lambda s: s.put_many([NewMessage("t", b"x", ["q"], marked="q")]), TypeError),
    (
        "marked not held",
        lambda s: s.put_many([NewMessage("t", b"x", ["q"], marked=["r"])]),
        ValueError,
    ),
    (
        "marked twice",
        lambda s: s.put_many([NewMessage("t", b"x", ["q", "r"], marked=["q", "q"])]),
        ValueError,
    ),
    ("ack id str", lambda s: s.ack("q", ["1"]), TypeError),  # type: ignore[list-item]
    ("ack ids a str", lambda s: s.ack("q", "1"), TypeError),  # type: ignore[arg-type]
    ("ack id too big", lambda s: s.ack("q", [2**63]), ValueError),
    ("ack endpoint empty", lambda s: s.ack("", [1]), ValueError),
    ("mark id float", lambda s: s.mark_delivered("q", [1.0]), TypeError),  # type: ignore[list-item]
    ("drop endpoint None", lambda s: s.drop_endpoint(None), TypeError),  # type: ignore[arg-type]
    ("read limit 0", lambda s: s.read("q", 0, 0), ValueError),
    ("read after str", lambda s: s.read("q", "0"), TypeError),  # type: ignore[arg-type]
    ("read max_bytes 0", lambda s: s.read("q", 0, 10, max_bytes=0), ValueError),
]


@pytest.mark.parametrize(
    ("call", "error"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
async def test_invalid_input_raises_a_typed_error_and_changes_nothing(
    store: SpoolStore,
    call: Callable[[SpoolStore], Awaitable[object]],
    error: type[Exception],
) -> None:
    kept = await store.put("t", b"kept", endpoints=["q"])
    with pytest.raises(error):
        await call(store)
    assert ids_of(await store.read("q")) == [kept]
    assert store.stats("q") == EndpointStats(1, 4)
    assert await store.put("t", b"next", endpoints=["q"]) > kept  # still usable


async def test_calls_need_an_open_store(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(StateError):
        await store.put("t", b"x", endpoints=["q"])
    async with store:
        with pytest.raises(StateError):
            await store.open()
        await store.put("t", b"x", endpoints=["q"])
    await store.close()  # idempotent
    for call in (
        store.put("t", b"x", endpoints=["q"]),
        store.ack("q", [1]),
        store.mark_delivered("q", [1]),
        store.read("q"),
        store.drop_endpoint("q"),
        store.check(),
    ):
        with pytest.raises(StateError):
            await call


async def test_statistics_count_commits_and_records(store: SpoolStore) -> None:
    before = store.statistics()
    ids = await store.put_many([NewMessage("t", b"x", ["q"]) for _ in range(5)])
    await store.mark_delivered("q", ids[:2])
    await store.ack("q", ids)
    after = store.statistics()
    assert after.records - before.records == 5 + 2 + 5
    assert after.commits - before.commits == 3  # one caller at a time: one commit each


async def test_check_passes_on_a_busy_store(store: SpoolStore) -> None:
    async def churn(n: int) -> None:
        for i in range(20):
            (a,) = await store.put_many([NewMessage("t", b"x" * i, [f"q{n % 3}", "all"])])
            await store.mark_delivered("all", [a])
            if i % 2:
                await store.ack(f"q{n % 3}", [a])

    async with anyio.create_task_group() as tg:
        for n in range(10):
            tg.start_soon(churn, n)
        await store.check()
    await store.check()
    assert store.stats("all").messages == 200
    assert sum(store.stats(f"q{n}").messages for n in range(3)) == 100
    assert {e.delivery_count for e in await read_all(store, "all")} == {1}
