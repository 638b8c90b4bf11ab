"""Messages as the Kafka-like Arrow columns of format("meshbus") reads (pyarrow only)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pyarrow as pa
import pytest

from meshbus import Message
from meshbus.contrib.spark import arrow_schema
from meshbus.contrib.spark._columns import (
    HEADERS_TYPE,
    READ_COLUMNS,
    _offsets,
    captured_to_batch,
    header_value,
    messages_to_batch,
)


def test_the_schema_has_the_read_columns_in_order() -> None:
    assert arrow_schema(True).names == [*READ_COLUMNS, "headers"]
    assert arrow_schema(False).names == list(READ_COLUMNS)
    assert "headers" not in arrow_schema(False).names
    assert arrow_schema(True).field("headers").type == HEADERS_TYPE
    assert arrow_schema(True).field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert arrow_schema(False).field("key").type == pa.binary()
    assert arrow_schema(False).field("offset").type == pa.int64()
    assert arrow_schema(False).field("partition").type == pa.int32()


def test_a_batch_has_the_full_schema_and_numbers_rows_from_first_offset() -> None:
    messages = [Message(f"t/{i}", bytes([i])) for i in range(3)]
    batch = messages_to_batch(messages, 40)
    assert batch.schema == arrow_schema(True)
    assert batch.num_rows == 3
    assert batch.column("offset").to_pylist() == [40, 41, 42]
    assert batch.column("topic").to_pylist() == ["t/0", "t/1", "t/2"]
    assert batch.column("value").to_pylist() == [b"\x00", b"\x01", b"\x02"]
    assert batch.column("partition").to_pylist() == [0, 0, 0]
    assert batch.column("timestampType").to_pylist() == [0, 0, 0]


def test_no_messages_give_an_empty_batch_of_the_same_schema() -> None:
    batch = messages_to_batch([], 9)
    assert batch.num_rows == 0
    assert batch.schema == arrow_schema(True)


def test_key_is_the_correlation_id_as_utf8_or_null() -> None:
    messages = [
        Message("t", b"a", correlation_id="order-7"),
        Message("t", b"b"),
        Message("t", b"c", correlation_id="é"),
    ]
    keys = messages_to_batch(messages, 0).column("key").to_pylist()
    assert keys == [b"order-7", None, "é".encode()]


def test_headers_column_is_empty_lists_without_headers() -> None:
    batch = messages_to_batch([Message("t", b"a"), Message("t", b"b")], 0)
    headers = batch.column("headers")
    assert headers.type == HEADERS_TYPE
    assert headers.to_pylist() == [[], []]
    assert headers.null_count == 0
    batch.validate(full=True)


def test_headers_become_key_value_structs_and_rows_without_stay_empty() -> None:
    messages = [
        Message("t", b"a", headers={"user": "ada", "raw": b"\xff\x00"}),
        Message("t", b"b"),
        Message("t", b"c", headers={"n": 7, "ok": True, "list": [1, "x"], "map": {"a": None}}),
    ]
    batch = messages_to_batch(messages, 0)
    batch.validate(full=True)
    assert batch.column("headers").to_pylist() == [
        [{"key": "user", "value": b"ada"}, {"key": "raw", "value": b"\xff\x00"}],
        [],
        [
            {"key": "n", "value": b"7"},
            {"key": "ok", "value": b"true"},
            {"key": "list", "value": b'[1,"x"]'},
            {"key": "map", "value": b'{"a":null}'},
        ],
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"\x00\xff", b"\x00\xff"),
        (b"", b""),
        ("text", b"text"),
        ("ü", "ü".encode()),
        (7, b"7"),
        (2.5, b"2.5"),
        (False, b"false"),
        (None, b"null"),
        ([1, 2], b"[1,2]"),
        ({"k": "v"}, orjson.dumps({"k": "v"})),
    ],
)
def test_header_value(value: object, expected: bytes) -> None:
    assert header_value(value) == expected


def test_timestamp_is_utc_microseconds_of_the_publish_time() -> None:
    at = 1_700_000_000.123456
    batch = messages_to_batch(
        [Message("t", b"x", timestamp=at), Message("t", b"y", timestamp=0.0)], 0
    )
    column = batch.column("timestamp")
    assert column.type == pa.timestamp("us", tz="UTC")
    assert column.cast(pa.int64()).to_pylist() == [1_700_000_000_123_456, 0]
    assert batch.column("timestampType").to_pylist() == [0, 0]
    stamp = column[0].as_py()
    assert stamp.utcoffset() is not None
    assert stamp.utcoffset().total_seconds() == 0
    assert stamp == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)


def test_a_capture_carries_each_rows_timestamp_type() -> None:
    options = Message("t", b"").options
    flat = [
        *("t/a", b"a", 10.0, options, 0),
        *("t/b", b"b", 11.5, options, 1),  # stamped when captured: LogAppendTime
        *("t/c", b"c", 12.0, options, 0),
    ]
    batch = captured_to_batch(flat, 7)
    assert batch.column("offset").to_pylist() == [7, 8, 9]
    assert batch.column("topic").to_pylist() == ["t/a", "t/b", "t/c"]
    assert batch.column("value").to_pylist() == [b"a", b"b", b"c"]
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [
        10_000_000,
        11_500_000,
        12_000_000,
    ]
    assert batch.column("timestampType").to_pylist() == [0, 1, 0]
    only_create_time = captured_to_batch(flat[:5] + flat[10:], 0)
    assert only_create_time.column("timestampType").to_pylist() == [0, 0]


def test_a_message_without_a_timestamp_has_a_null_one() -> None:
    batch = messages_to_batch([Message("t", b"a"), Message("t", b"b", timestamp=2.0)], 0)
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [None, 2_000_000]
    assert batch.column("timestampType").to_pylist() == [0, 0]


def test_a_batch_without_headers_matches_the_narrow_schema() -> None:
    batch = messages_to_batch([Message("t", b"x", headers={"a": 1})], 0)
    narrow = batch.drop_columns(["headers"])
    assert narrow.schema == arrow_schema(False)


def test_offsets_count_up_from_the_first_past_the_shared_numbers() -> None:
    assert _offsets(5, 3).to_pylist() == [5, 6, 7]
    big = _offsets(10, 200_000)  # beyond what was made so far: grown
    assert (len(big), big[0].as_py(), big[-1].as_py()) == (200_000, 10, 200_009)
    assert _offsets(2**40, 2).to_pylist() == [2**40, 2**40 + 1]
    assert _offsets(0, 0).to_pylist() == []
