"""One Spark application of ``bench/spark_cluster.py`` on ``local-cluster[2,1,1024]``.

A process has one SparkContext, so each run of each variant is a process of its own::

    python bench/spark_cluster_driver.py SETTINGS_JSON

``SETTINGS_JSON`` holds the ``mode``, ``work`` (the run's directory) and the mode's
settings. The process prints one ``RESULT {json}`` line when it is done: ``seconds`` and
``notes`` (``latencies`` in ms for ``latency``), or ``failed`` (a text) when a check
failed. ``latency`` also prints ``READY`` once its query is warm, for the orchestrator
to start publishing.

Modes:

* ``read`` (``address``, ``partitions``, ``rows``, ``crc``): an ``availableNow`` query on
  a standalone node that captured the messages before this process started;
* ``bridge`` (``rows``, ``seed``): the node embedded in this process with a
  ``SparkBridge``; this process publishes the messages to it, then runs
  ``bridge.sink_to(available_now=True)``;
* ``batcher`` (``rows``, ``seed``): the hand-written micro-batcher of ``bench/spark.py``
  (Arrow tables);
* ``latency`` (``address``, ``partitions``, ``warm``, ``samples``): a query on a 500 ms
  trigger against a standalone node; a ``StreamingQueryListener`` records when each
  micro-batch was committed.

Every throughput mode first reads ``WARM_ROWS`` messages with two batch reads at once
(or runs the micro-batcher once at that size), untimed, so both executors' Python
workers, their connections to the node and the JIT are warm. The timed section runs from the call that
starts the query to ``awaitTermination()`` returning.
"""

from __future__ import annotations

import json
import random
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PAYLOAD_SIZE = 100
TOPICS = 8  # bench/<i % 8>: the topics split 4 / 4 over two partitions
TOPIC_FILTER = "bench/>"
WARM_ROWS = 2_000
TRIGGER = "500 milliseconds"
MASTER = "local-cluster[2,1,1024]"
MAX_BYTES = 2_000_000_000  # nothing captured is dropped at the sizes this bench runs


class CheckFailed(Exception):
    """The output of a run does not hold every message exactly once."""


# --- shared with the orchestrator ---------------------------------------------------------


def payloads(count: int, seed: int) -> list[bytes]:
    """``count`` random (so distinct) payloads of ``PAYLOAD_SIZE`` bytes, the same for a seed."""
    blob = random.Random(seed).randbytes(count * PAYLOAD_SIZE)
    return [blob[i * PAYLOAD_SIZE : (i + 1) * PAYLOAD_SIZE] for i in range(count)]


def checksum(values: list[bytes]) -> int:
    """The sum of the values' CRC-32s, as Spark's ``sum(crc32(value))`` computes it."""
    return sum(zlib.crc32(v) for v in values)


def topic(i: int) -> str:
    return f"bench/{i % TOPICS}"


def latency_payload(seq: int) -> bytes:
    return json.dumps({"seq": seq, "t": time.time()}).encode().ljust(PAYLOAD_SIZE)


# --- Spark ------------------------------------------------------------------------------------


def start_spark() -> Any:
    from meshbus.contrib.spark import local_spark_session
    from meshbus.contrib.spark._source import MeshbusDataSource

    spark = local_spark_session(
        master=MASTER, app_name="meshbus-bench", conf={"spark.executor.memory": "512m"}
    )
    spark.dataSource.register(MeshbusDataSource)
    return spark


def check_output(spark: Any, out: Path, rows: int, crc: int) -> None:
    """Raise unless the Parquet in ``out`` holds ``rows`` distinct values summing to ``crc``."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(out))
    count, distinct, total = frame.agg(
        F.count("*"), F.countDistinct("value"), F.sum(F.crc32("value"))
    ).first()
    if (count, distinct, total) != (rows, rows, crc):
        raise CheckFailed(
            f"{count:,} rows ({distinct:,} distinct values) in the Parquet output, expected "
            f"{rows:,}" + ("" if total == crc else "; the values' checksum differs")
        )


def warm_ending(partitions: int) -> str:
    """``endingOffsets`` of a batch read of about ``WARM_ROWS`` messages."""
    return json.dumps({str(p): WARM_ROWS // partitions for p in range(partitions)})


def warm_up(read: Callable[[Path], None], work: Path) -> None:
    """Run ``read`` (a batch read into Parquet) twice at once, so that each executor
    gets a task: a read of one task leaves the other executor's Python worker to start
    inside the timed query."""
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(read, work / f"warm-{i}") for i in range(2)]:
            future.result()


def timed_query(start: Any, timeout: float) -> tuple[float, Any]:
    """Seconds from ``start()`` (which starts a query) until it terminated, and the query."""
    t0 = time.perf_counter()
    query = start()
    finished = query.awaitTermination(timeout)
    seconds = time.perf_counter() - t0
    if not finished:
        query.stop()
        raise CheckFailed(f"the query did not finish in {timeout:.0f} s")
    return seconds, query


def query_notes(query: Any, stats: dict[str, Any]) -> str:
    """The query's micro-batches, where Spark's triggers spent their time, and how many
    rows the node served to each reading process (the warm-up's included)."""
    progress = query.recentProgress
    batches = sum(1 for p in progress if p["numInputRows"])
    spent: dict[str, int] = {}
    for p in progress:
        for step, ms in p["durationMs"].items():
            spent[step] = spent.get(step, 0) + ms
    steps = ", ".join(
        f"{step} {ms / 1000:.2f}"
        for step, ms in sorted(spent.items(), key=lambda kv: -kv[1])
        if ms >= 50 and step != "triggerExecution"
    )
    rows = sorted(stats["served"].values(), reverse=True)
    return (
        f"{batches} micro-batch(es), Spark's triggers {spent.get('triggerExecution', 0) / 1000:.2f}"
        f" s ({steps}); rows served, warm-up included, to {len(rows)} reader process(es): "
        + " + ".join(f"{r:,}" for r in rows)
    )


def spark_timeout(rows: int) -> float:
    """Bound for one query of ``rows``: at least 2,000 rows/s, plus start-up."""
    return 120.0 + rows / 2_000


# --- modes -------------------------------------------------------------------------------------


def run_read(spark: Any, settings: dict[str, Any]) -> dict[str, Any]:
    from meshbus.contrib.spark._client import NodeClient, NodeTarget

    work, rows, partitions = Path(settings["work"]), settings["rows"], settings["partitions"]
    options = {
        "address": settings["address"],
        "subscribe": TOPIC_FILTER,
        "partitions": str(partitions),
        "startingOffsets": "earliest",
    }

    def warm(out: Path) -> None:
        reader = spark.read.format("meshbus").options(**options)
        reader.option("endingOffsets", warm_ending(partitions)).load().write.parquet(str(out))

    warm_up(warm, work)

    def start() -> Any:
        frame = spark.readStream.format("meshbus").options(**options, consumer="bench").load()
        writer = frame.writeStream.format("parquet").option("path", str(work / "out"))
        writer = writer.option("checkpointLocation", str(work / "ck"))
        return writer.trigger(availableNow=True).start()

    seconds, query = timed_query(start, spark_timeout(rows))
    check_output(spark, work / "out", rows, settings["crc"])
    stats, _ = NodeClient(NodeTarget((settings["address"],)), "bench").request("stats")
    return {"seconds": seconds, "notes": query_notes(query, stats)}


async def publish_in_process(node: Any, data: list[bytes]) -> None:
    import anyio

    app = node.connect(client_name="app")
    try:
        for i, payload in enumerate(data):
            app.publish(topic(i), payload)
            if i % 10_000 == 9_999:
                await anyio.sleep(0)
    finally:
        app.close()


async def bridge_run(spark: Any, settings: dict[str, Any]) -> dict[str, Any]:
    import anyio.to_thread

    from meshbus import DEFAULT_PLUGINS, Node
    from meshbus.contrib.spark import SparkBridge

    work, rows = Path(settings["work"]), settings["rows"]
    data = payloads(rows, settings["seed"])
    bridge = SparkBridge(subscribe=[TOPIC_FILTER], listen="127.0.0.1:0", max_bytes=MAX_BYTES)
    async with Node(name="benchapp", plugins=[*DEFAULT_PLUGINS, bridge]) as node:
        await publish_in_process(node, data)
        captured = bridge.stream(subscribe=[TOPIC_FILTER]).next_offset
        if captured != rows:
            raise CheckFailed(f"published {rows:,}, the bridge captured {captured:,}")

        def warm(out: Path) -> None:
            frame = bridge.read(spark, subscribe=TOPIC_FILTER, endingOffsets=warm_ending(1))
            frame.write.parquet(str(out))

        def start() -> Any:
            return bridge.sink_to(
                spark,
                subscribe=TOPIC_FILTER,
                path=str(work / "out"),
                checkpoint=str(work / "ck"),
                available_now=True,
            )

        await anyio.to_thread.run_sync(warm_up, warm, work)
        seconds, query = await anyio.to_thread.run_sync(timed_query, start, spark_timeout(rows))
        notes = query_notes(query, bridge.statistics())
    check_output(spark, work / "out", rows, checksum(data))
    return {"seconds": seconds, "notes": notes}


def run_bridge(spark: Any, settings: dict[str, Any]) -> dict[str, Any]:
    import anyio

    result: dict[str, Any] = anyio.run(bridge_run, spark, settings)
    return result


def run_batcher(spark: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """``bench/spark.py``'s ``arrow micro-batcher``: an in-process subscription buffers
    what the app publishes as fast as it can, and a loop every 500 ms appends what arrived
    to Parquet with ``createDataFrame(pyarrow.Table)``; first publish -> last batch written."""
    import anyio
    from spark import pipeline_baseline  # bench/spark.py, next to this file

    work, rows = Path(settings["work"]), settings["rows"]
    data = payloads(rows, settings["seed"])
    anyio.run(pipeline_baseline, spark, payloads(WARM_ROWS, 0), work / "warm", True)
    run = anyio.run(pipeline_baseline, spark, data, work / "timed", True)
    check_output(spark, work / "timed" / "arrow-out", rows, checksum(data))
    return {"seconds": run.seconds, "notes": run.notes}


def progress_recorder() -> Any:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    from meshbus.contrib.spark._listener import committed_offsets

    class ProgressRecorder(StreamingQueryListener):
        """``(time.time(), next offset by partition)`` of each progress event, as the
        driver sees it: the batch it reports is committed, its rows visible."""

        def __init__(self) -> None:
            self.events: list[tuple[float, dict[str, int]]] = []
            self.batch_ms: list[tuple[int, int]] = []  # rows, triggerExecution ms

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            now, progress = time.time(), event.progress
            rows = int(progress.numInputRows)
            self.batch_ms.append((rows, int(progress.durationMs.get("triggerExecution", 0))))
            for _stream, _consumer, next_offsets in committed_offsets(progress):
                self.events.append((now, next_offsets))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

        def reached(self) -> int:
            """How many messages the committed batches hold, over every partition."""
            return sum(self.events[-1][1].values()) if self.events else 0

        def visible_at(self, partition: int, offset: int) -> float | None:
            key = str(partition)
            return next((t for t, ends in self.events if ends.get(key, 0) > offset), None)

    return ProgressRecorder()


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise CheckFailed(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.01)


def latencies(spark: Any, out: Path, recorder: Any, samples: int) -> list[float]:
    """Publish -> visible of each sample, in ms, from the Parquet output (each once)."""
    found: dict[int, float] = {}
    for row in spark.read.parquet(str(out)).select("value", "partition", "offset").collect():
        body = json.loads(bytes(row.value).rstrip())
        if body["seq"] in found:
            raise CheckFailed(f"sample {body['seq']} is in the Parquet output twice")
        visible = recorder.visible_at(row.partition, row.offset)
        if visible is None:
            raise CheckFailed(f"sample {body['seq']} was never reported committed")
        found[body["seq"]] = (visible - body["t"]) * 1000
    missing = samples - sum(1 for seq in found if seq >= 0)
    if missing:
        raise CheckFailed(f"{missing:,} of {samples:,} samples missing from the Parquet output")
    return [ms for seq, ms in found.items() if seq >= 0]


def run_latency(spark: Any, settings: dict[str, Any]) -> dict[str, Any]:
    work, warm, samples = Path(settings["work"]), settings["warm"], settings["samples"]
    recorder = progress_recorder()
    spark.streams.addListener(recorder)
    options = {
        "address": settings["address"],
        "subscribe": TOPIC_FILTER,
        "partitions": str(settings["partitions"]),
        "startingOffsets": "earliest",
        "consumer": "bench",
    }
    frame = spark.readStream.format("meshbus").options(**options).load()
    writer = frame.writeStream.format("parquet").option("path", str(work / "out"))
    writer = writer.option("checkpointLocation", str(work / "ck")).trigger(processingTime=TRIGGER)
    query = writer.start()
    try:
        wait_until(lambda: recorder.reached() >= warm, 180, "the warm-up messages")
        time.sleep(1.5)  # three empty triggers: the steady state of a running pipeline
        print("READY", flush=True)
        wait_until(lambda: recorder.reached() >= warm + samples, 300, "the last sample")
    finally:
        query.stop()
    took = sorted([ms for rows, ms in recorder.batch_ms if rows][1:])  # not the warm-up's
    return {
        "latencies": latencies(spark, work / "out", recorder, samples),
        "notes": f"{len(took)} micro-batches of median {took[len(took) // 2]:,} ms"
        if took
        else "no micro-batch",
    }


MODES = {"read": run_read, "bridge": run_bridge, "batcher": run_batcher, "latency": run_latency}


def main() -> None:
    settings: dict[str, Any] = json.loads(sys.argv[1])
    spark = start_spark()
    try:
        result = MODES[settings["mode"]](spark, settings)
    except CheckFailed as exc:
        result = {"failed": str(exc)}
    print("RESULT", json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
