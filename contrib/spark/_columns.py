"""The Kafka-like columns of the ``meshbus`` data source, and messages turned into them.

Spark checks a Python data source's Arrow batches against its declared schema exactly,
so the Arrow schema here is the one Spark derives from :func:`spark_schema` (UTC
microsecond timestamps, nullable fields, ``binary``/``string`` rather than the large
variants). This module needs pyarrow only: the bridge builds batches in the app's
process, which need not import pyspark.
"""

from __future__ import annotations

import array
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from meshbus import Message, MessageOptions

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

#: ``timestampType`` of a row stamped by the publisher's node (Kafka's CreateTime).
CREATE_TIME = 0
#: ``timestampType`` of a row whose message came without a timestamp and was stamped
#: when the bridge captured it (Kafka's LogAppendTime).
LOG_APPEND_TIME = 1

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


def _headers_column(options: Sequence[MessageOptions]) -> pa.Array:
    rows: list[list[dict[str, Any]]] = []
    any_headers = False
    for option in options:
        headers: Mapping[str, Any] = option.headers
        if headers:
            any_headers = True
            rows.append([{"key": k, "value": header_value(v)} for k, v in headers.items()])
        else:
            rows.append([])
    if not any_headers:
        return _empty_lists(len(options))
    return pa.array(rows, HEADERS_TYPE)


def _empty_lists(n: int) -> pa.Array:
    """``n`` empty header lists: one zeroed offsets buffer, no per-row work."""
    offsets = pa.py_buffer(bytes(4 * (n + 1)))
    return pa.ListArray.from_buffers(
        HEADERS_TYPE, n, [None, offsets], children=[pa.array([], HEADER_TYPE)]
    )


def _int64s(values: array.array[int]) -> pa.Array:
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def messages_to_batch(
    messages: Sequence[Message],
    first_offset: int,
    captured_at: Sequence[float | None] | None = None,
) -> pa.RecordBatch:
    """Rows for ``messages``, numbered from ``first_offset``, with every column.

    ``key`` is the message's correlation ID (UTF-8), ``partition`` is 0, and
    ``timestamp`` is the publish time from the node's clock (``timestampType`` 0,
    CreateTime). A message published without a timestamp gets its entry of
    ``captured_at``, when the bridge took it, instead (``timestampType`` 1,
    LogAppendTime); with no entry either, the row's timestamp is null.

    Per message this reads four attributes; key and headers are worked out once per
    distinct options object (most messages share one), and the numeric columns are
    built from C arrays, so sealing costs a fraction of publishing.
    """
    n = len(messages)
    options = [m.options for m in messages]
    distinct = {id(o): o for o in options}
    if len(distinct) == 1:  # one shared options object: keys and headers are constant
        (only,) = distinct.values()
        key = None if only.correlation_id is None else only.correlation_id.encode()
        keys = pa.repeat(pa.scalar(key, pa.binary()), n)
        headers = _headers_column([only] * n) if only.headers else _empty_lists(n)
    else:
        keys = pa.array(
            [None if o.correlation_id is None else o.correlation_id.encode() for o in options],
            pa.binary(),
        )
        headers = _headers_column(options)
    stamps = [m.timestamp for m in messages]
    if captured_at is None:
        kinds = pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n)
    else:
        codes = array.array("i", bytes(4 * n))  # CREATE_TIME (0) everywhere
        for i, at in enumerate(captured_at):
            if at is not None and stamps[i] is None:
                stamps[i] = at
                codes[i] = LOG_APPEND_TIME
        kinds = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(codes)])
    micros = pc.multiply(pa.array(stamps, pa.float64()), 1_000_000.0)
    columns = [
        keys,
        pa.array([m.payload for m in messages], pa.binary()),
        pa.array([m.topic for m in messages], pa.string()),
        pa.repeat(pa.scalar(0, pa.int32()), n),
        _int64s(array.array("q", range(first_offset, first_offset + n))),
        pc.cast(pc.round(micros), pa.int64()).cast(_TIMESTAMP),
        kinds,
        headers,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_FULL_SCHEMA)
