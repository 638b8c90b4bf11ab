"""Rows Spark wrote, checked and turned into messages to publish.

Every row of a committed batch is checked before the first is published, so a bad
row fails the batch (Spark retries or stops the query) and publishes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from meshbus import validate_topic
from meshbus.errors import InvalidTopicError

from ._errors import BridgeError, SparkOptionError

__all__ = ["Row", "check_write_schema", "publishable_rows"]

#: ``(topic, payload, correlation id, headers)``, ready for ``publish``/``send``.
Row = tuple[str, bytes, "str | None", "dict[str, Any] | None"]

_TEXT = (pa.types.is_string, pa.types.is_large_string)
_BYTES = (pa.types.is_binary, pa.types.is_large_binary, *_TEXT)


def _is(kind: pa.DataType, checks: Sequence[Any]) -> bool:
    return any(check(kind) for check in checks)


def check_write_schema(schema: pa.Schema, topic_option: str | None) -> None:
    """Refuse a DataFrame the sink cannot publish; each error names the column."""
    names = set(schema.names)
    if "partition" in names:
        raise SparkOptionError(
            "partition",
            "a meshbus sink cannot place rows in partitions (a reader splits a stream by "
            "'key'): drop the column, e.g. df.drop('partition')",
        )
    if "value" not in names:
        raise SparkOptionError("value", "a write needs a 'value' column (binary or string)")
    if not _is(schema.field("value").type, _BYTES):
        raise SparkOptionError(
            "value", f"column must be binary or string, not {schema.field('value').type}"
        )
    if "key" in names and not _is(schema.field("key").type, _BYTES):
        raise SparkOptionError(
            "key", f"column must be binary or string, not {schema.field('key').type}"
        )
    if topic_option is None:
        if "topic" not in names:
            raise SparkOptionError("topic", "give a 'topic' option or a 'topic' column")
        if not _is(schema.field("topic").type, _TEXT):
            raise SparkOptionError(
                "topic", f"column must be string, not {schema.field('topic').type}"
            )
    if "headers" in names:
        kind = schema.field("headers").type
        ok = (
            pa.types.is_list(kind)
            and pa.types.is_struct(kind.value_type)
            and {kind.value_type.field(i).name for i in range(kind.value_type.num_fields)}
            >= {"key", "value"}
        )
        if not ok:
            raise SparkOptionError("headers", "column must be an array of struct<key, value>")


def _as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def publishable_rows(tables: Sequence[pa.Table], topic_option: str | None) -> list[Row]:
    """All rows of ``tables`` as messages; raise :class:`BridgeError` on the first bad one."""
    rows: list[Row] = []
    valid: set[str] = set()
    if topic_option is not None:
        try:
            validate_topic(topic_option)
        except InvalidTopicError as exc:
            raise SparkOptionError("topic", str(exc)) from None
        valid.add(topic_option)
    for table in tables:
        check_write_schema(table.schema, topic_option)
        n = table.num_rows
        values = table.column("value").to_pylist()
        topics = (
            [topic_option] * n if topic_option is not None else table.column("topic").to_pylist()
        )
        names = set(table.schema.names)
        keys = table.column("key").to_pylist() if "key" in names else [None] * n
        headers = table.column("headers").to_pylist() if "headers" in names else [None] * n
        for i in range(n):
            topic = topics[i]
            if topic not in valid:
                if topic is None:
                    raise BridgeError(
                        f"row {len(rows)}: topic is null and no 'topic' option is set"
                    )
                try:
                    validate_topic(topic)
                except InvalidTopicError as exc:
                    raise BridgeError(f"row {len(rows)}: {exc}") from None
                valid.add(topic)
            key = keys[i]
            row_headers = headers[i]
            rows.append(
                (
                    topic,
                    b"" if values[i] is None else _as_bytes(values[i]),
                    None if key is None else _as_bytes(key).decode("utf-8", "replace"),
                    {h["key"]: _header_text(h["value"], len(rows)) for h in row_headers}
                    if row_headers
                    else None,
                )
            )
    return rows


def _header_text(value: Any, row: int) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise BridgeError(f"row {row}: header value {value[:16]!r} is not UTF-8 text") from None
    return value
