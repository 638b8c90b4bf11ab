"""``SpoolStore.read_expired``: how the TTL sweep finds expired messages without
reading the rest (SPEC 4), held against every store and the base class's default.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from meshbus import StateError
from meshbus.plugins.guaranteed._memory import MemoryStore
from meshbus.plugins.guaranteed._sqlite import SqliteStore
from meshbus.plugins.guaranteed._sqlite_sql import _READ_EXPIRED
from meshbus.plugins.guaranteed._store import NewMessage, SpoolEntry, SpoolStore


@pytest.fixture
def store(any_store: SpoolStore) -> SpoolStore:
    """Every store kind, the base class's defaults included (``conftest.any_store``)."""
    return any_store


def ids_of(page: list[SpoolEntry]) -> list[int]:
    return [entry.message.id for entry in page]


async def all_expired(store: SpoolStore, endpoint: str, now: float, page: int) -> list[int]:
    found: list[int] = []
    after = 0
    while chunk := await store.read_expired(endpoint, after, now, page):
        assert len(chunk) <= page
        found += ids_of(chunk)
        after = chunk[-1].message.id
    return found


async def test_only_the_endpoints_due_messages_in_id_order(store: SpoolStore) -> None:
    late = await store.put("t", b"late", endpoints=["q"], expires_at=200.0)
    forever = await store.put("t", b"forever", endpoints=["q"])
    due = await store.put("t", b"due", endpoints=["q"], expires_at=50.0)
    elsewhere = await store.put("t", b"elsewhere", endpoints=["other"], expires_at=10.0)
    exactly = await store.put("t", b"exactly", endpoints=["q"], expires_at=100.0)
    shared = await store.put("t", b"shared", endpoints=["q", "other"], expires_at=20.0)
    page = await store.read_expired("q", 0, 100.0)
    assert ids_of(page) == [due, exactly, shared]  # id order, not expiry order
    assert page[0].message.payload == b"due"
    assert page[0].delivery_count == 0
    assert ids_of(await store.read_expired("other", 0, 100.0)) == [elsewhere, shared]
    assert ids_of(await store.read_expired("q", 0, 99.9)) == [due, shared]
    assert ids_of(await store.read_expired("q", 0, 1e9)) == [late, due, exactly, shared]
    assert forever not in ids_of(await store.read_expired("q", 0, 1e18))
    assert await store.read_expired("nobody", 0, 1e9) == []


async def test_pages_with_after_id_and_limit(store: SpoolStore) -> None:
    ids = [await store.put("t", b"x", endpoints=["q"], expires_at=float(i % 3)) for i in range(30)]
    due = [i for n, i in enumerate(ids) if n % 3 != 2]  # expiry 0 or 1
    assert await all_expired(store, "q", 1.0, page=7) == due
    assert ids_of(await store.read_expired("q", due[4], 1.0, 3)) == due[5:8]


async def test_acked_and_dropped_messages_are_not_found_again(store: SpoolStore) -> None:
    ids = [await store.put("t", b"x", endpoints=["q", "r"], expires_at=5.0) for _ in range(300)]
    assert await store.ack("q", ids[:290]) == 290  # enough to compact the memory store
    await store.mark_delivered("q", [ids[295]])
    page = await store.read_expired("q", 0, 10.0, 1000)
    assert ids_of(page) == ids[290:]
    assert [e.delivery_count for e in page if e.message.id == ids[295]] == [1]
    assert await all_expired(store, "r", 10.0, page=100) == ids  # the other endpoint's
    await store.drop_endpoint("r")
    assert await store.read_expired("r", 0, 10.0) == []


@pytest.mark.parametrize("seed", range(6))
async def test_agrees_with_reading_everything(store: SpoolStore, seed: int) -> None:
    """Random puts (some with a TTL, over one or two endpoints) and acks; each look
    at the expired messages equals filtering a full read."""
    rng = random.Random(seed)
    live: list[int] = []
    for _ in range(40):
        batch = [
            NewMessage(
                "t",
                b"p" * rng.randint(0, 20),
                endpoints=rng.choice([("a",), ("b",), ("a", "b")]),
                expires_at=rng.choice([None, rng.uniform(0, 100)]),
            )
            for _ in range(rng.randint(1, 30))
        ]
        live += await store.put_many(batch)
        if live and rng.random() < 0.6:
            gone = rng.sample(live, rng.randint(1, len(live)))
            await store.ack(rng.choice(["a", "b"]), gone)
        now = rng.uniform(0, 110)
        for endpoint in ("a", "b"):
            expected = []
            after = 0
            while page := await store.read(endpoint, after, 500):
                after = page[-1].message.id
                expected += [
                    e.message.id
                    for e in page
                    if e.message.expires_at is not None and e.message.expires_at <= now
                ]
            assert await all_expired(store, endpoint, now, rng.randint(1, 50)) == expected


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (("q", 0, float("nan")), ValueError),
        (("q", 0, "soon"), TypeError),
        (("q", 0, 1.0, 0), ValueError),
        (("q", -1.5, 1.0), TypeError),
        (("", 0, 1.0), ValueError),
    ],
)
async def test_bad_arguments_raise_a_typed_error(
    store: SpoolStore, arguments: tuple[object, ...], error: type[Exception]
) -> None:
    await store.put("t", b"x", endpoints=["q"], expires_at=1.0)
    with pytest.raises(error):
        await store.read_expired(*arguments)  # type: ignore[arg-type]
    assert len(await store.read_expired("q", 0, 2.0)) == 1


async def test_needs_an_open_store(anyio_backend: object, tmp_path: Path) -> None:
    for store in (MemoryStore(), SqliteStore(tmp_path / "closed.db")):
        with pytest.raises(StateError):
            await store.read_expired("q", 0, 1.0)


# --- SQLite: an index, not a scan --------------------------------------------------------------


async def test_sqlite_reads_through_the_expiry_index(tmp_path: Path, anyio_backend: object) -> None:
    async with SqliteStore(tmp_path / "spool.db"):
        pass
    conn = sqlite3.connect(tmp_path / "spool.db")
    try:
        rows = conn.execute("EXPLAIN QUERY PLAN " + _READ_EXPIRED, ("q", 1, 0, 9))
        steps = [row[3] for row in rows]
    finally:
        conn.close()
    # The outer loop runs over the expired messages only; each is looked up in refs by
    # its key. The other way round would visit every message the endpoint holds.
    assert steps[0].startswith("SEARCH m USING INDEX messages_by_expiry"), steps
    assert steps[1].startswith("SEARCH r USING PRIMARY KEY (endpoint=? AND message_id=?)"), steps
    assert not any(step.startswith("SCAN") for step in steps), steps


async def test_a_spool_written_before_the_index_gets_it_on_open(
    tmp_path: Path, anyio_backend: object
) -> None:
    path = tmp_path / "spool.db"
    async with SqliteStore(path) as store:
        kept = await store.put("t", b"x", endpoints=["q"], expires_at=1.0)
    conn = sqlite3.connect(path)  # as an older meshbus left it
    try:
        conn.execute("DROP INDEX messages_by_expiry")
        conn.commit()
    finally:
        conn.close()
    async with SqliteStore(path) as store:
        assert ids_of(await store.read_expired("q", 0, 2.0)) == [kept]
        await store.check()
