"""``format("meshbus")``: the PySpark Python data source (reads and writes, Arrow paths).

None of this runs in the app's process: Spark creates these objects in worker
processes it spawns, and pickles readers and writers to its executors. Each talks
to the bridge through a :class:`BridgeClient` opened on first use.

Offsets are ``{"meshbusStream": id, "consumer": name, "next": n}``: Spark stores
them in its checkpoint, so a restarted query resumes after the last batch it
committed.
"""

from __future__ import annotations

import functools
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

from ._columns import spark_schema
from ._errors import SparkOptionError
from ._options import (
    ReadOptions,
    WriteOptions,
    check_known,
    read_options,
    sink_id_for,
    write_options,
)
from ._rows import check_write_schema
from ._wire import BridgeClient

__all__ = ["MeshbusDataSource"]

#: Rows per read task: a batch larger than this is read by several tasks at once.
ROWS_PER_TASK = 100_000


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
        return MeshbusWriter(_checked_write(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        options = _checked_write(self.options, schema)
        if options.sink_id is None and options.checkpoint_location is None:
            raise SparkOptionError(
                "sinkId", "writeStream needs a 'checkpointLocation' option or a 'sinkId'"
            )
        return MeshbusStreamWriter(options)


def _checked_write(options: Any, schema: StructType) -> WriteOptions:
    parsed = write_options(options)
    check_write_schema(to_arrow_schema(schema), parsed.topic)
    return parsed


# --- reading -------------------------------------------------------------------------


@dataclass
class OffsetRange(InputPartition):
    """Rows ``[start, end)`` of one stream, read by one task."""

    stream: dict[str, Any]
    start: int
    end: int


def _ranges(stream: dict[str, Any], start: int, end: int) -> list[InputPartition]:
    return [
        OffsetRange(stream, lo, min(lo + ROWS_PER_TASK, end))
        for lo in range(start, end, ROWS_PER_TASK)
    ]


def _fetch(options: ReadOptions, part: OffsetRange) -> Iterator[pa.RecordBatch]:
    client = BridgeClient(options.address)
    try:
        _, body = client.request(
            "fetch",
            stream=part.stream,
            start=part.start,
            end=part.end,
            headers=options.include_headers,
        )
    finally:
        client.close()
    yield from pa.ipc.open_stream(body)


class _Reading:
    options: ReadOptions

    @functools.cached_property
    def client(self) -> BridgeClient:
        return BridgeClient(self.options.address)

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}


class MeshbusReader(_Reading, DataSourceReader):
    """``spark.read.format("meshbus")``: what a stream holds now."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        h, _ = self.client.request(
            "bounds",
            stream=self.options.stream,
            starting=self.options.starting_offsets,
            consumer=self.options.consumer,
        )
        return _ranges(self.options.stream, h["start"], h["end"])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark reads one placeholder partition when there are none (nothing retained).
        return _fetch(self.options, partition) if isinstance(partition, OffsetRange) else iter(())


class MeshbusStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("meshbus")``."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._available_now = False
        self._target: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "options": self.options,
            "_available_now": self._available_now,
            "_target": self._target,
        }

    def _offset(self, stream: str, next_offset: int) -> dict[str, Any]:
        return {"meshbusStream": stream, "consumer": self.options.consumer, "next": next_offset}

    def initialOffset(self) -> dict[str, Any]:
        h, _ = self.client.request(
            "open",
            stream=self.options.stream,
            consumer=self.options.consumer,
            starting=self.options.starting_offsets,
        )
        return self._offset(h["stream"], h["start"])

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # The target is taken at the first latestOffset(), which knows where the
        # checkpoint resumes: a log renumbered after an app restart must first learn
        # that position (see StreamLog.adopt), and asking for the end now would not.
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        position = int(start["next"])
        h, _ = self.client.request(
            "latest", stream=self.options.stream, position=position, consumer=self.options.consumer
        )
        end = h["next"]
        if self._available_now:
            if self._target is None:
                self._target = end
            end = min(end, max(self._target, position))
        if isinstance(limit, ReadMaxRows):
            end = min(end, position + limit.max_rows)
        return self._offset(h["stream"], max(end, position))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return _ranges(self.options.stream, int(start["next"]), int(end["next"]))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Spark reads one placeholder partition when there are none (nothing retained).
        return _fetch(self.options, partition) if isinstance(partition, OffsetRange) else iter(())

    def commit(self, end: dict[str, Any]) -> None:
        # The commit listener in the app acknowledges earlier; this is the backstop.
        self.client.request(
            "commit",
            stream=end["meshbusStream"],
            consumer=self.options.consumer,
            next=int(end["next"]),
        )

    def stop(self) -> None:
        self.client.close()


# --- writing -------------------------------------------------------------------------


@dataclass
class Staged(WriterCommitMessage):
    """What one task staged on the bridge (``token`` is ``None`` for no rows)."""

    token: str | None
    rows: int


class _Writing:
    options: WriteOptions

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        batches = list(iterator)
        rows = sum(b.num_rows for b in batches)
        if not rows:
            return Staged(None, 0)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batches[0].schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        client = BridgeClient(self.options.address)
        try:
            h, _ = client.request("stage", sink.getvalue())
        finally:
            client.close()
        return Staged(h["token"], rows)

    def _publish(
        self, messages: list[WriterCommitMessage | None], batch: int | None, sink: str | None
    ) -> None:
        tokens = [m.token for m in messages if isinstance(m, Staged) and m.token]
        client = BridgeClient(self.options.address)
        try:
            client.request(
                "publish",
                sink=sink,
                batch=batch,
                tokens=tokens,
                topic=self.options.topic,
                mode=self.options.delivery_mode,
            )
        finally:
            client.close()

    def _discard(self, messages: list[WriterCommitMessage | None]) -> None:
        tokens = [m.token for m in messages if isinstance(m, Staged) and m.token]
        if tokens:
            client = BridgeClient(self.options.address)
            try:
                client.request("discard", tokens=tokens)
            finally:
                client.close()


class MeshbusWriter(_Writing, DataSourceArrowWriter):
    """``df.write.format("meshbus")``: staged by the tasks, published on commit."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        self._publish(messages, None, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
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

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        self._publish(messages, batchId, self.sink_id)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        self._discard(messages)
