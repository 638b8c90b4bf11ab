"""Shortcuts on :class:`SparkBridge` for the pipelines people build most.

Each one is plain PySpark underneath (``format("meshbus")`` with the bridge's
address and credentials filled in), so anything they do not cover is a
``.option(...)`` away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ._options import sink_id_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = ["Pipelines"]


def _source_options(
    subscribe: Iterable[str] | str | None, queue: str | None, options: dict[str, Any]
) -> dict[str, str]:
    chosen: dict[str, Any] = dict(options)
    if subscribe is not None:
        chosen["subscribe"] = subscribe if isinstance(subscribe, str) else ",".join(subscribe)
    if queue is not None:
        chosen["queue"] = queue
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in chosen.items()}


class Pipelines:
    """Mixed into :class:`SparkBridge`; every method needs the node running."""

    # Provided by SparkBridge, the only class this is mixed into.
    attach: Callable[[SparkSession], None]

    if TYPE_CHECKING:  # SparkBridge's property, declared for the type checker only

        @property
        def connect_options(self) -> dict[str, str]: ...

    def read_stream(
        self,
        spark: SparkSession,
        *,
        subscribe: Iterable[str] | str | None = None,
        queue: str | None = None,
        **options: Any,
    ) -> DataFrame:
        """``spark.readStream.format("meshbus")`` on this bridge, loaded.

        Other options go by their Spark names (``startingOffsets="latest"``,
        ``maxOffsetsPerTrigger=10000``, ``consumer="reports"``). Unlike the data
        source on its own, which starts a stream at ``latest`` as Kafka's does, the
        shortcut starts at ``earliest``: what the bridge captured for the app so far.
        """
        self.attach(spark)
        if not any(k.lower() in ("startingoffsets", "startingtimestamp") for k in options):
            options["startingOffsets"] = "earliest"
        reader = spark.readStream.format("meshbus").options(**self.connect_options)
        return reader.options(**_source_options(subscribe, queue, options)).load()

    def read(
        self,
        spark: SparkSession,
        *,
        subscribe: Iterable[str] | str | None = None,
        queue: str | None = None,
        **options: Any,
    ) -> DataFrame:
        """``spark.read.format("meshbus")``: what the stream holds now, as a DataFrame."""
        self.attach(spark)
        reader = spark.read.format("meshbus").options(**self.connect_options)
        return reader.options(**_source_options(subscribe, queue, options)).load()

    def write_stream(
        self, df: DataFrame, *, checkpoint: str, topic: str | None = None, **options: Any
    ) -> DataStreamWriter:
        """``df.writeStream.format("meshbus")`` to this bridge; call ``.start()`` on it."""
        self.attach(df.sparkSession)
        writer = (
            df.writeStream.format("meshbus")
            .options(**self.connect_options)
            .option("checkpointLocation", checkpoint)
        )
        return writer.options(
            **_source_options(
                None, None, {"topic": topic, **options} if topic is not None else options
            )
        )

    def write(self, df: DataFrame, *, topic: str | None = None, **options: Any) -> None:
        """``df.write.format("meshbus")`` to this bridge: publishes once Spark commits."""
        self.attach(df.sparkSession)
        writer = df.write.format("meshbus").mode("append").options(**self.connect_options)
        if topic is not None:
            writer = writer.option("topic", topic)
        writer.options(**_source_options(None, None, options)).save()

    def sink_to(
        self,
        spark: SparkSession,
        *,
        checkpoint: str,
        path: str | None = None,
        table: str | None = None,
        subscribe: Iterable[str] | str | None = None,
        queue: str | None = None,
        format: str = "parquet",
        transform: Callable[[DataFrame], DataFrame] | None = None,
        trigger: str | None = "500 milliseconds",
        available_now: bool = False,
        partition_by: Iterable[str] = (),
        output_mode: str = "append",
        query_name: str | None = None,
        consumer: str | None = None,
        **options: Any,
    ) -> StreamingQuery:
        """Start a streaming query from a stream of this bridge into files or a table.

        Messages are read with ``format("meshbus")`` (Kafka-like columns), passed
        through ``transform`` if given, and written to ``path`` (``format``,
        Parquet by default) or to ``table``. Spark's checkpoint makes the file sink
        exactly-once per batch; fed by a queue, the bridge acknowledges a batch's
        messages only after Spark committed it, so a crash loses none.

        :param checkpoint: the query's checkpoint directory (keep it across restarts).
        :param consumer: names the query for retention and ``committed`` offsets;
            defaults to one derived from ``checkpoint``.
        """
        if (path is None) == (table is None):
            raise ValueError("sink_to needs exactly one of path= and table=")
        if consumer is None:
            consumer = sink_id_for(checkpoint)
        frame = self.read_stream(
            spark, subscribe=subscribe, queue=queue, consumer=consumer, **options
        )
        if transform is not None:
            frame = transform(frame)
        writer = frame.writeStream.outputMode(output_mode).option("checkpointLocation", checkpoint)
        if query_name is not None:
            writer = writer.queryName(query_name)
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif trigger is not None:
            writer = writer.trigger(processingTime=trigger)
        if table is not None:
            return writer.toTable(table, format=format)
        return writer.format(format).start(path)
