"""SqliteStore beyond the shared contract: group commit, syncs, restarts, failures, memory."""

from __future__ import annotations

import os
import sqlite3
import sys
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import TaskStatus

from meshbus import SpoolError, StateError
from meshbus.plugins.guaranteed._sqlite import SqliteStore
from meshbus.plugins.guaranteed._store import EndpointStats, NewMessage

from .test_contract import ids_of, read_all


@asynccontextmanager
async def worker_held(store: SqliteStore) -> AsyncIterator[None]:
    """Keep the store's worker busy: commits queue up until the block exits."""
    release = anyio.Event()

    async def hold(*, task_status: TaskStatus[None]) -> None:
        assert store._limiter is not None
        async with store._limiter:
            task_status.started()
            await release.wait()

    async with anyio.create_task_group() as tg:
        await tg.start(hold)
        try:
            yield
        finally:
            release.set()


async def test_concurrent_publishers_share_commits(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:

        async def publisher(n: int) -> None:
            for _i in range(20):
                await store.put("t", b"x" * 100, endpoints=["q", f"own{n % 4}"])

        async with anyio.create_task_group() as tg:
            for n in range(64):
                tg.start_soon(publisher, n)
        stats = store.statistics()
        assert stats.records == 64 * 20
        # 64 publishers: after the first commit each one takes what queued meanwhile
        assert stats.commits < 64 * 20 / 8, stats
        assert stats.syncs == stats.commits
        assert store.stats("q") == EndpointStats(1280, 128_000)
        assert store.stats("own3") == EndpointStats(320, 32_000)
        await store.check()


async def test_only_commits_that_need_it_are_synced(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "full.db") as store:

        async def syncs_for(call: object) -> int:
            before = store.statistics().syncs
            await call  # type: ignore[misc]
            return store.statistics().syncs - before

        a = await store.put("t", b"x", endpoints=["q"])
        assert await syncs_for(store.put("t", b"x", endpoints=["q"])) == 1
        assert await syncs_for(store.put("t", b"x", endpoints=["q"], persistent=False)) == 0
        assert await syncs_for(store.mark_delivered("q", [a])) == 1
        assert await syncs_for(store.ack("q", [a])) == 0
        assert await syncs_for(store.drop_endpoint("q")) == 1
    async with SqliteStore(tmp_path / "relaxed.db", durability="relaxed") as store:
        a = await store.put("t", b"x", endpoints=["q"])
        await store.mark_delivered("q", [a])
        await store.drop_endpoint("q")
        assert store.statistics().syncs == 0
        assert store.statistics().commits == 3


@pytest.mark.parametrize("durability", ["full", "relaxed"])
async def test_reopen_keeps_everything_and_ids_keep_growing(
    tmp_path: Path, durability: str
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path, durability) as store:  # type: ignore[arg-type]
        ids = await store.put_many(
            [NewMessage(f"t/{i}", bytes([i]) * i, ["q1", "q2"], {"i": i}) for i in range(50)]
        )
        await store.mark_delivered("q1", ids[:10])
        await store.mark_delivered("q1", ids[:5])
        await store.ack("q2", ids[:25])
        await store.ack("q1", ids[40:])  # the highest ids are gone from the file after this
        await store.ack("q2", ids[40:])
        await store.put("t", b"doomed", endpoints=["dropped"])
        await store.drop_endpoint("dropped")
        before = {q: await read_all(store, q) for q in ("q1", "q2")}
        figures = {q: store.stats(q) for q in ("q1", "q2")}
    async with SqliteStore(path, durability) as store:  # type: ignore[arg-type]
        await store.check()
        assert {q: await read_all(store, q) for q in ("q1", "q2")} == before
        assert {q: store.stats(q) for q in ("q1", "q2")} == figures
        assert store.endpoints() == ["q1", "q2"]
        counts = [e.delivery_count for e in before["q1"]]
        assert counts == [2] * 5 + [1] * 5 + [0] * 30
        assert await store.put("t", b"new", endpoints=["q1"]) > ids[-1] + 1  # never reused


async def test_reopening_the_same_object(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    async with store:
        a = await store.put("t", b"x", endpoints=["q"])
    assert "closed" in repr(store)
    async with store:
        assert ids_of(await store.read("q")) == [a]
        assert store.statistics().commits == 0  # counters restart with each open


async def test_one_store_per_file(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db"):
        with pytest.raises(SpoolError, match="locked"):
            await SqliteStore(tmp_path / "s.db").open()
    async with SqliteStore(tmp_path / "s.db"):  # free again once closed
        pass


async def test_files_that_are_not_a_spool_are_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database, just some bytes" * 100)
    with pytest.raises(SpoolError, match="not a database"):
        await SqliteStore(garbage).open()
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("PRAGMA user_version = 7")
    with pytest.raises(SpoolError, match="version 7"):
        await SqliteStore(other).open()
    with pytest.raises(SpoolError, match="write-ahead log"):
        await SqliteStore(":memory:").open()
    with pytest.raises(SpoolError, match="cannot open"):
        await SqliteStore(tmp_path / "no" / "such" / "dir.db").open()
    with pytest.raises(ValueError, match="durability"):
        SqliteStore(tmp_path / "s.db", durability="sometimes")  # type: ignore[arg-type]


async def tamper(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(sql)
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        ("UPDATE messages SET refcount = 3", "refcount 3 but 2 references"),
        (
            "UPDATE endpoints SET bytes = 5 WHERE name = 'q1'",
            "'q1' is recorded with 1 messages / 5 bytes but holds 1 / 1",
        ),
        ("INSERT INTO refs VALUES ('q1', 999, 0)", "missing message 999"),
        ("DELETE FROM endpoints", "has no figures"),
        ("UPDATE meta SET value = 1", "next id 1"),
        ("UPDATE messages SET headers = '[1'", "bad headers"),
    ],
)
async def test_check_finds_inconsistent_files(tmp_path: Path, sql: str, problem: str) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        await store.put("t", b"x", endpoints=["q1", "q2"], headers={"a": 1})
        await store.check()
    await tamper(path, sql)
    async with SqliteStore(path) as store:
        with pytest.raises(SpoolError, match=problem):
            await store.check()


async def test_unreadable_rows_raise_spool_error(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        await store.put("t", b"x", endpoints=["q"], headers={"a": 1})
    await tamper(path, "UPDATE messages SET headers = 'not json'")
    async with SqliteStore(path) as store:
        with pytest.raises(SpoolError, match="cannot read 'q'"):
            await store.read("q")


async def test_a_failed_commit_fails_its_whole_batch_and_nothing_else(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        kept = await store.put("t", b"kept", endpoints=["q"])
        conn = store._conn
        assert conn is not None
        # Cap the file at its current size: the next commit needing a page fails.
        await anyio.to_thread.run_sync(
            conn.execute, "PRAGMA max_page_count = 1", limiter=store._limiter
        )
        big = b"x" * 100_000
        outcomes: dict[str, object] = {}

        async def put(name: str, payload: bytes) -> None:
            try:
                outcomes[name] = await store.put("t", payload, endpoints=["q"])
            except SpoolError as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tg, worker_held(store):
            tg.start_soon(put, "leader", big)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(put, "big", big)
            tg.start_soon(put, "small", b"small")  # shares the commit with "big"
            await anyio.wait_all_tasks_blocked()
            assert store.stats("q") == EndpointStats(4, 4 + 2 * len(big) + 5)
        assert all(isinstance(outcomes[n], SpoolError) for n in ("leader", "big", "small"))
        assert "full" in str(outcomes["small"])
        assert ids_of(await store.read("q")) == [kept]
        assert store.stats("q") == EndpointStats(1, 4)
        await store.check()
        await anyio.to_thread.run_sync(
            conn.execute, "PRAGMA max_page_count = 1000000", limiter=store._limiter
        )
        after = await store.put("t", big, endpoints=["q"])
        assert after > kept + 3  # the failed puts' ids are not reused
        assert ids_of(await store.read("q")) == [kept, after]


async def test_stats_count_puts_waiting_for_their_commit(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        scopes: dict[int, anyio.CancelScope] = {}
        done: list[int] = []

        async def put(n: int) -> None:
            with anyio.CancelScope() as scopes[n]:
                done.append(await store.put("t", bytes(n), endpoints=["q"]))

        async with anyio.create_task_group() as tg, worker_held(store):
            tg.start_soon(put, 1)  # leads: its commit waits for the worker
            await anyio.wait_all_tasks_blocked()
            for n in (2, 3, 4):  # queue behind it
                tg.start_soon(put, n)
            await anyio.wait_all_tasks_blocked()
            # a quota check sees all four, so concurrent publishers cannot overshoot
            assert store.stats("q") == EndpointStats(4, 10)
            assert store.endpoints() == ["q"]
            # a caller cancelled before its commit started is withdrawn
            scopes[3].cancel()
            await anyio.wait_all_tasks_blocked()
            assert store.stats("q") == EndpointStats(3, 7)
        assert len(done) == 3
        page = await store.read("q")
        assert ids_of(page) == sorted(done)
        assert {e.message.payload for e in page} == {bytes(1), bytes(2), bytes(4)}
        assert store.statistics().commits == 2
        await store.check()


async def test_a_cancelled_heir_does_not_stall_the_queue(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        scopes: dict[str, anyio.CancelScope] = {}
        results: dict[str, int] = {}

        async def waiter(name: str) -> None:
            with anyio.CancelScope() as scopes[name]:
                results[name] = await store.put("t", name.encode(), endpoints=["q"])

        async def leader() -> None:
            results["a"] = await store.put("t", b"a", endpoints=["q"])
            # The lead has just been handed to "b", which has not run yet.
            scopes["b"].cancel()

        async with anyio.create_task_group() as tg, worker_held(store):
            tg.start_soon(leader)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(waiter, "b")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(waiter, "c")
            await anyio.wait_all_tasks_blocked()
        # b was withdrawn before it took the batch, and passed the lead on to c
        assert sorted(results) == ["a", "c"]
        payloads = [e.message.payload for e in await store.read("q")]
        assert payloads == [b"a", b"c"]
        assert store.stats("q").messages == len(payloads)
        await store.check()


async def test_the_first_waiter_withdrawing_hands_the_lead_to_the_next(tmp_path: Path) -> None:
    # Callers waiting behind a commit share one event, except the first, which the lead
    # is handed to; if it withdraws, the next one must lead instead of all waiting on.
    async with SqliteStore(tmp_path / "s.db") as store:
        scopes: dict[str, anyio.CancelScope] = {}
        results: dict[str, int] = {}

        async def put(name: str) -> None:
            with anyio.CancelScope() as scopes[name]:
                results[name] = await store.put("t", name.encode(), endpoints=["q"])

        async with anyio.create_task_group() as tg, worker_held(store):
            tg.start_soon(put, "a")  # leads: its commit waits for the worker
            await anyio.wait_all_tasks_blocked()
            for name in "bcd":  # b is first in line, c and d share the batch's event
                tg.start_soon(put, name)
                await anyio.wait_all_tasks_blocked()
            scopes["b"].cancel()
            await anyio.wait_all_tasks_blocked()
        assert sorted(results) == ["a", "c", "d"]
        assert [e.message.payload for e in await store.read("q")] == [b"a", b"c", b"d"]
        assert store.statistics().commits == 2  # c led one commit for itself and d
        await store.check()


async def test_a_leader_cancelled_before_its_commit_passes_the_lead_on(
    tmp_path: Path, anyio_backend: str
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        x_scope = anyio.CancelScope()
        x_calling = anyio.Event()
        results: dict[str, int] = {}

        async def x() -> None:
            with x_scope:
                x_calling.set()
                # leads: yields once for company before taking the batch
                results["x"] = await store.put("t", b"x", endpoints=["q"])

        async def y() -> None:
            await x_calling.wait()
            x_scope.cancel()  # lands in x's yield (asyncio: always; trio: when y runs first)
            results["y"] = await store.put("t", b"y", endpoints=["q"])

        async with anyio.create_task_group() as tg:
            tg.start_soon(y)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(x)
        payloads = [e.message.payload for e in await store.read("q")]
        assert "y" in results  # never stalled behind the cancelled leader
        assert payloads == ([b"x", b"y"] if "x" in results else [b"y"])
        if anyio_backend == "asyncio":  # FIFO scheduling: y always runs in x's yield
            assert "x" not in results
        assert store.stats("q").messages == len(payloads)
        await store.check()


async def test_a_mark_written_with_the_put_costs_no_commit(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        (held, handed) = await store.put_many(
            [
                NewMessage("t", b"held", ["q", "r"], marked=["r"]),
                NewMessage("t", b"handed", ["q", "r"], marked=["q", "r"]),
            ]
        )
        # Until mark_delivered counts it, it reads as never delivered.
        assert [e.delivery_count for e in await store.read("q")] == [0, 0]
        assert [e.delivery_count for e in await store.read("r")] == [0, 0]
        commits = store.statistics().commits
        assert await store.mark_delivered("q", [held, handed]) == 2  # handed was premarked
        assert await store.mark_delivered("r", [handed]) == 1
        assert store.statistics().commits == commits + 1  # only held's mark on q
        assert [e.delivery_count for e in await store.read("q")] == [1, 1]
        assert [e.delivery_count for e in await store.read("r")] == [0, 1]
        await store.check()
    async with SqliteStore(path) as store:
        assert [e.delivery_count for e in await store.read("q")] == [1, 1]
        assert [e.delivery_count for e in await store.read("r")] == [1, 1]


async def test_a_premarked_message_comes_back_flagged_after_a_restart(tmp_path: Path) -> None:
    # The mark is on disk with the put: whether or not it was handed out before the
    # process went away, the next store reports it delivered once.
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        first = await store.put_many([NewMessage("t", b"x", ["q"], marked=["q"])])
        acked = await store.put_many([NewMessage("t", b"y", ["q"], marked=["q"])])
        await store.ack("q", acked)
        assert store._premarked == {("q", first[0])}  # the ack forgot the other one
    async with SqliteStore(path) as store:
        assert [(e.message.payload, e.delivery_count) for e in await store.read("q")] == [(b"x", 1)]


async def test_close_finishes_queued_commits(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    await store.open()
    done: list[int] = []

    async def put(n: int) -> None:
        done.append(await store.put("t", bytes([n]), endpoints=["q"]))

    async with anyio.create_task_group() as tg, worker_held(store):
        for n in range(5):
            tg.start_soon(put, n)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(store.close)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(StateError):  # closing: no new calls
            await store.put("t", b"late", endpoints=["q"])
    assert len(done) == 5
    async with SqliteStore(path) as store:
        assert ids_of(await store.read("q")) == sorted(done)


@pytest.mark.skipif(sys.platform != "linux", reason="reads RSS from /proc")
async def test_paging_a_large_queue_keeps_memory_bounded(tmp_path: Path) -> None:
    count, size = 200_000, 250
    payload_bytes = count * size  # 50 MB of payloads queued
    async with SqliteStore(tmp_path / "s.db", durability="relaxed") as store:
        batch = [NewMessage("t", b"p" * size, ["q"]) for _ in range(5_000)]
        for _ in range(count // len(batch)):
            await store.put_many(batch)
        assert store.stats("q") == EndpointStats(count, payload_bytes)

        rss_before = _rss()
        tracemalloc.start()
        try:
            seen = 0
            after = 0
            while page := await store.read("q", after, 500):
                seen += len(page)
                after = page[-1].message.id
                del page
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        grown = _rss() - rss_before
    assert seen == count
    # A page of 500 is ~0.2 MB of objects; the whole queue would be 50 MB of payloads
    # alone. SQLite's own page cache (2 MB by default) is outside tracemalloc's view,
    # hence the RSS bound as well.
    assert peak < 4_000_000, f"peak traced {peak / 1e6:.1f} MB"
    assert grown < 20_000_000, f"RSS grew by {grown / 1e6:.1f} MB"


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
