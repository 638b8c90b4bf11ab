"""Moving a message to the dead message queue is one store change (SPEC 4):
``SpoolStore.put_and_ack``, and what a kill -9 in the middle of moves leaves.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from meshbus.plugins.guaranteed._memory import MemoryStore
from meshbus.plugins.guaranteed._sqlite import SqliteStore
from meshbus.plugins.guaranteed._store import EndpointStats, NewMessage, SpoolStore

CHILD = Path(__file__).with_name("_move_child.py")


@pytest.fixture
def store(any_store: SpoolStore) -> SpoolStore:
    """Every store kind, the base class's defaults included (``conftest.any_store``)."""
    return any_store


def dead(payload: bytes) -> NewMessage:
    return NewMessage("t", payload, ("dmq",), {"why": "ttl"}, True, None, 5.0)


async def test_put_and_ack_moves_a_message(store: SpoolStore) -> None:
    first = await store.put("t", b"one", endpoints=["q", "other"])
    second = await store.put("t", b"two", endpoints=["q"])
    (moved,) = await store.put_and_ack([dead(b"one")], "q", [first])
    assert moved > second
    assert [e.message.id for e in await store.read("q")] == [second]
    (entry,) = await store.read("dmq")
    assert (entry.message.id, entry.message.payload, entry.message.headers) == (
        moved,
        b"one",
        {"why": "ttl"},
    )
    assert [e.message.id for e in await store.read("other")] == [first]  # still held there
    assert store.stats("q") == EndpointStats(1, 3)
    assert store.stats("dmq") == EndpointStats(1, 3)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_sqlite_and_memory_move_in_one_commit(
    kind: str, tmp_path: Path, anyio_backend: object
) -> None:
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "spool.db")
    async with store:
        await _move_once(store)


async def _move_once(store: SpoolStore) -> None:
    message_id = await store.put("t", b"x", endpoints=["q"])
    before = store.statistics()
    await store.put_and_ack([dead(b"x")], "q", [message_id])
    after = store.statistics()
    assert after.commits == before.commits + 1
    assert after.records == before.records + 2


@pytest.mark.parametrize(
    ("endpoint", "ids", "messages", "error"),
    [
        ("", [1], [dead(b"x")], ValueError),
        ("q", ["1"], [dead(b"x")], TypeError),
        ("q", [1], [NewMessage(7, b"x", ("dmq",))], TypeError),  # type: ignore[arg-type]
        ("q", [1], [NewMessage("t", b"x", ())], ValueError),
    ],
)
async def test_bad_input_changes_nothing(
    store: SpoolStore, endpoint: str, ids: list[object], messages: list[NewMessage], error: type
) -> None:
    kept = await store.put("t", b"kept", endpoints=["q"])
    assert kept == 1
    with pytest.raises(error):
        await store.put_and_ack(messages, endpoint, ids)  # type: ignore[arg-type]
    assert [e.message.id for e in await store.read("q")] == [kept]
    assert await store.read("dmq") == []


def test_a_kill_9_mid_move_leaves_each_message_in_exactly_one_queue(tmp_path: Path) -> None:
    rng = random.Random()
    count = 3000
    interrupted = 0
    for trial in range(3):
        path = tmp_path / f"spool{trial}.db"
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(path), str(count)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "READY"
            time.sleep(rng.uniform(0.05, 0.4))
        finally:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
        left, moved = anyio.run(_queues_after_the_kill, path)
        interrupted += 0 < len(moved) < count
        assert left.isdisjoint(moved), f"in both queues: {sorted(left & moved)[:5]}"
        assert left | moved == {b"m%d" % n for n in range(count)}, "a message was lost"
    assert interrupted, "every kill came before the first move or after the last"


async def _queues_after_the_kill(path: Path) -> tuple[set[bytes], set[bytes]]:
    async with SqliteStore(path) as store:
        await store.check()
        left = [e.message.payload for e in await store.read("q", 0, 100_000)]
        moved = [e.message.payload for e in await store.read("dmq", 0, 100_000)]
    assert len(moved) == len(set(moved)), "moved twice"
    return set(left), set(moved)
