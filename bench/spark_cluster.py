"""Spark on a cluster: bus -> Parquet throughput and publish -> visible latency.

On ``local-cluster[2,1,1024]`` (two executor JVMs of one core each, with their own
Python workers): Spark reads from a standalone ``meshbus run`` node in one and two
partitions, from the node embedded in the app, and a hand-written micro-batcher writes
the same messages; then the latency of a running query.

Run from the checkout with the spark extra and Java 17 on PATH::

    .venv/bin/python bench/spark_cluster.py              # N=1,000,000, median of 3 rounds
    .venv/bin/python bench/spark_cluster.py --quick      # N=100,000, 1 round: a smoke run
    .venv/bin/python bench/spark_cluster.py -v           # also every round's figure

Every Spark application is a process of its own (``spark_cluster_driver.py``: a process
has one SparkContext), started afresh for each run; its JVM start and an untimed warm-up
(2,000 messages read by two batch reads at once, so that both executors are warm, or the
micro-batcher once at that size) are not in the figures. Messages are N random 100-byte payloads (the same in every run) published to
``bench/<i % 8>``; the eight topics split 4 / 4 over two partitions.

* ``partitions=1`` / ``partitions=2``: a fresh node (``meshbus run``, plain TCP, VPN
  ``default``, a data directory, ``[spark] subscribe = ["bench/>"]``) captures the N
  messages this process publishes over TCP; once its statistics show all N captured, the
  driver runs ``readStream.format("meshbus")`` (``partitions`` 1 or 2, ``startingOffsets``
  earliest) -> Parquet with ``trigger(availableNow=True)``, timed from ``start()`` to
  ``awaitTermination()`` returning. Target: partitions=2 >= 1.6x partitions=1.
* ``app_bridge``: the node embedded in the driver with a ``SparkBridge`` (one partition,
  its own listener); the driver publishes the N messages to it in-process, then times
  ``bridge.sink_to(..., available_now=True)`` the same way; the executors connect back to
  the driver's node. Target: partitions=2 >= 1x this.
* ``micro_batcher`` (context): ``bench/spark.py``'s arrow micro-batcher on the same
  cluster: an in-process subscription buffers what the app publishes as fast as it can,
  and a loop every 500 ms appends what arrived with ``createDataFrame(pyarrow.Table)
  .write.parquet``; timed from the first publish to the last batch written.
* ``latency``: a fresh node with two partitions; the driver runs a query on a 500 ms
  trigger into Parquet, warmed up by 1,000 messages; then this process publishes 2,000
  messages/s for 10 s, each carrying ``time.time()``. A message is visible when a
  ``StreamingQueryListener`` in the driver gets the progress event of the batch whose
  end offset (in the message's partition) is past the message's. p50 / p99; target p50
  <= 1,500 ms.

Every run is checked: the Parquet output holds exactly N rows, N distinct values, whose
CRC-32s sum to that of the published payloads (every latency sample once). A failed
check is printed instead of the figure, and makes the exit status 1; missed targets do
not. The throughput variants run ``--rounds`` times in rotating order; each figure is the
median. Times are wall clock: the work is spread over the JVMs and Python workers.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from _peers import Child, PeerError
from spark_cluster_driver import (
    MASTER,
    MAX_BYTES,
    PAYLOAD_SIZE,
    TOPIC_FILTER,
    CheckFailed,
    checksum,
    latency_payload,
    payloads,
    topic,
)

from meshbus.transports import connect

DRIVER = Path(__file__).with_name("spark_cluster_driver.py")
SEED = 1
VARIANTS = ("partitions=1", "partitions=2", "app_bridge", "micro_batcher")
PARTITIONS_TARGET = 1.6  # partitions=2 / partitions=1
BRIDGE_TARGET = 1.0  # partitions=2 / app_bridge
LATENCY_TARGET_MS = 1_500.0  # p50
LATENCY_RATE = 2_000  # messages per second
LATENCY_SECONDS = 10
LATENCY_WARM = 1_000
NODE_START = 30.0  # seconds

NODE_CONFIG = """\
[node]
name = "benchnode"
data_dir = "spool"
plugins = ["direct", "shared", "eliding", "guaranteed", "retained", "spark"]

[[listeners]]
host = "127.0.0.1"
port = 0

[spark]
subscribe = ["{topic_filter}"]
partitions = {partitions}
max_bytes = {max_bytes}
"""


def say(line: str) -> None:
    print(line, flush=True)


def failure(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"failed ({type(exc).__name__}: {text[:300]})"


# --- processes ------------------------------------------------------------------------------


@contextmanager
def standalone_node(work: Path, partitions: int) -> Iterator[str]:
    """A ``meshbus run`` node serving Spark from ``work``; yields its URL."""
    work.mkdir(parents=True, exist_ok=True)
    config = NODE_CONFIG.format(
        topic_filter=TOPIC_FILTER, partitions=partitions, max_bytes=MAX_BYTES
    )
    (work / "node.toml").write_text(config, encoding="utf-8")
    argv = [sys.executable, "-m", "meshbus", "run", "node.toml"]
    with Child("node", argv, work) as node:
        yield node.expect("listening on", NODE_START)


def driver_timeout(rows: int) -> float:
    """Bound for one Spark application: JVM start and warm-up, then 2,000 rows/s."""
    return 300.0 + rows / 2_000


def finish(child: Child, rows: int) -> dict[str, Any]:
    """The driver's result, once it has exited (its JVMs gone before the next run)."""
    result = child.result(driver_timeout(rows))
    child.proc.wait(60)
    if "failed" in result:
        raise CheckFailed(result["failed"])
    return result


def spark_app(work: Path, rows: int, **settings: Any) -> dict[str, Any]:
    """Run one driver process with ``settings``; its result."""
    work.mkdir(parents=True, exist_ok=True)
    settings = {**settings, "work": str(work), "rows": rows}
    argv = [sys.executable, str(DRIVER), json.dumps(settings)]
    with Child("driver", argv, work) as child:
        return finish(child, rows)


# --- publishing to a standalone node -----------------------------------------------------


async def publish(url: str, data: list[bytes]) -> None:
    """Publish ``data`` as fast as the connection takes it; return once the node has it."""
    async with connect(url, client_name="bench-publisher", reconnect=False) as client:
        for i, payload in enumerate(data):
            client.publish(topic(i), payload)
            if i % 10_000 == 9_999:
                await client.flush()
        await client.confirm()


async def publish_steadily(url: str, rate: int, seconds: float) -> None:
    """``rate`` latency samples per second for ``seconds``, each stamped as it goes."""
    async with connect(url, client_name="bench-latency", reconnect=False) as client:
        t0 = time.monotonic()
        for i in range(round(rate * seconds)):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            client.publish(topic(i), latency_payload(i))
        await client.confirm()


def captured(url: str, partitions: int) -> int:
    """How many messages the node's stream holds, over its partitions."""
    from meshbus.contrib.spark._client import NodeClient, NodeTarget

    client = NodeClient(NodeTarget((url,)), "bench")
    try:
        stats, _ = client.request("stats")
    finally:
        client.close()
    stream = TOPIC_FILTER if partitions == 1 else f"{TOPIC_FILTER}#{partitions}"
    return sum(p["captured"] for p in stats["streams"][stream])


def wait_captured(url: str, partitions: int, expected: int) -> None:
    deadline = time.monotonic() + 60
    while (got := captured(url, partitions)) < expected:
        if time.monotonic() > deadline:
            raise CheckFailed(f"published {expected:,}, the node captured {got:,}")
        time.sleep(0.05)
    if got != expected:
        raise CheckFailed(f"published {expected:,}, the node captured {got:,}")


# --- throughput runs ---------------------------------------------------------------------------


@dataclass
class Messages:
    """The payloads every throughput run publishes, and their checksum."""

    data: list[bytes]
    crc: int


def standalone_run(work: Path, messages: Messages, partitions: int) -> dict[str, Any]:
    rows = len(messages.data)
    with standalone_node(work / "node", partitions) as url:
        anyio.run(publish, url, messages.data)
        wait_captured(url, partitions, rows)
        return spark_app(
            work / "app", rows, mode="read", address=url, partitions=partitions, crc=messages.crc
        )


def runner(name: str, messages: Messages) -> Callable[[Path], dict[str, Any]]:
    """The run of variant ``name``: a function of its work directory."""
    rows = len(messages.data)
    if name == "app_bridge":
        return lambda work: spark_app(work, rows, mode="bridge", seed=SEED)
    if name == "micro_batcher":
        return lambda work: spark_app(work, rows, mode="batcher", seed=SEED)
    partitions = int(name.removeprefix("partitions="))
    return lambda work: standalone_run(work, messages, partitions)


@dataclass
class Figure:
    """The rounds of one variant: rate and notes of each, or the first failure."""

    runs: list[tuple[float, str]] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def median(self) -> float | None:
        if self.error is not None or not self.runs:
            return None
        return statistics.median(rate for rate, _ in self.runs)

    @property
    def notes(self) -> str:
        """The notes of the run nearest the median."""
        median = self.median or 0.0
        return min(self.runs, key=lambda run: abs(run[0] - median))[1] if self.runs else ""


def throughput(args: argparse.Namespace, work: Path) -> dict[str, Figure]:
    """Every variant ``args.rounds`` times, in rotating order, each run in a fresh directory."""
    data = payloads(args.messages, SEED)
    messages = Messages(data, checksum(data))
    figures = {name: Figure() for name in VARIANTS}
    for r in range(args.rounds):
        shift = r % len(VARIANTS)
        for name in VARIANTS[shift:] + VARIANTS[:shift]:
            run_dir = work / f"round-{r}-{name.replace('=', '')}"
            try:
                result = runner(name, messages)(run_dir)
            except (CheckFailed, PeerError) as exc:
                figures[name].error = figures[name].error or exc
                if args.verbose:
                    say(f"#   round {r + 1} spark_cluster.{name}: {failure(exc)}")
                continue
            finally:
                shutil.rmtree(run_dir, ignore_errors=True)
            rate = args.messages / result["seconds"]
            figures[name].runs.append((rate, result["notes"]))
            if args.verbose:
                say(
                    f"#   round {r + 1} spark_cluster.{name}: {rate:,.0f} msg/s "
                    f"({result['seconds']:.2f} s; {result['notes']})"
                )
    return figures


def ratio_text(a: float | None, b: float | None, of: str, target: float) -> str:
    if a is None or b is None:
        return f"n/a {of} (target >= {target:g}x)"
    verdict = "OK" if a >= target * b else "MISS"
    return f"{a / b:.2f}x {of} (target >= {target:g}x) {verdict}"


def report_throughput(figures: dict[str, Figure]) -> list[str]:
    """One line per variant; the names of those that failed."""
    one, two = figures["partitions=1"].median, figures["partitions=2"].median
    bridge, batcher = figures["app_bridge"].median, figures["micro_batcher"].median
    comparisons = {
        "partitions=2": ratio_text(two, one, "partitions=1", PARTITIONS_TARGET),
        "app_bridge": "partitions=2 is " + ratio_text(two, bridge, "this", BRIDGE_TARGET),
        "micro_batcher": "context: partitions=2 is "
        + (f"{two / batcher:.2f}x this" if two is not None and batcher else "n/a"),
    }
    failed = []
    for name, fig in figures.items():
        label = f"spark_cluster.{name}"
        if fig.median is None:
            failed.append(name)
            say(f"{label:<30} {failure(fig.error or CheckFailed('no run'))}")
            continue
        say(f"{label:<30} {fig.median:>11,.0f} msg/s   {comparisons.get(name, '')}".rstrip())
        say(f"#   {fig.notes}")
    return failed


# --- latency ------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def latency(work: Path) -> bool:
    """Publish -> visible on a running query; print its line, return whether it ran."""
    label = f"{'spark_cluster.latency':<30}"
    warm = [latency_payload(-1 - i) for i in range(LATENCY_WARM)]
    samples = LATENCY_RATE * LATENCY_SECONDS
    settings = {"mode": "latency", "partitions": 2, "warm": LATENCY_WARM, "samples": samples}
    try:
        with standalone_node(work / "node", 2) as url:
            anyio.run(publish, url, warm)
            wait_captured(url, 2, LATENCY_WARM)
            settings |= {"address": url, "work": str(work / "app")}
            argv = [sys.executable, str(DRIVER), json.dumps(settings)]
            with Child("driver", argv, work) as child:
                child.expect("READY", driver_timeout(LATENCY_WARM))
                anyio.run(publish_steadily, url, LATENCY_RATE, LATENCY_SECONDS)
                result = finish(child, samples)
    except (CheckFailed, PeerError) as exc:
        say(f"{label} {failure(exc)}")
        return False
    ms = result["latencies"]
    p50 = percentile(ms, 50)
    verdict = "OK" if p50 <= LATENCY_TARGET_MS else "MISS"
    say(
        f"{label} p50 {p50:,.0f} ms   p99 {percentile(ms, 99):,.0f} ms   "
        f"(target p50 <= {LATENCY_TARGET_MS:,.0f} ms) {verdict}"
    )
    say(
        f"#   partitions=2, trigger 500 ms -> Parquet; {samples:,} messages at "
        f"{LATENCY_RATE:,}/s, max {max(ms):,.0f} ms; {result['notes']}"
    )
    return True


# --- main ---------------------------------------------------------------------------------------


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def header(args: argparse.Namespace) -> None:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    say(
        f"# machine: {cpus} CPUs, load average {os.getloadavg()[0]:.2f}; Python "
        f"{platform.python_version()}; pyspark {version('pyspark')}, pyarrow "
        f"{version('pyarrow')}; meshbus {version('meshbus')}"
    )
    say(
        f"# spark_cluster: {MASTER} (2 executor JVMs x 1 core, 512m), N={args.messages:,} "
        f"x {PAYLOAD_SIZE} B -> Parquet, median of {args.rounds} round(s) in rotating "
        "order; each run a fresh Spark application, timed after its JVM start and warm-up"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=100,000, 1 round: a smoke run")
    parser.add_argument("--messages", type=int, help="N, messages per run (1,000,000)")
    parser.add_argument("--rounds", type=int, help="runs per figure, the median kept (3; quick 1)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every round")
    parser.add_argument("--dir", help="where the runs' files go (default: the system temp)")
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 100_000 if args.quick else 1_000_000
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if min(args.messages, args.rounds) < 1:
        parser.error("--messages and --rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    header(args)
    if shutil.which("java") is None:
        say("spark_cluster: not run (java not found on PATH; Spark needs Java 17)")
        return 0
    if not all(importlib.util.find_spec(name) for name in ("pyspark", "pyarrow")):
        say("spark_cluster: not run (pyspark or pyarrow missing: pip install -e '.[spark]')")
        return 0
    work = Path(tempfile.mkdtemp(prefix="meshbus-spark-cluster-", dir=args.dir))
    t0 = time.perf_counter()
    try:
        failed = report_throughput(throughput(args, work / "throughput"))
        if not latency(work / "latency"):
            failed.append("latency")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"# {time.perf_counter() - t0:.0f} s in all")
    if failed:
        say(f"# correctness checks failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
