"""Issue 4 acceptance: memory stays bounded while a million messages sit in a queue."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import anyio
import pytest

from meshbus import Node

MILLION = 1_000_000
BATCH = 10_000


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(sys.platform != "linux", reason="reads RSS from /proc")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # one backend: it is the size that matters
async def test_a_million_queued_messages_stay_on_disk(tmp_path: Path) -> None:
    async with Node(plugins=["direct", "guaranteed"], data_dir=tmp_path) as node:
        queue = node.guaranteed.create_queue("big", subscriptions=["big/>"])
        session = node.connect()
        payload = bytes(100)
        # warm up (first pages, SQLite cache) before taking the baseline
        assert not any(await session.send_many([("big/m", payload)] * BATCH))
        before = _rss()
        for _ in range(BATCH, MILLION, BATCH):
            assert not any(await session.send_many([("big/m", payload)] * BATCH))
        queued = _rss() - before
        assert queue.store.stats(queue.endpoint).messages == MILLION

        # Consuming walks the queue page by page: a few pages in RAM, never all.
        tracemalloc.start()
        try:
            async with await session.bind("big", window=1000) as flow:
                for _ in range(20_000):
                    with anyio.fail_after(10):
                        flow.ack(await flow.receive())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    # 100 MB of payloads (several times that as Python objects) went in: the process
    # keeps a small fixed amount, not a per-message cost.
    assert queued < 40_000_000, f"RSS grew {queued / 1e6:.1f} MB while queueing a million"
    assert peak < 8_000_000, f"traced peak {peak / 1e6:.1f} MB while consuming"
