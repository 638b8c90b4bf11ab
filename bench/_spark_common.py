"""What bench/spark.py's phases share: settings, the report, and small helpers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from meshbus import DEFAULT_PLUGINS, Node

T = TypeVar("T")

PAYLOAD_SIZE = 100
TOPICS = 8
WARM = 2_000  # messages (rows) of the untimed warm-up runs
LATENCY_INTERVAL = 0.2  # seconds between latency samples
TRIGGER = "500 milliseconds"
THROUGHPUT_TARGET = 2.0  # connector / plain tuples with the connector's batch
LATENCY_TARGET_MS = 1_500.0  # p50
WRITE_FILES = 4
PHASES = ("pipeline", "throughput", "latency", "write")
WRITE_COLUMNS = "value binary, topic string"


class CheckFailed(Exception):
    """A correctness check of one run failed; the figure is reported as failed."""


def say(line: str) -> None:
    print(line, flush=True)


def rate_text(rate: float) -> str:
    return f"{rate:,.0f}"


def failure(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"failed ({type(exc).__name__}: {text[:300]})"


async def blocking(call: Callable[[], T]) -> T:
    """A blocking Spark call, off the event loop."""
    return await anyio.to_thread.run_sync(call)


def spark_timeout(rows: int) -> float:
    """Bound for one Spark run of ``rows``: at least 2,000 rows/s, plus start-up."""
    return 120.0 + rows / 2_000


@asynccontextmanager
async def bridged_node(**settings: Any) -> AsyncIterator[tuple[Node, Any]]:
    from meshbus.contrib.spark import SparkBridge

    bridge = SparkBridge(listen="127.0.0.1:0", **settings)
    async with Node(name="bench", plugins=[*DEFAULT_PLUGINS, bridge]) as node:
        yield node, bridge


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)

    def failed(self, label: str, exc: BaseException) -> None:
        self.failures.append(label)
        say(f"{label}: {failure(exc)}")


@dataclass
class Figure:
    """The runs of one implementation: the best rate, or why it failed."""

    rates: list[float] = field(default_factory=list)
    error: BaseException | None = None
    notes: str = ""

    @property
    def best(self) -> float | None:
        return None if self.error is not None or not self.rates else max(self.rates)


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def progress_recorder() -> Any:
    from pyspark.sql.streaming import StreamingQueryListener

    from meshbus.contrib.spark._listener import committed_offsets

    class ProgressRecorder(StreamingQueryListener):
        """Records (time.time(), query id, next of the meshbus source) per progress event."""

        def __init__(self) -> None:
            self.events: list[tuple[float, str, int, int]] = []
            self.durations: list[tuple[str, int, int]] = []  # query id, rows, trigger ms

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            now = time.time()
            progress = event.progress
            trigger_ms = int(progress.durationMs.get("triggerExecution", 0))
            self.durations.append((str(progress.id), int(progress.numInputRows), trigger_ms))
            for _stream, _consumer, next_offsets in committed_offsets(progress):
                next_offset = sum(next_offsets.values())  # one partition here: its offset
                self.events.append((now, str(progress.id), next_offset, int(progress.numInputRows)))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

        def reached(self, query_id: str) -> int:
            return max((e[2] for e in self.events if e[1] == query_id), default=-1)

        def visible_at(self, query_id: str, offset: int) -> float | None:
            for when, qid, next_offset, _ in self.events:
                if qid == query_id and next_offset > offset:
                    return when
            return None

    return ProgressRecorder()


async def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise CheckFailed(f"{what}: not within {timeout:.0f} s")
        await anyio.sleep(0.01)
