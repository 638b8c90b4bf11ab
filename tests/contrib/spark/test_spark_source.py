"""format("meshbus") as a Spark source: checkpoints, triggers, queues, crashes.

Each test runs real queries on the shared local SparkSession against a node with a
bridge; file sinks are read back through Spark, which skips files of batches that
never committed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import blocking, running_bridge, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # trio is covered by test_spark_trio.py and the bridge's wire tests


def rows_of(spark: Any, path: Path) -> list[Any]:
    return spark.read.parquet(str(path)).collect()


async def test_restart_from_checkpoint_reads_only_new_messages(spark: Any, tmp_path: Path) -> None:
    async with running_bridge(subscribe=["events/>"]) as (node, bridge):
        app = node.connect(client_name="app")
        for i in range(30):
            app.publish(f"events/{i % 3}", f"first-{i}")

        def run() -> None:
            query = bridge.sink_to(
                spark,
                subscribe="events/>",
                path=str(tmp_path / "out"),
                checkpoint=str(tmp_path / "ck"),
                available_now=True,
            )
            query.awaitTermination()

        await blocking(run)
        assert len(await blocking(lambda: rows_of(spark, tmp_path / "out"))) == 30
        for i in range(12):
            app.publish("events/late", f"second-{i}")
        await blocking(run)
        rows = await blocking(lambda: rows_of(spark, tmp_path / "out"))
        values = sorted(r.value.decode() for r in rows)
        assert values == sorted(
            [f"first-{i}" for i in range(30)] + [f"second-{i}" for i in range(12)]
        )
        assert sorted(r.offset for r in rows) == list(range(42))


async def test_queue_keeps_messages_until_spark_commits_and_a_crash_loses_none(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    flag = tmp_path / "crash-once"

    def crash_once(value: bytes) -> bytes:  # runs in a Spark worker
        if value == b"order-13" and os.path.exists(flag):
            os.remove(flag)
            raise RuntimeError("injected crash between the bus read and Spark's commit")
        return value

    crash = F.udf(crash_once, BinaryType(), useArrow=False)

    async with running_bridge(tmp_path / "node", queues=["orders"]) as (node, bridge):
        queue = node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        app = node.connect(client_name="app")
        for i in range(20):
            await app.send(f"orders/{i % 2}", f"order-{i}")
        flag.touch()

        def run() -> None:
            query = bridge.sink_to(
                spark,
                queue="orders",
                path=str(tmp_path / "out"),
                checkpoint=str(tmp_path / "ck"),
                available_now=True,
                transform=lambda df: df.withColumn("value", crash("value")),
            )
            query.awaitTermination()

        with pytest.raises(Exception, match="injected crash"):
            await blocking(run)
        assert not flag.exists()
        # Spark never committed: the queue still holds all 20, delivered and unacknowledged.
        assert queue.usage()[0] == 20
        assert bridge.statistics()["streams"]["queue:orders"][0]["unacknowledged"] == 20

        for i in range(20, 25):
            await app.send(f"orders/{i % 2}", f"order-{i}")
        await blocking(run)
        await wait_for(lambda: queue.usage()[0] == 0)
        values = [
            r.value.decode() for r in await blocking(lambda: rows_of(spark, tmp_path / "out"))
        ]
        assert sorted(values) == sorted(f"order-{i}" for i in range(25))  # no loss, no duplicate


async def test_app_restart_resumes_a_queue_stream_from_the_checkpoint(
    spark: Any, tmp_path: Path
) -> None:
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    def run(bridge: Any) -> None:
        bridge.sink_to(
            spark, queue="orders", path=out, checkpoint=ck, available_now=True, consumer="reports"
        ).awaitTermination()

    async with running_bridge(tmp_path / "node", queues=["orders"]) as (node, bridge):
        node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        app = node.connect(client_name="app")
        for i in range(10):
            await app.send("orders/a", f"before-{i}")
        await blocking(lambda: run(bridge))
        queue = node.guaranteed.queue("orders")
        await wait_for(lambda: queue.usage()[0] == 0)
        for i in range(5):
            await app.send("orders/a", f"held-{i}")  # captured by the bridge, not yet read
        await wait_for(lambda: bridge.stream(queue="orders").next_offset == 15)

    # A new process: a new node and bridge on the same spool; the log starts empty.
    async with running_bridge(tmp_path / "node", queues=["orders"]) as (node, bridge):
        node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        app = node.connect(client_name="app")
        for i in range(5):
            await app.send("orders/a", f"after-{i}")
        await blocking(lambda: run(bridge))
        rows = await blocking(lambda: rows_of(spark, tmp_path / "out"))
        values = sorted(r.value.decode() for r in rows)
        expected = [f"before-{i}" for i in range(10)] + [f"held-{i}" for i in range(5)]
        assert values == sorted(expected + [f"after-{i}" for i in range(5)])
        assert sorted(r.offset for r in rows) == list(range(20))  # continued, not renumbered from 0
        await wait_for(lambda: node.guaranteed.queue("orders").usage()[0] == 0)


async def start_in_memory(spark: Any, bridge: Any, filters: str, name: str, ck: Path) -> Any:
    """A running query: the stream of ``filters`` into the memory table ``name``."""
    return await blocking(
        lambda: (
            bridge.read_stream(spark, subscribe=filters)
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(ck))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
    )


def count_in(spark: Any, table: str) -> int:
    return int(spark.sql(f"select count(*) from {table}").collect()[0][0])


async def test_processing_time_trigger_delivers_while_the_app_publishes(
    spark: Any, tmp_path: Path
) -> None:
    async with running_bridge(subscribe=["ticks/>"]) as (node, bridge):
        app = node.connect(client_name="app")
        query = await start_in_memory(spark, bridge, "ticks/>", "ticks_memory", tmp_path / "ck")
        try:
            for round_ in range(3):
                for i in range(10):
                    app.publish(f"ticks/{round_}", f"{round_}-{i}")
                expected = 10 * (round_ + 1)
                await wait_for(
                    lambda expected=expected: count_in(spark, "ticks_memory") == expected,
                    timeout=30,
                )
        finally:
            await blocking(query.stop)


async def test_max_offsets_per_trigger_splits_batches(spark: Any, tmp_path: Path) -> None:
    async with running_bridge(subscribe=["m/>"]) as (node, bridge):
        app = node.connect(client_name="app")
        for i in range(25):
            app.publish("m/x", str(i))

        def run() -> list[int]:
            query = (
                bridge.read_stream(spark, subscribe="m/>", maxOffsetsPerTrigger=10)
                .writeStream.format("noop")
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

        assert await blocking(run) == [10, 10, 5]


async def test_columns_key_headers_and_batch_read(spark: Any) -> None:
    async with running_bridge(subscribe=["c/>"]) as (node, bridge):
        app = node.connect(client_name="app", timestamps=True)
        app.publish("c/one", b"\x00\x01", headers={"region": "eu", "n": 7}, correlation_id="k-1")
        node.connect(client_name="plain").publish("c/two", "plain")  # no timestamp
        rows = await blocking(
            lambda: (
                bridge.read(spark, subscribe="c/>", includeHeaders=True).orderBy("offset").collect()
            )
        )
        first, second = rows
        assert (first.key, first.value, first.topic, first.partition, first.offset) == (
            b"k-1",
            b"\x00\x01",
            "c/one",
            0,
            0,
        )
        assert first.timestampType == 0  # stamped by the publisher's session
        assert first.timestamp is not None
        assert {h.key: h.value for h in first.headers} == {"region": b"eu", "n": b"7"}
        assert (second.key, second.value, second.headers) == (None, b"plain", [])
        assert second.timestampType == 1  # stamped when the bridge captured it
        assert second.timestamp >= first.timestamp
        plain = await blocking(lambda: bridge.read(spark, subscribe="c/>").columns)
        assert "headers" not in plain
        latest = await blocking(
            lambda: bridge.read(spark, subscribe="c/>", startingOffsets="latest").count()
        )
        assert latest == 0


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "a/>", "queue": "q"}, "queue"),
        ({"subscribe": "a/>", "maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger"),
        ({"subscribe": "a/>", "startingOfsets": "earliest"}, "startingOffsets"),
        ({"subscribe": "a/>", "includeHeaders": "yes"}, "includeHeaders"),
        ({}, "subscribe"),
    ],
)
async def test_bad_options_fail_at_load_naming_the_option(
    spark: Any, options: dict[str, str], named: str
) -> None:
    async with running_bridge() as (_, bridge):
        bridge.attach(spark)

        def load() -> None:
            spark.readStream.format("meshbus").options(**bridge.connect_options).options(
                **options
            ).load()

        with pytest.raises(Exception, match=f"option '{named}'|did you mean '{named}'"):
            await blocking(load)


async def test_a_stream_nobody_declared_is_captured_from_the_first_query(
    spark: Any, tmp_path: Path
) -> None:
    async with running_bridge() as (node, bridge):
        app = node.connect(client_name="app")
        app.publish("late/1", "before the query: not captured")
        query = await start_in_memory(spark, bridge, "late/>", "late_memory", tmp_path / "ck")
        try:
            await wait_for(lambda: "late/>" in bridge.statistics()["streams"], timeout=30)
            app.publish("late/2", "after")
            await wait_for(lambda: count_in(spark, "late_memory") == 1, timeout=30)
            rows = spark.sql("select value from late_memory").collect()
            assert [r.value for r in rows] == [b"after"]
        finally:
            await blocking(query.stop)
