"""The bridge under trio: streams opened and writes published through trio's loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from .conftest import blocking, running_bridge, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def test_queue_to_spark_and_back_on_trio(spark: Any, tmp_path: Path) -> None:
    async with running_bridge(tmp_path / "node") as (node, bridge):
        queue = node.guaranteed.create_queue("jobs", subscriptions=["jobs/>"])
        app = node.connect(client_name="app")
        app.subscribe("done/>")
        for i in range(6):
            await app.send("jobs/new", f"job-{i}")

        def run() -> None:
            # Opened on demand: the bridge binds the queue from trio's loop.
            frame = bridge.read_stream(spark, queue="jobs").selectExpr(
                "value", "concat('done/', topic) as topic"
            )
            writer = bridge.write_stream(frame, checkpoint=str(tmp_path / "ck"))
            writer.trigger(availableNow=True).start().awaitTermination()

        await blocking(run)
        with anyio.fail_after(10):
            done = [await app.receive() for _ in range(6)]
        assert sorted(m.payload for m in done) == [f"job-{i}".encode() for i in range(6)]
        assert {m.topic for m in done} == {"done/jobs/new"}
        await wait_for(lambda: queue.usage()[0] == 0)
