"""The Kafka-like columns of the ``meshbus`` data source, and messages turned into them.

Spark checks a Python data source's Arrow batches against its declared schema exactly,
so the Arrow schema here is the one Spark derives from :func:`spark_schema` (UTC
microsecond timestamps, nullable fields, ``binary``/``string`` rather than the large
variants). This module needs pyarrow only: the bridge builds batches in the app's
process, which need not import pyspark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from meshbus import Message

__all__ = [
    "HEADERS_TYPE",
    "READ_COLUMNS",
    "arrow_schema",
    "header_value",
    "messages_to_batch",
    "spark_schema",
]

#: Read columns in order; ``headers`` comes last and only with ``includeHeaders``.
READ_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")

#: ``timestampType`` of every row: the publisher's clock (Kafka's CreateTime).
CREATE_TIME = 0

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(HEADER_TYPE)
_TIMESTAMP = pa.timestamp("us", tz="UTC")

_FULL_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", _TIMESTAMP),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", HEADERS_TYPE),
    ]
)


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema of read batches, with or without the ``headers`` column."""
    return _FULL_SCHEMA if include_headers else _FULL_SCHEMA.remove(7)


def spark_schema(include_headers: bool) -> StructType:
    """The Spark schema of ``format("meshbus")`` reads (imports pyspark)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def header_value(value: Any) -> bytes:
    """A message header value as the bytes of the ``headers`` column.

    Bytes stay as they are and text is UTF-8; anything else (numbers, booleans,
    lists, maps) is its JSON form, so ``7`` reads back as ``b"7"``.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return orjson.dumps(value)


def _headers_column(messages: Sequence[Message]) -> pa.Array:
    rows: list[list[dict[str, Any]]] = []
    any_headers = False
    for message in messages:
        headers: Mapping[str, Any] = message.options.headers
        if headers:
            any_headers = True
            rows.append([{"key": k, "value": header_value(v)} for k, v in headers.items()])
        else:
            rows.append([])
    if not any_headers:  # the common case: one offsets buffer, no per-row lists
        offsets = pa.array([0] * (len(messages) + 1), pa.int32())
        return pa.ListArray.from_arrays(offsets, pa.array([], HEADER_TYPE))
    return pa.array(rows, HEADERS_TYPE)


def messages_to_batch(messages: Sequence[Message], first_offset: int) -> pa.RecordBatch:
    """Rows for ``messages``, numbered from ``first_offset``, with every column.

    ``key`` is the message's correlation ID (UTF-8), ``partition`` is 0, and
    ``timestamp`` is the publish time from the node's clock.
    """
    n = len(messages)
    correlation = [m.options.correlation_id for m in messages]
    keys = pa.array([None if c is None else c.encode() for c in correlation], pa.binary())
    columns = [
        keys,
        pa.array([m.payload for m in messages], pa.binary()),
        pa.array([m.topic for m in messages], pa.string()),
        pa.repeat(pa.scalar(0, pa.int32()), n),
        pa.array(range(first_offset, first_offset + n), pa.int64()),
        pa.array([round(m.timestamp * 1_000_000) for m in messages], _TIMESTAMP),
        pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
        _headers_column(messages),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_FULL_SCHEMA)
