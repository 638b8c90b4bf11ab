"""An app feeds Spark through meshbus and reads the result back (SPEC 11).

The app publishes page views as guaranteed messages; a queue holds them. Spark reads
the queue through the ``meshbus`` data source, parses the JSON, and a streaming query
writes the events to Parquet with a checkpoint. Only after Spark committed the batch
does the bridge acknowledge the messages, so the queue is empty once the data is
safely in Parquet (a crash before that would leave them queued). A batch job then
aggregates the events into a report, the app reads the report's Parquet files with
pyarrow, and Spark publishes the report rows back onto the bus, where the app's
subscription receives them.

Needs ``pip install 'meshbus[spark]'`` and Java 17. Run it with
``python examples/spark_pipeline.py``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import anyio
import pyarrow.parquet as pq

from meshbus import DEFAULT_PLUGINS, Node
from meshbus.contrib.spark import SparkBridge, local_spark_session

PAGES = ["/home", "/pricing", "/docs"]


def page_view(i: int) -> dict[str, object]:
    return {"user": f"u{i % 7}", "page": PAGES[i % 5 % 3], "ms": 50 + (i * 37) % 200}


async def main() -> None:
    if shutil.which("java") is None:
        print("this example needs Java 17 for Spark: java was not found")
        return
    work = Path(tempfile.mkdtemp(prefix="meshbus-spark-"))
    bridge = SparkBridge(queues=["clicks"], listen="127.0.0.1:0")
    async with Node(plugins=[*DEFAULT_PLUGINS, bridge], data_dir=work / "node") as node:
        queue = node.guaranteed.create_queue("clicks", subscriptions=["clicks/>"])
        app = node.connect(client_name="web-app")
        app.subscribe("reports/>")
        views = [page_view(i) for i in range(600)]
        failures = await app.send_many((f"clicks{v['page']}", json.dumps(v)) for v in views)
        assert not any(failures)
        print(f"app sent {len(views)} page views; queue 'clicks' holds {queue.usage()[0]}")

        # Spark calls block: run them in a worker thread so the node keeps serving.
        spark = await anyio.to_thread.run_sync(local_spark_session)
        events, report = str(work / "events"), str(work / "report")

        def ingest() -> None:
            def parse(frame):  # Kafka-like columns in, typed events out
                return frame.selectExpr(
                    "topic",
                    "timestamp",
                    "from_json(cast(value as string), 'user string, page string, ms int') as e",
                ).select("topic", "timestamp", "e.*")

            query = bridge.sink_to(
                spark,
                queue="clicks",
                transform=parse,
                path=events,
                checkpoint=str(work / "checkpoint"),
                available_now=True,
            )
            query.awaitTermination()

        await anyio.to_thread.run_sync(ingest)
        with anyio.fail_after(10):  # acknowledged right after Spark's commit
            while queue.usage()[0]:
                await anyio.sleep(0.02)
        print(f"spark wrote the events to Parquet; queue 'clicks' now holds {queue.usage()[0]}")

        def aggregate() -> None:
            frame = spark.read.parquet(events)
            totals = frame.groupBy("page").agg({"*": "count", "ms": "avg"})
            totals = totals.withColumnRenamed("count(1)", "views")
            totals = totals.withColumnRenamed("avg(ms)", "avg_ms")
            totals.coalesce(1).write.mode("overwrite").parquet(report)
            # ...and back onto the bus: one message per page, published on commit.
            bridge.write(
                totals.selectExpr(
                    "concat('reports/pages', page) as topic",
                    "to_json(struct(page, views, round(avg_ms, 1) as avg_ms)) as value",
                )
            )

        await anyio.to_thread.run_sync(aggregate)
        print("report read back by the app (pyarrow, no Spark):")
        for row in sorted(pq.read_table(report).to_pylist(), key=lambda r: r["page"]):
            print(f"  {row['page']:<9} {row['views']:>4} views  avg {row['avg_ms']:.1f} ms")
        with anyio.fail_after(10):
            received = sorted([await app.receive() for _ in PAGES], key=lambda m: m.topic)
        for message in received:
            print(f"app received {message.topic}: {message.payload.decode()}")
        await anyio.to_thread.run_sync(spark.stop)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    anyio.run(main)
