"""Spark connector: bus -> Parquet, publish -> visible latency and Spark -> bus, against
the PySpark code an app would write without the connector.

Run from the checkout with a virtualenv that has the spark extra (``pip install -e
'.[dev,bench,spark]'``) and Java 17 on PATH::

    .venv/bin/python bench/spark.py                  # N=1,000,000/200,000, best of 3: ~4 min
    .venv/bin/python bench/spark.py --quick          # N=20,000, 15 latency samples, once: ~40 s
    .venv/bin/python bench/spark.py --only latency   # one phase (pipeline, throughput,
                                                     # latency, write)

One line per figure. A benchmark, not a test: a missed target is a figure like any
other (exit 0), but a failed correctness check (rows missing or duplicated in the
Parquet output, messages missing on the bus) is printed as ``failed`` instead of a
number and makes the exit status 1.

Every phase shares one local SparkSession (``local_spark_session()``: local[2], the
connector's small-batch settings) and runs a Node with a ``SparkBridge`` on a free
loopback port in this process; blocking Spark calls run in a worker thread
(``anyio.to_thread``), as apps must. Times are wall clock (``perf_counter``): the work
is spread over the JVM and Spark's Python workers. Before each phase every path runs
once, untimed, at a small size, so JVM start, JIT and worker spawning are not in the
figures (the output says how long that took).

* ``pipeline`` (the target): a pipeline as it runs in production, already started and
  idle. The app publishes N messages of 100 bytes to ``events/<i%8>`` as fast as it
  can, and the figure is N over the time from the first publish to the moment the
  last message is committed in Parquet. Twice: a sustained burst (N=1,000,000, about
  five seconds of traffic: the per-message cost decides it, and the target is judged
  on it) and a short one (N=200,000, context: the trigger's fixed latency, which the
  latency figure measures on its own, weighs as much as the messages):

  - ``connector``: a running ``bridge.sink_to(..., trigger="500 milliseconds")``;
    "committed" is the query's progress event (a ``StreamingQueryListener`` in this
    process) whose meshbus offset covers the last message;
  - ``plain micro-batcher``: the same pipeline written by hand, the
    ``foreachBatch(createDataFrame(...).write.parquet)`` way: the app's subscription
    buffers messages, and a loop on the same 500 ms trigger turns what arrived into a
    list of tuples with the connector's seven columns,
    ``spark.createDataFrame(rows, schema).write.mode("append").parquet(path)``;
  - ``arrow micro-batcher``: the same loop building a ``pyarrow.Table`` instead.

  Each output is checked to hold every message once. Target: connector >= 2x the
  plain micro-batcher.
* ``throughput`` (context): one-off ``availableNow`` queries, query start included
  (about 0.8 s of Spark setting up a Python streaming source). An app session
  publishes N messages of 100 bytes to ``events/<i%8>``
  on a fresh node whose bridge captures ``events/>``; a collector session
  (``on_message=list.append``) captures the same messages for the baselines. Untimed
  so far. Then, timed and interleaved in rotating order on the same messages, each
  into its own fresh Parquet directory:

  - ``connector``: ``bridge.sink_to(spark, subscribe="events/>", path=...,
    checkpoint=..., available_now=True)``, from the call to ``awaitTermination()``
    (one micro-batch of N). The bridge's log turns captured messages into Arrow every
    65,536 messages while they are published, outside this time: a second line,
    ``incl. capture``, adds that conversion (timed on the same messages);
  - ``plain tuples B``: per batch of B collected messages, a list of tuples with the
    connector's seven Kafka-like columns (key, value, topic, partition, offset,
    timestamp, timestampType) -> ``spark.createDataFrame(rows, schema)
    .write.mode("append").parquet(path)``: what ``foreachBatch`` code looks like
    written by hand. B = N (one batch, as the connector's availableNow batch) and
    ``--batch`` (10,000);
  - ``arrow table B``: the same columns built as a ``pyarrow.Table`` and
    ``spark.createDataFrame(table)``: the fastest hand-written path.

  Each run is checked: the Parquet output (``spark.read.parquet(path)``) holds N rows
  with offsets 0..N-1 once each, and the connector's column names and types. The
  ratios are context (the target is judged on ``pipeline``).
* ``latency``: ``bridge.sink_to(..., trigger="500 milliseconds")`` into Parquet. One
  warm-up message (not counted) must become visible and the query must then idle for
  three triggers; then one message every 200 ms, its payload carrying ``time.time()``
  at publish. A ``StreamingQueryListener`` in this process records, for each progress
  event of the query, ``time.time()`` and the ``next`` of the meshbus source's end
  offset; a message with offset o is visible at the first event with next > o.
  p50/p90/max of publish -> visible; target p50 <= 1,500 ms. Then every sample must be
  in the Parquet output exactly once.
* ``write``: N rows (value binary 100 B, topic ``out/<i%8>``) prepared as 4 Parquet
  files with pyarrow (untimed); ``bridge.write_stream(spark.readStream.schema(...)
  .parquet(dir), checkpoint=...).trigger(availableNow=True).start()`` timed until the
  query terminated and a counting session on the node (sync ``on_message``) has all N;
  also the batch ``bridge.write(spark.read.schema(...).parquet(dir))``. Checked: exactly
  N messages arrive, carrying the N (distinct, random) payloads once each.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from _harness import payloads
from _spark_common import (
    PAYLOAD_SIZE,
    PHASES,
    THROUGHPUT_TARGET,
    TOPICS,
    TRIGGER,
    WARM,
    CheckFailed,
    Figure,
    Report,
    blocking,
    bridged_node,
    failure,
    progress_recorder,
    rate_text,
    ratio,
    say,
    spark_timeout,
    wait_until,
)
from _spark_latency import latency_phase
from _spark_write import write_phase

from meshbus import Message, Node

# --- throughput: bus -> Parquet --------------------------------------------------------


def _key(message: Message) -> bytes | None:
    correlation = message.options.correlation_id
    return None if correlation is None else correlation.encode()


def plain_rows(messages: list[Message], first: int) -> list[tuple[Any, ...]]:
    """The seven Kafka-like columns as tuples, as hand-written code builds them."""
    return [
        (
            _key(m),
            m.payload,
            m.topic,
            0,
            first + i,
            datetime.fromtimestamp(m.timestamp, UTC),
            0,
        )
        for i, m in enumerate(messages)
    ]


def arrow_table(messages: list[Message], first: int) -> Any:
    """The same columns as a pyarrow Table (Spark's Arrow types: int32, UTC timestamps)."""
    import pyarrow as pa

    n = len(messages)
    return pa.table(
        {
            "key": pa.array([_key(m) for m in messages], pa.binary()),
            "value": pa.array([m.payload for m in messages], pa.binary()),
            "topic": pa.array([m.topic for m in messages], pa.string()),
            "partition": pa.repeat(pa.scalar(0, pa.int32()), n),
            "offset": pa.array(range(first, first + n), pa.int64()),
            "timestamp": pa.array(
                [round(m.timestamp * 1_000_000) for m in messages], pa.timestamp("us", tz="UTC")
            ),
            "timestampType": pa.repeat(pa.scalar(0, pa.int32()), n),
        }
    )


def plain_schema() -> Any:
    """The Spark schema the hand-written paths declare: the connector's own columns."""
    from meshbus.contrib.spark import spark_schema

    return spark_schema(include_headers=False)


def check_parquet(spark: Any, path: Path, expected: int) -> list[tuple[str, str]]:
    """Raise unless ``path`` holds offsets 0 .. expected-1 once each; return its columns."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(path))
    rows, distinct, low, high = frame.agg(
        F.count("*"), F.countDistinct("offset"), F.min("offset"), F.max("offset")
    ).collect()[0]
    if (rows, distinct, low, high) != (expected, expected, 0, expected - 1):
        raise CheckFailed(
            f"{rows:,} rows ({distinct:,} distinct offsets, {low}..{high}) in the Parquet "
            f"output, expected {expected:,} (0..{expected - 1})"
        )
    return [(f.name, f.dataType.simpleString()) for f in frame.schema]


@dataclass
class Run:
    seconds: float
    columns: list[tuple[str, str]]
    notes: str = ""


def run_connector(spark: Any, bridge: Any, out: Path, n: int) -> Run:
    t0 = time.perf_counter()
    query = bridge.sink_to(
        spark,
        subscribe="events/>",
        path=str(out),
        checkpoint=str(out) + ".ck",
        available_now=True,
    )
    finished = query.awaitTermination(spark_timeout(n))
    elapsed = time.perf_counter() - t0
    if not finished:
        query.stop()
        raise CheckFailed(f"the query did not finish in {spark_timeout(n):.0f} s")
    progress = query.recentProgress
    batches = [p["numInputRows"] for p in progress if p["numInputRows"]]
    columns = check_parquet(spark, out, n)
    spent: dict[str, int] = {}
    for p in progress:
        for step, ms in p["durationMs"].items():
            spent[step] = spent.get(step, 0) + ms
    steps = ", ".join(
        f"{step} {ms / 1000:.2f}"
        for step, ms in sorted(spent.items(), key=lambda kv: -kv[1])
        if ms >= 50 and step != "triggerExecution"
    )
    notes = (
        f"{len(batches)} micro-batch{'es' if len(batches) != 1 else ''}; Spark's triggers "
        f"{spent.get('triggerExecution', 0) / 1000:.2f} s of it ({steps})"
    )
    return Run(elapsed, columns, notes)


def run_plain(spark: Any, messages: list[Message], batch: int, out: Path) -> Run:
    schema = plain_schema()
    t0 = time.perf_counter()
    for lo in range(0, len(messages), batch):
        rows = plain_rows(messages[lo : lo + batch], lo)
        spark.createDataFrame(rows, schema).write.mode("append").parquet(str(out))
    elapsed = time.perf_counter() - t0
    return Run(elapsed, check_parquet(spark, out, len(messages)))


def run_arrow(spark: Any, messages: list[Message], batch: int, out: Path) -> Run:
    t0 = time.perf_counter()
    for lo in range(0, len(messages), batch):
        table = arrow_table(messages[lo : lo + batch], lo)
        spark.createDataFrame(table).write.mode("append").parquet(str(out))
    elapsed = time.perf_counter() - t0
    return Run(elapsed, check_parquet(spark, out, len(messages)))


def seal_rows() -> int:
    from meshbus.contrib.spark._log import SEAL_ROWS

    return SEAL_ROWS


def sealing_cost(messages: list[Message]) -> float:
    """Seconds the bridge spent turning ``messages`` into Arrow while they were published.

    The log seals its tail whenever it reaches ``SEAL_ROWS`` (in the publisher's call);
    only the rest is converted inside the query. Timed here on the same messages with
    the connector's own conversion (private API: update it if that moves).
    """
    from meshbus.contrib.spark._columns import messages_to_batch

    sealed = len(messages) // seal_rows() * seal_rows()
    t0 = time.perf_counter()
    for lo in range(0, sealed, seal_rows()):
        messages_to_batch(messages[lo : lo + seal_rows()], lo)
    return time.perf_counter() - t0


async def publish_events(node: Node, data: list[bytes]) -> None:
    app = node.connect(client_name="app", timestamps=True)  # event time for the rows
    try:
        for i, payload in enumerate(data):
            app.publish(f"events/{i % TOPICS}", payload)
            if i % 10_000 == 9_999:
                await anyio.sleep(0)
    finally:
        app.close()


def throughput_names(n: int, batch: int) -> list[str]:
    names = ["connector", f"plain tuples B={n:,}", f"plain tuples B={batch:,}"]
    names += [f"arrow table B={n:,}", f"arrow table B={batch:,}"]
    return list(dict.fromkeys(names))  # B may equal N


async def throughput_round(
    spark: Any, work: Path, data: list[bytes], batch: int, shift: int
) -> tuple[dict[str, Run | BaseException], float]:
    """Publish ``data`` once on a fresh node, then run every path on it, rotated by ``shift``.

    A path fails its run when its output lacks rows or its columns differ from the
    connector's.
    """
    n = len(data)
    work.mkdir(parents=True, exist_ok=True)
    async with bridged_node(subscribe=["events/>"]) as (node, bridge):
        collected: list[Message] = []
        collector = node.connect(client_name="collector", on_message=collected.append)
        collector.subscribe("events/>")
        await publish_events(node, data)
        captured = bridge.stream(subscribe=["events/>"]).next_offset
        if len(collected) != n or captured != n:
            raise CheckFailed(f"published {n:,}: collected {len(collected):,}, bridge {captured:,}")
        capture = sealing_cost(collected)

        impls: dict[str, Callable[[Path], Run]] = {
            "connector": lambda out: run_connector(spark, bridge, out, n),
            f"plain tuples B={n:,}": lambda out: run_plain(spark, collected, n, out),
            f"plain tuples B={batch:,}": lambda out: run_plain(spark, collected, batch, out),
            f"arrow table B={n:,}": lambda out: run_arrow(spark, collected, n, out),
            f"arrow table B={batch:,}": lambda out: run_arrow(spark, collected, batch, out),
        }
        names = throughput_names(n, batch)
        shift %= len(names)
        results: dict[str, Run | BaseException] = {}
        for i, name in enumerate(names[shift:] + names[:shift]):
            out = work / f"out-{i}"
            try:
                results[name] = await blocking(lambda name=name, out=out: impls[name](out))
            except Exception as exc:
                results[name] = exc
    reference = results.get("connector")
    if isinstance(reference, Run):
        for name, result in results.items():
            if isinstance(result, Run) and result.columns != reference.columns:
                results[name] = CheckFailed(
                    f"columns {result.columns} differ from the connector's {reference.columns}"
                )
    return results, capture


async def throughput_phase(
    spark: Any, args: argparse.Namespace, work: Path, report: Report
) -> None:
    n, batch = args.messages, args.batch
    warm_n = min(WARM, n)
    t0 = time.perf_counter()
    warm, _ = await throughput_round(
        spark, work / "warm", payloads(warm_n, PAYLOAD_SIZE), min(500, warm_n), 0
    )
    warm_failed = {k: v for k, v in warm.items() if isinstance(v, BaseException)}
    report.failures += [f"spark throughput warm-up {k}" for k in warm_failed]
    failed_text = "; ".join(f"{k} {failure(v)}" for k, v in warm_failed.items())
    say(
        f"# throughput warm-up: every path once at N={warm_n:,} (B={min(500, warm_n):,}), "
        f"untimed: {time.perf_counter() - t0:.1f} s (JVM JIT, Python workers, first data "
        "source use)" + (f"; FAILED: {failed_text}" if warm_failed else "")
    )
    data = payloads(n, PAYLOAD_SIZE)
    figures = {name: Figure() for name in throughput_names(n, batch)}
    captures = []
    for r in range(args.rounds):
        results, capture = await throughput_round(spark, work / f"round-{r}", data, batch, r)
        captures.append(capture)
        for name, result in results.items():
            fig = figures[name]
            if isinstance(result, BaseException):
                fig.error = fig.error or result
            else:
                fig.rates.append(n / result.seconds)
                fig.notes = result.notes

    connector = figures["connector"].best
    plain_same = figures[f"plain tuples B={n:,}"].best
    common = f"N={n:,} x {PAYLOAD_SIZE} B, best of {args.rounds}, wall clock"
    for name, fig in figures.items():
        label = f"spark throughput {name}"
        if fig.best is None:
            report.failed(label, fig.error or CheckFailed("no run"))
            continue
        if name == "connector":
            capture = min(captures)
            with_capture = n / (n / fig.best + capture)
            say(
                f"{label}: {rate_text(fig.best)} msg/s = {ratio(fig.best, plain_same)} plain "
                f"tuples B={n:,} (context; one-off sink_to availableNow -> Parquet including "
                f"query start, {fig.notes}; {common})"
            )
            if n >= seal_rows():
                say(
                    f"spark throughput connector incl. capture: {rate_text(with_capture)} msg/s "
                    f"= {ratio(with_capture, plain_same)} plain tuples B={n:,} (context: adds "
                    f"the {capture:.2f} s of Arrow conversion that ran on the publish path, "
                    f"untimed above, as the bridge's log seals every {seal_rows():,} captured "
                    "messages; the baselines convert inside their timed section)"
                )
        else:
            kind = "createDataFrame(list of tuples, schema)"
            if name.startswith("arrow"):
                kind = "createDataFrame(pyarrow.Table), the fastest hand-written path,"
            say(
                f"{label}: {rate_text(fig.best)} msg/s; connector/this = "
                f"{ratio(connector, fig.best)} (hand-written: {kind} "
                ".write.mode('append').parquet per batch of B; "
                f"{common})"
            )


# --- pipeline: a running query, steady state ------------------------------------------


def micro_batcher(
    spark: Any, pending: deque[Message], n: int, out: Path, arrow: bool, interval: float
) -> int:
    """The hand-written pipeline: every ``interval`` take what arrived and write it.

    This is what an app does without the connector: its subscription buffers messages,
    and a loop on the same trigger turns each batch into a DataFrame and appends it to
    Parquet. Returns the number of batches written.
    """
    schema = plain_schema()
    written = batches = 0
    tick = time.monotonic()
    while written < n:
        tick += interval
        time.sleep(max(0.0, tick - time.monotonic()))
        take = len(pending)
        if not take:
            continue
        batch = [pending.popleft() for _ in range(take)]
        frame = (
            spark.createDataFrame(arrow_table(batch, written))
            if arrow
            else spark.createDataFrame(plain_rows(batch, written), schema)
        )
        frame.write.mode("append").parquet(str(out))
        written += take
        batches += 1
    return batches


async def pipeline_connector(spark: Any, data: list[bytes], work: Path) -> Run:
    n = len(data)
    recorder = progress_recorder()
    out, ck = work / "connector-out", work / "connector-ck"
    async with bridged_node(subscribe=["events/>"]) as (node, bridge):
        await blocking(lambda: (bridge.attach(spark), spark.streams.addListener(recorder)))
        query = await blocking(
            lambda: bridge.sink_to(
                spark, subscribe="events/>", path=str(out), checkpoint=str(ck), trigger=TRIGGER
            )
        )
        try:
            query_id = str(query.id)
            app = node.connect(client_name="warm")
            app.publish("events/warm", b"warm")  # offset 0: the query is running and warm
            await wait_until(lambda: recorder.reached(query_id) >= 1, 180, "warm-up message")
            await anyio.sleep(1.0)  # idle triggers: the steady state a pipeline lives in
            t0 = time.time()
            await publish_events(node, data)
            await wait_until(
                lambda: recorder.reached(query_id) >= n + 1, spark_timeout(n), "the last message"
            )
            visible = recorder.visible_at(query_id, n)
            assert visible is not None
        finally:
            await blocking(query.stop)
            await blocking(lambda: spark.streams.removeListener(recorder))
    columns = await blocking(lambda: check_parquet(spark, out, n + 1))
    batches = len([e for e in recorder.events if e[1] == query_id and e[3] > 0]) - 1
    return Run(visible - t0, columns, f"{batches} micro-batches")


async def pipeline_baseline(spark: Any, data: list[bytes], work: Path, arrow: bool) -> Run:
    n = len(data)
    out = work / ("arrow-out" if arrow else "plain-out")
    pending: deque[Message] = deque()
    async with Node(name="bench") as node:
        collector = node.connect(client_name="collector", on_message=pending.append)
        collector.subscribe("events/>")
        result: dict[str, int] = {}

        async def write_all() -> None:
            result["batches"] = await anyio.to_thread.run_sync(
                micro_batcher, spark, pending, n, out, arrow, 0.5
            )

        t0 = time.time()
        async with anyio.create_task_group() as tg:
            tg.start_soon(write_all)
            await publish_events(node, data)
        elapsed = time.time() - t0
    columns = await blocking(lambda: check_parquet(spark, out, n))
    return Run(elapsed, columns, f"{result['batches']} batches")


def pipeline_impls(spark: Any, data: list[bytes]) -> dict[str, Callable[[Path], Any]]:
    return {
        "connector": lambda w: pipeline_connector(spark, data, w),
        "plain micro-batcher": lambda w: pipeline_baseline(spark, data, w, arrow=False),
        "arrow micro-batcher": lambda w: pipeline_baseline(spark, data, w, arrow=True),
    }


async def pipeline_phase(spark: Any, args: argparse.Namespace, work: Path, report: Report) -> None:
    t0 = time.perf_counter()
    warm = pipeline_impls(spark, payloads(min(WARM, args.messages), PAYLOAD_SIZE))
    for name, run in warm.items():  # untimed: every path once at a small size
        try:
            await run(work / f"warm-{name.split()[0]}")
        except Exception as exc:
            report.failed(f"spark pipeline warm-up {name}", exc)
            return
    say(
        f"# pipeline warm-up: every path once at N={min(WARM, args.messages):,}, untimed: "
        f"{time.perf_counter() - t0:.1f} s"
    )
    # The sustained figure is the target: a burst long enough that the rate, not the
    # trigger's fixed latency (which has its own figure), decides it. The short burst
    # shows what the fixed costs do to a small one.
    for n, kind in ((args.pipeline_messages, "sustained"), (args.messages, "short burst")):
        await pipeline_size(spark, args, work / f"{kind.replace(' ', '-')}-n{n}", report, n, kind)


async def pipeline_size(
    spark: Any, args: argparse.Namespace, work: Path, report: Report, n: int, kind: str
) -> None:
    impls = pipeline_impls(spark, payloads(n, PAYLOAD_SIZE))
    names = list(impls)
    figures = {name: Figure() for name in names}
    for r in range(args.rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            try:
                run = await impls[name](work / f"round-{r}-{name.split()[0]}")
            except Exception as exc:
                figures[name].error = figures[name].error or exc
                continue
            figures[name].rates.append(n / run.seconds)
            figures[name].notes = run.notes
    connector, plain = figures["connector"].best, figures["plain micro-batcher"].best
    common = f"N={n:,} x {PAYLOAD_SIZE} B published as fast as the app can, best of {args.rounds}"
    target = kind == "sustained"
    for name, fig in figures.items():
        label = f"spark pipeline {kind} {name}"
        if fig.best is None:
            report.failed(label, fig.error or CheckFailed("no run"))
            continue
        if name == "connector":
            verdict = " (context)"
            if target and plain is not None:
                goal = f" (target >= {THROUGHPUT_TARGET:g}x)"
                verdict = goal + (" PASS" if fig.best >= THROUGHPUT_TARGET * plain else " MISS")
            say(
                f"{label}: {rate_text(fig.best)} msg/s = {ratio(fig.best, plain)} plain "
                f"micro-batcher{verdict} (a running sink_to query, trigger {TRIGGER} -> "
                f"Parquet; first publish -> Spark reported the last message committed; "
                f"{fig.notes}; {common})"
            )
        else:
            what = "createDataFrame(list of tuples, schema)"
            if name.startswith("arrow"):
                what = "createDataFrame(pyarrow.Table)"
            say(
                f"{label}: {rate_text(fig.best)} msg/s; connector/this = "
                f"{ratio(connector, fig.best)} (the app's own loop: every 500 ms, {what}"
                f".write.mode('append').parquet of what its subscription buffered; first "
                f"publish -> last batch written; {fig.notes}; {common})"
            )


# --- main ------------------------------------------------------------------------------------


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        return "not found"
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    first = (done.stderr or done.stdout).splitlines()
    return first[0].replace("openjdk version ", "OpenJDK ").replace('"', "") if first else "unknown"


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def header(args: argparse.Namespace) -> None:
    load = f", load average {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else ""
    say(
        f"# machine: {_cpus()} CPUs{load}; Python {platform.python_version()} on "
        f"{platform.machine()}; pyspark {_version('pyspark')}, pyarrow {_version('pyarrow')}, "
        f"{_java()}; meshbus {_version('meshbus')}"
    )
    say(
        f"# spark: one local_spark_session() (local[2]) for every phase; N={args.messages:,} "
        f"(sustained pipeline {args.pipeline_messages:,}) x {PAYLOAD_SIZE} B, "
        f"B={args.batch:,}, {args.samples} latency samples, "
        f"best of {args.rounds}; phases: {', '.join(args.only)}"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="N=20,000, 15 latency samples, once: a smoke run"
    )
    parser.add_argument("--messages", type=int, help="N, messages (rows) per run (200,000)")
    parser.add_argument(
        "--pipeline-messages",
        type=int,
        help="N of the sustained pipeline figure (1,000,000; quick 100,000)",
    )
    parser.add_argument(
        "--batch", type=int, default=10_000, help="B of the second baseline batch size (10,000)"
    )
    parser.add_argument("--samples", type=int, help="latency samples, 1 per 200 ms (60; quick 15)")
    parser.add_argument("--rounds", type=int, help="runs per figure, the best kept (3; quick 1)")
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help="comma-separated phases: pipeline, throughput, latency, write (default: all)",
    )
    parser.add_argument("--dir", help="where the Parquet files go (default: the system temp)")
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 20_000 if args.quick else 200_000
    if args.pipeline_messages is None:
        args.pipeline_messages = 100_000 if args.quick else 1_000_000
    if args.samples is None:
        args.samples = 15 if args.quick else 60
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if min(args.messages, args.batch, args.samples, args.rounds) < 1:
        parser.error("--messages, --batch, --samples and --rounds must be at least 1")
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(args.only) - set(PHASES)
    if unknown or not args.only:
        parser.error(f"--only: choose from {', '.join(PHASES)}")
    return args


async def run_phases(spark: Any, args: argparse.Namespace, work: Path, report: Report) -> None:
    phases = {
        "pipeline": pipeline_phase,
        "throughput": throughput_phase,
        "latency": latency_phase,
        "write": write_phase,
    }
    for name in PHASES:
        if name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            await phases[name](spark, args, work / name, report)
        except Exception as exc:
            report.failed(f"spark {name}", exc)
        say(f"# {name} phase: {time.perf_counter() - t0:.0f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    header(args)
    if shutil.which("java") is None:
        say("spark: not run (java not found on PATH; the connector needs Java 17)")
        return 0
    try:
        from meshbus.contrib.spark import local_spark_session
    except ImportError as exc:
        say(f"spark: not run ({type(exc).__name__}: {exc}; pip install -e '.[spark]')")
        return 0
    t0 = time.perf_counter()
    spark = local_spark_session()
    spark.range(1).count()
    say(
        f"# SparkSession start and a first job: {time.perf_counter() - t0:.1f} s "
        "(not in any figure)"
    )
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="meshbus-spark-bench-", dir=args.dir))
    try:
        for phase in args.only:
            (work / phase).mkdir()
        anyio.run(run_phases, spark, args, work, report)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    if report.failures:
        say(f"# correctness checks failed: {', '.join(report.failures)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
