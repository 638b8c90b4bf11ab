"""format("meshbus") as a Spark sink: staged writes published once per committed batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import blocking, running_bridge

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def drain(session: Any) -> list[Any]:
    received = []
    while (message := session.receive_nowait()) is not None:
        received.append(message)
    return received


async def test_batch_write_publishes_rows_with_key_and_headers(spark: Any) -> None:
    async with running_bridge() as (node, bridge):
        listener = node.connect(client_name="listener")
        listener.subscribe("out/>")
        frame = spark.createDataFrame(
            [(b"one", "out/a", "k1", [("region", b"eu")]), (b"two", "out/b", None, [])],
            "value binary, topic string, key string,"
            " headers array<struct<key:string,value:binary>>",
        )
        await blocking(lambda: bridge.write(frame))
        received = sorted(drain(listener), key=lambda m: m.topic)
        assert [(m.topic, m.payload, m.correlation_id) for m in received] == [
            ("out/a", b"one", "k1"),
            ("out/b", b"two", None),
        ]
        assert dict(received[0].headers) == {"region": "eu"}
        assert all(m.timestamp is not None for m in received)  # stamped when published
        assert bridge.statistics()["published"] == 2


async def test_topic_option_wins_over_the_column(spark: Any) -> None:
    async with running_bridge() as (node, bridge):
        listener = node.connect(client_name="listener")
        listener.subscribe(">")
        frame = spark.createDataFrame([("v", "ignored/topic")], "value string, topic string")
        await blocking(lambda: bridge.write(frame, topic="chosen/topic"))
        assert [(m.topic, m.payload) for m in drain(listener)] == [("chosen/topic", b"v")]


def write_input(directory: Path, name: str, rows: range) -> None:
    directory.mkdir(exist_ok=True)
    lines = "\n".join(json.dumps({"n": i}) for i in rows)
    (directory / f"{name}.json").write_text(lines + "\n")


async def test_write_stream_publishes_each_batch_once_across_a_replay(
    spark: Any, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    write_input(source, "a", range(0, 10))
    checkpoint = tmp_path / "ck"

    def run() -> None:
        frame = (
            spark.readStream.schema("n long")
            .json(str(source))
            .selectExpr(
                "cast(n as string) as value", "concat('out/', cast(n % 2 as string)) as topic"
            )
        )
        bridge.write_stream(frame, checkpoint=str(checkpoint)).trigger(
            availableNow=True
        ).start().awaitTermination()

    async with running_bridge() as (node, bridge):
        listener = node.connect(client_name="listener")
        listener.subscribe("out/>")
        await blocking(run)
        assert sorted(int(m.payload) for m in drain(listener)) == list(range(10))
        write_input(source, "b", range(10, 15))
        await blocking(run)
        assert sorted(int(m.payload) for m in drain(listener)) == list(range(10, 15))

        # A crash after the sink published batch 1 but before Spark logged its commit:
        # Spark runs batch 1 again on restart, and the sink must not publish it twice.
        commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: p.name)
        last = [p for p in commits if p.name.isdigit()][-1]
        last.unlink()
        (checkpoint / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
        await blocking(run)
        assert drain(listener) == []
        assert list(bridge.statistics()["sinks"].values()) == [int(last.name)]


async def test_write_stream_persistent_mode_lands_in_a_queue(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "in"
    write_input(source, "a", range(5))

    async with running_bridge(tmp_path / "node") as (node, bridge):
        queue = node.guaranteed.create_queue("archive", subscriptions=["archive/>"])

        def run() -> None:
            frame = (
                spark.readStream.schema("n long")
                .json(str(source))
                .selectExpr("cast(cast(n as string) as binary) as value")
            )
            writer = bridge.write_stream(
                frame,
                checkpoint=str(tmp_path / "ck"),
                topic="archive/numbers",
                deliveryMode="persistent",
            )
            writer.trigger(availableNow=True).start().awaitTermination()

        await blocking(run)
        assert queue.usage()[0] == 5


async def test_a_write_without_topic_fails_naming_it(spark: Any, tmp_path: Path) -> None:
    async with running_bridge() as (_, bridge):
        frame = spark.createDataFrame([("v",)], "value string")
        with pytest.raises(Exception, match="option 'topic'"):
            await blocking(lambda: bridge.write(frame))
        with pytest.raises(Exception, match="option 'value'"):
            await blocking(lambda: bridge.write(spark.createDataFrame([(1,)], "n int"), topic="t"))


async def test_a_bad_row_fails_the_write_and_publishes_nothing(spark: Any) -> None:
    async with running_bridge() as (node, bridge):
        listener = node.connect(client_name="listener")
        listener.subscribe(">")
        frame = spark.createDataFrame(
            [("fine", "out/1"), ("bad", None), ("fine too", "out/2")], "value string, topic string"
        )
        with pytest.raises(Exception, match="topic is null"):
            await blocking(lambda: bridge.write(frame.coalesce(1)))
        assert drain(listener) == []
        assert bridge.statistics()["staged"] == 0
