"""Kafka's source and sink options on format("meshbus"), through Spark (local mode)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from meshbus.contrib.spark._streams import StreamSpec, partition_of

from .conftest import blocking, running_bridge, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def values(rows: list[Any]) -> list[str]:
    return sorted(r.value.decode() for r in rows)


async def test_a_batch_read_takes_offsets_per_partition_from_json(spark: Any) -> None:
    async with running_bridge(subscribe=["m/>"], partitions=2) as (node, bridge):
        app = node.connect(client_name="app")
        sent: dict[int, list[str]] = {0: [], 1: []}
        for i in range(40):
            app.publish(f"m/{i % 10}", f"v{i}")
            partition = partition_of_topic(f"m/{i % 10}")
            sent[partition].append(f"v{i}")
        options = {
            "subscribe": "m/>",
            "partitions": "2",
            "startingOffsets": '{"0": 2, "1": -2}',
            "endingOffsets": '{"0": 5, "1": -1}',
        }
        frame = await blocking(lambda: bridge.read(spark, **options))
        rows = await blocking(frame.collect)
        assert values(rows) == sorted(sent[0][2:5] + sent[1])
        assert {r.partition for r in rows} == {0, 1}


def partition_of_topic(topic: str) -> int:
    from meshbus import Message

    return partition_of(Message(topic, b""), 2)


async def test_a_read_can_start_at_a_time(spark: Any) -> None:
    async with running_bridge(subscribe=["t/>"]) as (node, bridge):
        app = node.connect(client_name="app")
        for i in range(5):
            app.publish("t/old", f"old-{i}")
        await wait_for(lambda: bridge.stream(subscribe=["t/>"]).next_offset == 5)
        bridge.stream(subscribe=["t/>"]).seal()  # the old ones in a segment of their own
        middle = int(time.time() * 1000) + 5
        while int(time.time() * 1000) <= middle:
            time.sleep(0.002)
        for i in range(3):
            app.publish("t/new", f"new-{i}")
        frame = await blocking(
            lambda: bridge.read(spark, subscribe="t/>", startingTimestamp=str(middle))
        )
        assert values(await blocking(frame.collect)) == ["new-0", "new-1", "new-2"]


async def test_a_stream_starts_at_latest_unless_told_otherwise(spark: Any, tmp_path: Any) -> None:
    async with running_bridge(subscribe=["s/>"]) as (node, bridge):
        bridge.attach(spark)
        app = node.connect(client_name="app")
        for i in range(5):
            app.publish("s/x", f"before-{i}")
        await wait_for(lambda: bridge.stream(subscribe=["s/>"]).next_offset == 5)

        def start() -> Any:
            return (
                spark.readStream.format("meshbus")
                .options(**bridge.connect_options, subscribe="s/>")
                .load()
                .writeStream.format("memory")
                .queryName("latest_default")
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(processingTime="200 milliseconds")
                .start()
            )

        query = await blocking(start)
        try:
            await wait_for(lambda: query.lastProgress is not None)
            app.publish("s/x", "after")
            table = "select value from latest_default"
            await wait_for(lambda: len(spark.sql(table).collect()) >= 1)
            assert [r.value for r in spark.sql(table).collect()] == [b"after"]
        finally:
            await blocking(query.stop)


async def test_min_offsets_per_trigger_waits_for_enough_rows(spark: Any, tmp_path: Any) -> None:
    async with running_bridge(subscribe=["few/>"]) as (node, bridge):
        app = node.connect(client_name="app")
        frame = await blocking(
            lambda: bridge.read_stream(
                spark, subscribe="few/>", minOffsetsPerTrigger="10", maxTriggerDelay="10m"
            )
        )
        query = await blocking(
            lambda: (
                frame.writeStream.format("memory")
                .queryName("min_rows")
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(processingTime="100 milliseconds")
                .start()
            )
        )
        try:
            for i in range(6):
                app.publish("few/x", f"a{i}")
            time.sleep(2)  # twenty triggers: none may take fewer than ten rows
            assert spark.sql("select * from min_rows").count() == 0
            for i in range(4):
                app.publish("few/x", f"b{i}")
            await wait_for(lambda: spark.sql("select * from min_rows").count() == 10)
        finally:
            await blocking(query.stop)


async def test_overwrite_and_a_partition_column_are_refused(spark: Any) -> None:
    async with running_bridge() as (_, bridge):
        frame = spark.createDataFrame([("v", "out/x")], "value string, topic string")

        def overwrite() -> None:
            bridge.attach(spark)  # registers the data source for this thread's session
            frame.write.format("meshbus").options(**bridge.connect_options).mode("overwrite").save()

        with pytest.raises(Exception, match="only appends"):
            await blocking(overwrite)
        placed = spark.createDataFrame(
            [("v", "out/x", 1)], "value string, topic string, partition int"
        )
        with pytest.raises(Exception, match="option 'partition'"):
            await blocking(lambda: bridge.write(placed))
        assert bridge.statistics()["published"] == 0


def test_stream_ids_name_their_partitions() -> None:
    assert StreamSpec(subscribe=("a/>",), partitions=3).id == "a/>#3"
    assert StreamSpec(queue="q").id == "queue:q"


async def test_a_queue_stream_starts_at_earliest_so_nothing_is_acked_unread(
    spark: Any, tmp_path: Any
) -> None:
    async with running_bridge(queues=["jobs"]) as (node, bridge):
        queue = node.guaranteed.create_queue("jobs", subscriptions=["jobs/>"])
        app = node.connect(client_name="app")
        for i in range(3):
            await app.send("jobs/x", f"held-{i}")

        def run() -> list[Any]:
            bridge.attach(spark)
            (
                spark.readStream.format("meshbus")
                .options(**bridge.connect_options, queue="jobs")
                .load()
                .writeStream.format("parquet")
                .option("path", str(tmp_path / "out"))
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True)
                .start()
                .awaitTermination()
            )
            return spark.read.parquet(str(tmp_path / "out")).collect()

        assert values(await blocking(run)) == ["held-0", "held-1", "held-2"]
        await wait_for(lambda: queue.usage()[0] == 0)
