"""SqliteStore's tail cache: a read it answers from memory returns exactly what the
database returns for the same read, whatever puts, acks, marks and dropped
endpoints came before; and it answers the reads of a consumer that keeps up, while
a consumer that falls behind reads from the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshbus.plugins.guaranteed._sqlite import SqliteStore
from meshbus.plugins.guaranteed._store import NewMessage, SpoolEntry
from meshbus.plugins.guaranteed._tail import TailCache

ENDPOINTS = ["a", "b", "c"]

endpoint_sets = st.lists(st.sampled_from(ENDPOINTS), min_size=1, max_size=3, unique=True)
operations = st.one_of(
    st.tuples(
        st.just("put"),
        endpoint_sets,
        st.integers(1, 4),  # messages
        st.integers(1, 20),  # payload bytes
        st.sets(st.sampled_from(ENDPOINTS)),  # marked by the put
        st.booleans(),  # two puts at once (one commit)
    ),
    st.tuples(st.just("ack"), st.sampled_from(ENDPOINTS), st.integers(0, 7)),
    st.tuples(st.just("mark"), st.sampled_from(ENDPOINTS), st.integers(0, 7)),
    st.tuples(st.just("drop"), st.sampled_from(ENDPOINTS)),
    st.tuples(st.just("read"), st.sampled_from(ENDPOINTS), st.integers(1, 6), st.booleans()),
)


def view(page: list[SpoolEntry]) -> list[tuple[Any, ...]]:
    return [
        (m.id, m.topic, m.payload, dict(m.headers), m.persistent, m.expires_at, c) for m, c in page
    ]


async def from_disk(store: SqliteStore, endpoint: str, after: int, limit: int) -> Any:
    return await anyio.to_thread.run_sync(
        store._read, endpoint, after, limit, None, limiter=store._limiter
    )


async def play(path: Path, ops: list[Any]) -> None:
    async with SqliteStore(path) as store:
        store._tail = TailCache(max_entries=6, max_bytes=60)  # small: tails get dropped
        cursors = dict.fromkeys(ENDPOINTS, 0)  # each endpoint's consumer, reading on
        n = 0
        for op in ops:
            kind = op[0]
            if kind == "put":
                _, endpoints, count, size, marked, twice = op

                async def put(
                    endpoints: list[str] = endpoints,
                    count: int = count,
                    size: int = size,
                    marked: set[str] = marked,
                ) -> None:
                    nonlocal n
                    batch = []
                    for _ in range(count):
                        n += 1
                        batch.append(
                            NewMessage(
                                f"t/{n}",
                                bytes([n % 256]) * size,
                                tuple(endpoints),
                                {"n": n} if n % 3 else {},
                                persistent=n % 2 == 0,
                                expires_at=1e12 if n % 5 == 0 else None,
                                marked=tuple(e for e in endpoints if e in marked),
                            )
                        )
                    await store.put_many(batch)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(put)
                    if twice:
                        tg.start_soon(put, list(reversed(endpoints)), 1)
            elif kind in ("ack", "mark"):
                _, endpoint, pick = op
                # odd picks: among what the consumer has not read yet (a tail's part)
                first = cursors[endpoint] if pick % 2 else 0
                held = [m.id for m, _ in await from_disk(store, endpoint, first, 100)]
                if held:
                    chosen = held[pick // 2 % len(held) :: 2]
                    if kind == "ack":
                        await store.ack(endpoint, chosen)
                    else:
                        await store.mark_delivered(endpoint, chosen)
            elif kind == "drop":
                await store.drop_endpoint(op[1])
                cursors[op[1]] = 0
            else:
                _, endpoint, limit, from_start = op
                after = 0 if from_start else cursors[endpoint]
                got = await store.read(endpoint, after, limit)
                assert view(got) == view(await from_disk(store, endpoint, after, limit)), op
                if got:
                    cursors[endpoint] = got[-1].message.id
            for endpoint, after in cursors.items():  # what each consumer would read next
                got = await store.read(endpoint, after, 100)
                assert view(got) == view(await from_disk(store, endpoint, after, 100)), op


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(operations, max_size=40))
def test_a_read_from_the_cache_is_what_the_database_returns(tmp_path: Path, ops: list[Any]) -> None:
    for old in tmp_path.glob("spool*"):
        old.unlink()
    anyio.run(play, tmp_path / "spool.sqlite", ops)


async def test_a_consumer_that_keeps_up_reads_from_memory(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "spool.sqlite") as store:
        cursor = 0
        for i in range(50):
            await store.put_many([NewMessage(f"t/{i}", b"x", ("q",))])
            page = await store.read("q", cursor, 10)
            assert [m.topic for m, _ in page] == [f"t/{i}"]
            cursor = page[-1].message.id
            await store.ack("q", [cursor])
        # the first read found the queue empty (from the database), the others were
        # answered from memory
        assert (store._tail.hits, store._tail.misses) == (49, 1)
        assert store._tail.size == 0  # acked: nothing held


async def test_a_consumer_that_falls_behind_reads_from_the_database(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "spool.sqlite") as store:
        store._tail = TailCache(max_entries=4)
        assert await store.read("q", 0, 10) == []  # it read everything: followed
        await store.put_many([NewMessage(f"t/{i}", b"x", ("q",)) for i in range(3)])
        assert len(await store.read("q", 0, 10)) == 3
        assert store._tail.hits == 1
        await store.put_many([NewMessage(f"t/{i}", b"x", ("q",)) for i in range(3, 9)])
        assert len(store._tail) == 0  # over its bound: dropped
        assert [m.topic for m, _ in await store.read("q", 3, 10)] == [f"t/{i}" for i in range(3, 9)]
        assert store._tail.misses == 2


async def test_one_tail_takes_an_eighth_of_the_memory_at_most(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "spool.sqlite") as store:
        store._tail = TailCache(max_bytes=8000)
        for name in ("idle", "busy"):
            assert await store.read(name, 0, 10) == []  # both followed
        await store.put_many([NewMessage("t/1", bytes(600), ("idle",))])
        assert store._tail.size == 600
        await store.put_many([NewMessage("t/2", bytes(600), ("idle",))])
        assert len(store._tail) == 1  # over 1000 bytes: dropped, 'busy' keeps its room
        await store.put_many([NewMessage("t/3", bytes(900), ("busy",))])
        assert store._tail.size == 900


async def test_a_consumer_reading_while_puts_commit_misses_nothing(tmp_path: Path) -> None:
    # Reads of the database and commits take turns on the worker thread, and the event
    # loop takes up their results in either order: a read whose result comes back after
    # a later commit's must not start a tail that lacks that commit's messages. (Small
    # tails, dropped often, so that the consumer reads the database often.)
    async with SqliteStore(tmp_path / "spool.sqlite") as store:
        store._tail = TailCache(max_entries=3)
        total = 900
        got: list[int] = []
        put = anyio.Event()

        async def publish(first: int) -> None:
            nonlocal put
            for i in range(first, total, 3):
                await store.put_many([NewMessage(f"t/{i}", b"x", ("q",), persistent=False)])
                put.set()
                put = anyio.Event()

        async def consume() -> None:
            cursor = 0
            while len(got) < total:
                waited = put
                page = await store.read("q", cursor, 2)
                if page:
                    cursor = page[-1].message.id
                    got.extend(m.id for m, _ in page)
                else:
                    await waited.wait()  # (set meanwhile: no wait)

        async with anyio.create_task_group() as tg:
            for first in range(3):
                tg.start_soon(publish, first)
            with anyio.fail_after(30):
                await consume()
        assert got == [m.id for m, _ in await from_disk(store, "q", 0, total)]
        assert store._tail.hits > 0


async def test_a_read_taken_up_after_a_later_commit_starts_no_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race above, made to happen: the read runs on the worker, a put commits after
    # it, and only then does the event loop take up the read's result.
    async with SqliteStore(tmp_path / "spool.sqlite") as store:
        read_done, release = anyio.Event(), anyio.Event()
        real = anyio.to_thread.run_sync

        async def held_back(func: Any, *args: Any, **kwargs: Any) -> Any:
            result = await real(func, *args, **kwargs)
            if func == store._read_numbered:
                read_done.set()
                await release.wait()
            return result

        monkeypatch.setattr(anyio.to_thread, "run_sync", held_back)
        pages: list[list[SpoolEntry]] = []

        async def read() -> None:
            pages.append(await store.read("q", 0, 10))

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await read_done.wait()  # it found nothing
            await store.put_many([NewMessage("t/1", b"x", ("q",))])  # committed after it
            release.set()
        assert pages == [[]]
        assert [m.topic for m, _ in await store.read("q", 0, 10)] == ["t/1"]
