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
    "captured_to_batch",
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


_counting: pa.Array = pa.array([], pa.int64())  # 0, 1, 2, ...: grown on demand, then shared


def _offsets(first: int, n: int) -> pa.Array:
    """``first, first + 1, ...``: one vectorised add to a shared 0..n-1."""
    global _counting
    counting = _counting
    if len(counting) < n:
        size = max(n, 2 * len(counting), 1 << 16)
        numbers = array.array("q", range(size))
        counting = pa.Array.from_buffers(pa.int64(), size, [None, pa.py_buffer(numbers)])
        _counting = counting
    return pc.add(counting.slice(0, n), pa.scalar(first, pa.int64()))


#: Entries per message in a capture, the flat list :func:`captured_to_batch` takes:
#: topic, payload, timestamp, options, timestampType. Keeping these references instead
#: of the message lets the message go as soon as its publish returns: a capture holds
#: no objects the garbage collector must scan (bytes, strings, floats and small ints
#: are not tracked), which for a stream of a million messages is most of the cost of
#: capturing it.
FIELDS = 5


def messages_to_batch(
    messages: Sequence[Message], first_offset: int, partition: int = 0
) -> pa.RecordBatch:
    """Rows for ``messages``, numbered from ``first_offset`` (see :func:`captured_to_batch`)."""
    flat: list[Any] = []
    for m in messages:
        flat += (m.topic, m.payload, m.timestamp, m.options, CREATE_TIME)
    return captured_to_batch(flat, first_offset, partition)


def captured_to_batch(flat: list[Any], first_offset: int, partition: int = 0) -> pa.RecordBatch:
    """Rows for a capture (:data:`FIELDS` entries a message), with every column.

    ``key`` is the message's correlation ID (UTF-8), ``partition`` is ``partition``, and
    ``timestamp`` is the publish time from the node's clock (``timestampType`` 0,
    CreateTime), or the capture's time for a message that had none (``timestampType``
    1, LogAppendTime).

    The columns come from strided slices of the capture, each turned into an Arrow
    array in one call; key and headers are worked out once when every message has the
    same options (the common case: they share one object), else per row.
    """
    n = len(flat) // FIELDS
    options: list[MessageOptions] = flat[3::FIELDS]
    # One options value throughout (most messages share one object: an identity check
    # in C per row, stopping at the first that differs): constant key and headers.
    if n and options == [options[0]] * n:
        only = options[0]
        key = None if only.correlation_id is None else only.correlation_id.encode()
        keys = pa.repeat(pa.scalar(key, pa.binary()), n)
        headers = _headers_column([only] * n) if only.headers else _empty_lists(n)
    else:
        keys = pa.array(
            [None if o.correlation_id is None else o.correlation_id.encode() for o in options],
            pa.binary(),
        )
        headers = _headers_column(options)
    types = flat[4::FIELDS]
    if LOG_APPEND_TIME in types:
        codes = array.array("i", types)
        kinds = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(codes)])
    else:  # all CreateTime: no per-row conversion
        kinds = pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n)
    micros = pc.multiply(pa.array(flat[2::FIELDS], pa.float64()), 1_000_000.0)
    columns = [
        keys,
        pa.array(flat[1::FIELDS], pa.binary()),
        pa.array(flat[0::FIELDS], pa.string()),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        _offsets(first_offset, n),
        pc.cast(pc.round(micros), pa.int64()).cast(_TIMESTAMP),
        kinds,
        headers,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_FULL_SCHEMA)
