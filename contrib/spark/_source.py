"""``format("meshbus")``: the PySpark Python data source (reads and writes, Arrow paths).

None of this runs in the app's process: Spark creates these objects in processes
it spawns, and pickles readers and writers to its executors, wherever they run. Each
calls the node's ``spark`` service through a :class:`NodeClient`, over the transport
with the credentials and TLS files the options name: the planner asks where streams
end, the executors read and stage rows themselves, so no row passes through the
driver.

Offsets are ``{"meshbusStream": id, "consumer": name, "next": {"0": n0, "1": n1}}``
(the next offset of each partition): Spark stores them in its checkpoint, so a
restarted query resumes after the last batch it committed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ._client import NodeClient
from ._columns import spark_schema
from ._errors import SparkOptionError
from ._listener import partition_offsets
from ._options import (
    ReadOptions,
    WriteOptions,
    check_known,
    read_options,
    sink_id_for,
    write_options,
)
from ._rows import check_write_schema

__all__ = ["MeshbusDataSource"]

#: Rows per read task: a partition's batch larger than this is read by several tasks.
ROWS_PER_TASK = 100_000
#: Arrow bytes per staged part of a write (a task's rows go in parts of about this).
STAGE_BYTES = 8 << 20


class MeshbusDataSource(DataSource):
    """The ``meshbus`` data source; register it with :meth:`SparkBridge.attach`."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        check_known(self.options)

    @classmethod
    def name(cls) -> str:
        return "meshbus"

    def schema(self) -> StructType:
        return spark_schema(read_options(self.options).include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return MeshbusReader(read_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MeshbusStreamReader(read_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        _refuse_overwrite(overwrite)
        return MeshbusWriter(_checked_write(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        _refuse_overwrite(overwrite)
        options = _checked_write(self.options, schema)
        if options.sink_id is None and options.checkpoint_location is None:
            raise SparkOptionError(
                "sinkId", "writeStream needs a 'checkpointLocation' option or a 'sinkId'"
            )
        return MeshbusStreamWriter(options)


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise SparkOptionError(
            "mode",
            "a meshbus sink only appends (published messages cannot be taken back): "
            "use mode('append'), or outputMode('append') for a stream",
        )


def _checked_write(options: Any, schema: StructType) -> WriteOptions:
    parsed = write_options(options)
    check_write_schema(to_arrow_schema(schema), parsed.topic)
    return parsed


# --- reading -------------------------------------------------------------------------


@dataclass
class OffsetRange(InputPartition):
    """Rows ``[start, end)`` of one partition of a stream, read by one task."""

    stream: dict[str, Any]
    partition: int
    start: int
    end: int


def _ranges(
    stream: dict[str, Any], start: dict[str, int], end: dict[str, int]
) -> list[InputPartition]:
    ranges: list[InputPartition] = []
    for key in sorted(end, key=int):
        first, last = start.get(key, 0), end[key]
        ranges += [
            OffsetRange(stream, int(key), lo, min(lo + ROWS_PER_TASK, last))
            for lo in range(first, last, ROWS_PER_TASK)
        ]
    return ranges


def _fetch(options: ReadOptions, part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The rows of ``part``, asked for in answers of a few megabytes each."""
    client = NodeClient(options.node, "reader")
    start = part.start
    while start < part.end:
        h, body = client.request(
            "fetch",
            stream=part.stream,
            partition=part.partition,
            start=start,
            end=part.end,
            headers=options.include_headers,
            fail=options.fail_on_data_loss,
        )
        yield from pa.ipc.open_stream(body)
        until = int(h["until"])
        if until <= start:
            return
        start = until


def _stream_start(options: ReadOptions) -> str:
    """Where a stream without ``startingOffsets`` starts: ``latest`` for topic filters,
    as Kafka's; ``earliest`` for a queue, whose messages wait for their consumer (from
    ``latest``, the ones it holds would be acknowledged unread)."""
    return "earliest" if options.queue is not None else "latest"


def check_range(starting: str | dict[str, int] | None, ending: str | dict[str, int]) -> None:
    """Refuse ``endingOffsets`` that end before ``startingOffsets`` begin (or that name
    ``earliest``, which ends nothing)."""
    if isinstance(ending, dict):
        for partition, end in ending.items():
            if end == -2:
                raise SparkOptionError(
                    "endingOffsets", f"partition {partition}: -2 (earliest) ends nothing"
                )
            start = starting.get(partition) if isinstance(starting, dict) else None
            if start is not None and start >= 0 and 0 <= end < start:
                raise SparkOptionError(
                    "endingOffsets",
                    f"partition {partition} ends at {end}, before its starting offset {start}",
                )


def _limited(position: dict[str, int], end: dict[str, int], rows: int) -> dict[str, int]:
    """``end`` cut so that at most ``rows`` rows follow ``position`` in all, shared among
    the partitions in proportion to what each has (as Kafka's source does)."""
    available = {k: max(0, end[k] - position.get(k, 0)) for k in end}
    total = sum(available.values())
    if total <= rows:
        return end
    cut = {k: position.get(k, 0) + available[k] * rows // total for k in end}
    spare = rows - sum(cut[k] - position.get(k, 0) for k in end)
    for k in sorted(end, key=lambda k: available[k], reverse=True):  # the rounding's rest
        if spare <= 0:
            break
        if cut[k] < end[k]:
            cut[k] += 1
            spare -= 1
    return cut


class _Reading:
    options: ReadOptions

    @functools.cached_property
    def client(self) -> NodeClient:
        return NodeClient(self.options.node, "planner")

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}


class MeshbusReader(_Reading, DataSourceReader):
    """``spark.read.format("meshbus")``: what a stream holds now."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        if options.ending_offsets != "latest" and options.starting_timestamp is None:
            check_range(options.starting_offsets, options.ending_offsets)
        h, _ = self.client.request(
            "bounds",
            stream=options.stream,
            starting=options.starting_offsets or "earliest",  # a batch read: Kafka's default
            timestamp=options.starting_timestamp,
            ending=options.ending_offsets,
            consumer=options.consumer,
            fail=options.fail_on_data_loss,
        )
        return _ranges(options.stream, h["start"], h["end"])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark reads one placeholder partition when there are none (nothing retained).
        return _fetch(self.options, partition) if isinstance(partition, OffsetRange) else iter(())


class MeshbusStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("meshbus")``."""

    def __init__(self, options: ReadOptions) -> None:
        if options.ending_offsets != "latest":
            raise SparkOptionError("endingOffsets", "applies to batch reads (spark.read) only")
        self.options = options
        self._available_now = False
        self._target: dict[str, int] | None = None
        self._last_batch = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "options": self.options,
            "_available_now": self._available_now,
            "_target": self._target,
            "_last_batch": self._last_batch,
        }

    def _offset(self, stream: str, next_offsets: dict[str, int]) -> dict[str, Any]:
        return {"meshbusStream": stream, "consumer": self.options.consumer, "next": next_offsets}

    def initialOffset(self) -> dict[str, Any]:
        options = self.options
        h, _ = self.client.request(
            "open",
            stream=options.stream,
            consumer=options.consumer,
            starting=options.starting_offsets or _stream_start(options),
            timestamp=options.starting_timestamp,
            fail=options.fail_on_data_loss,
        )
        return self._offset(h["stream"], h["start"])

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # The target is taken at the first latestOffset(), which knows where the
        # checkpoint resumes: a log renumbered after a restart must first learn
        # that position (see StreamLog.adopt), and asking for the end now would not.
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        position = partition_offsets(start)
        h, _ = self.client.request(
            "latest", stream=self.options.stream, position=position, consumer=self.options.consumer
        )
        end: dict[str, int] = {k: int(v) for k, v in h["next"].items()}
        if self._available_now:
            if self._target is None:
                self._target = dict(end)
            end = {
                k: min(v, max(self._target.get(k, v), position.get(k, 0))) for k, v in end.items()
            }
        if isinstance(limit, ReadMaxRows):
            end = _limited(position, end, limit.max_rows)
        end = {k: max(v, position.get(k, 0)) for k, v in end.items()}
        least = self.options.min_offsets_per_trigger
        if least is not None and not self._available_now:
            waited = time.monotonic() - self._last_batch
            new = sum(v - position.get(k, 0) for k, v in end.items())
            if new < least and waited < self.options.max_trigger_delay:
                return self._offset(h["stream"], position)  # too few yet: no batch
        if end != position:
            self._last_batch = time.monotonic()
        return self._offset(h["stream"], end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return _ranges(self.options.stream, partition_offsets(start), partition_offsets(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark reads one placeholder partition when there are none (nothing retained).
        return _fetch(self.options, partition) if isinstance(partition, OffsetRange) else iter(())

    def commit(self, end: dict[str, Any]) -> None:
        # The commit listener in the app acknowledges earlier; this is the backstop.
        self.client.request(
            "commit",
            stream=self.options.stream,
            consumer=self.options.consumer,
            next=partition_offsets(end),
        )

    def stop(self) -> None:
        self.client.close()


# --- writing -------------------------------------------------------------------------


@dataclass
class Staged(WriterCommitMessage):
    """What one task staged on the node: the tokens of its parts (none for no rows)."""

    tokens: list[str]
    rows: int


def _tokens(messages: list[WriterCommitMessage | None]) -> list[str]:
    return [t for m in messages if isinstance(m, Staged) for t in m.tokens]


def _stage(client: NodeClient, batches: list[pa.RecordBatch]) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    h, _ = client.request("stage", sink.getvalue().to_pybytes())
    return str(h["token"])


class _Writing:
    options: WriteOptions

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        client = NodeClient(self.options.node, "writer")
        tokens: list[str] = []
        rows = 0
        part: list[pa.RecordBatch] = []
        size = 0
        for batch in iterator:
            if not batch.num_rows:
                continue
            part.append(batch)
            size += batch.nbytes
            rows += batch.num_rows
            if size >= STAGE_BYTES:
                tokens.append(_stage(client, part))
                part, size = [], 0
        if part:
            tokens.append(_stage(client, part))
        return Staged(tokens, rows)

    def _publish(
        self, messages: list[WriterCommitMessage | None], batch: int | None, sink: str | None
    ) -> None:
        NodeClient(self.options.node, "writer").request(
            "publish",
            sink=sink,
            batch=batch,
            tokens=_tokens(messages),
            topic=self.options.topic,
            mode=self.options.delivery_mode,
        )

    def _discard(self, messages: list[WriterCommitMessage | None]) -> None:
        tokens = _tokens(messages)
        if tokens:
            NodeClient(self.options.node, "writer").request("discard", tokens=tokens)


class MeshbusWriter(_Writing, DataSourceArrowWriter):
    """``df.write.format("meshbus")``: staged by the tasks, published on commit."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._publish(messages, None, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._discard(messages)


class MeshbusStreamWriter(_Writing, DataSourceStreamArrowWriter):
    """``df.writeStream.format("meshbus")``: each batch published once per sink."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        sink_id = options.sink_id
        if sink_id is None:
            assert options.checkpoint_location is not None
            sink_id = sink_id_for(options.checkpoint_location)
        self.sink_id = sink_id

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._publish(messages, batchId, self.sink_id)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._discard(messages)
