"""bench/spark.py's write phase: Spark writing rows to the bus through the sink, against
the same rows published by a plain client."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from _harness import payloads
from _spark_common import (
    PAYLOAD_SIZE,
    TOPICS,
    WARM,
    WRITE_COLUMNS,
    WRITE_FILES,
    CheckFailed,
    Figure,
    Report,
    blocking,
    bridged_node,
    failure,
    rate_text,
    ratio,
    say,
    spark_timeout,
    wait_until,
)

from meshbus import Message


def prepare_rows(directory: Path, n: int) -> frozenset[bytes]:
    """Write ``n`` rows as Parquet files; return their (distinct, random) payloads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    data = payloads(n, PAYLOAD_SIZE)
    per_file = -(-n // WRITE_FILES)
    for f, lo in enumerate(range(0, n, per_file)):
        hi = min(n, lo + per_file)
        table = pa.table(
            {
                "value": pa.array(data[lo:hi], pa.binary()),
                "topic": pa.array([f"out/{i % TOPICS}" for i in range(lo, hi)], pa.string()),
            }
        )
        pq.write_table(table, directory / f"part-{f}.parquet")
    return frozenset(data)


class Counter:
    """A sync on_message handler counting messages (and keeping their payloads)."""

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, target: int) -> None:
        self.count = 0
        self.payloads: list[bytes] = []
        self.target = target
        self.full_at: float | None = None

    def __call__(self, message: Message) -> None:
        self.count += 1
        self.payloads.append(message.payload)
        if self.count == self.target:
            self.full_at = time.perf_counter()


async def run_write(
    spark: Any,
    bridge: Any,
    counter: Counter,
    rows: Path,
    expected: frozenset[bytes],
    stream: bool,
    ck: Path,
) -> float:
    n = len(expected)
    counter.reset(n)
    if stream:
        frame = await blocking(lambda: spark.readStream.schema(WRITE_COLUMNS).parquet(str(rows)))

        def go() -> None:
            query = (
                bridge.write_stream(frame, checkpoint=str(ck)).trigger(availableNow=True).start()
            )
            if not query.awaitTermination(spark_timeout(n)):
                query.stop()
                raise CheckFailed(f"the query did not finish in {spark_timeout(n):.0f} s")
    else:
        frame = await blocking(lambda: spark.read.schema(WRITE_COLUMNS).parquet(str(rows)))

        def go() -> None:
            bridge.write(frame)

    t0 = time.perf_counter()
    await blocking(go)
    done = time.perf_counter()
    await wait_until(lambda: counter.count >= n, 30, f"{n:,} messages on the bus")
    assert counter.full_at is not None
    elapsed = max(done, counter.full_at) - t0
    await anyio.sleep(0.2)  # anything beyond N would be a duplicate
    if counter.count != n or set(counter.payloads) != expected:
        distinct = len(set(counter.payloads))
        raise CheckFailed(
            f"{counter.count:,} messages ({distinct:,} distinct payloads, "
            f"{len(expected - set(counter.payloads)):,} missing) on the bus, expected "
            f"the {n:,} rows once each"
        )
    return elapsed


async def write_phase(spark: Any, args: argparse.Namespace, work: Path, report: Report) -> None:
    n = args.messages
    warm_n = min(WARM, n)
    warm_rows = await blocking(lambda: prepare_rows(work / "rows-warm", warm_n))
    rows = await blocking(lambda: prepare_rows(work / "rows", n))
    figures = {"writeStream": Figure(), "write": Figure()}
    async with bridged_node() as (node, bridge):
        counter = Counter()
        listener = node.connect(client_name="counter", on_message=counter)
        listener.subscribe("out/>")
        t0 = time.perf_counter()
        warm_failed = []
        for name in figures:
            try:
                await run_write(
                    spark,
                    bridge,
                    counter,
                    work / "rows-warm",
                    warm_rows,
                    name == "writeStream",
                    work / f"ck-warm-{name}",
                )
            except Exception as exc:
                warm_failed.append(f"{name} {failure(exc)}")
        say(
            f"# write warm-up: both paths once at N={warm_n:,}, untimed: "
            f"{time.perf_counter() - t0:.1f} s"
            + (f"; FAILED: {'; '.join(warm_failed)}" if warm_failed else "")
        )
        report.failures += [f"spark write warm-up {w.split()[0]}" for w in warm_failed]
        names = list(figures)
        for r in range(args.rounds):
            for name in names[r % 2 :] + names[: r % 2]:
                fig = figures[name]
                try:
                    elapsed = await run_write(
                        spark,
                        bridge,
                        counter,
                        work / "rows",
                        rows,
                        name == "writeStream",
                        work / f"ck-{r}-{name}",
                    )
                    fig.rates.append(n / elapsed)
                except Exception as exc:
                    fig.error = fig.error or exc
    common = (
        f"N={n:,} rows x {PAYLOAD_SIZE} B from {WRITE_FILES} Parquet files, "
        f"best of {args.rounds}, wall clock"
    )
    stream, batch = figures["writeStream"], figures["write"]
    if stream.best is None:
        report.failed("spark write writeStream -> bus", stream.error or CheckFailed("no run"))
    else:
        say(
            f"spark write writeStream -> bus: {rate_text(stream.best)} rows/s = "
            f"{ratio(stream.best, batch.best)} batch write (bridge.write_stream availableNow, "
            f"until the query ended and a session on the node had all N; {common})"
        )
    if batch.best is None:
        report.failed("spark write batch write -> bus", batch.error or CheckFailed("no run"))
    else:
        say(
            f"spark write batch write -> bus: {rate_text(batch.best)} rows/s "
            f"(bridge.write(spark.read.parquet), until a session on the node had all N; {common})"
        )
