"""Rows Spark wrote, checked and turned into messages (pyarrow only)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from meshbus.contrib.spark import BridgeError, SparkOptionError
from meshbus.contrib.spark._rows import check_write_schema, publishable_rows

HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def test_topic_column_value_key_and_headers_become_messages() -> None:
    table = pa.table(
        {
            "topic": ["a/1", "a/2"],
            "value": [b"\x00x", b""],
            "key": [b"k1", None],
            "headers": pa.array([[{"key": "h", "value": b"v"}], []], HEADERS),
        }
    )
    assert publishable_rows([table], None) == [
        ("a/1", b"\x00x", "k1", {"h": "v"}),
        ("a/2", b"", None, None),
    ]


def test_string_value_and_key_are_utf8() -> None:
    table = pa.table({"topic": ["t"], "value": ["é"], "key": ["ключ"]})
    assert publishable_rows([table], None) == [("t", "é".encode(), "ключ", None)]


@pytest.mark.parametrize("kind", [pa.large_string(), pa.large_binary(), pa.binary()])
def test_other_text_and_binary_value_types_are_accepted(kind: pa.DataType) -> None:
    value = "v" if pa.types.is_large_string(kind) else b"v"
    table = pa.table({"value": pa.array([value], kind)})
    assert publishable_rows([table], "t") == [("t", b"v", None, None)]


def test_the_topic_option_wins_over_the_column() -> None:
    table = pa.table({"topic": ["ignored/1", None], "value": [b"a", b"b"]})
    rows = publishable_rows([table], "fixed/topic")
    assert [r[0] for r in rows] == ["fixed/topic", "fixed/topic"]


def test_a_null_value_is_an_empty_payload() -> None:
    table = pa.table({"value": pa.array([None, b"x"], pa.binary())})
    assert [r[1] for r in publishable_rows([table], "t")] == [b"", b"x"]


def test_headers_with_several_entries_and_string_values() -> None:
    kind = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.string())]))
    table = pa.table(
        {
            "value": [b"x"],
            "headers": pa.array([[{"key": "a", "value": "1"}, {"key": "b", "value": "ü"}]], kind),
        }
    )
    assert publishable_rows([table], "t")[0][3] == {"a": "1", "b": "ü"}


def test_rows_of_several_tables_are_concatenated() -> None:
    one = pa.table({"topic": ["a"], "value": [b"1"]})
    two = pa.table({"topic": ["b", "c"], "value": ["2", "3"]})
    assert [(r[0], r[1]) for r in publishable_rows([one, two], None)] == [
        ("a", b"1"),
        ("b", b"2"),
        ("c", b"3"),
    ]


def test_a_null_topic_without_the_option_names_the_row() -> None:
    table = pa.table({"topic": ["ok/1", None], "value": [b"a", b"b"]})
    with pytest.raises(BridgeError, match=r"row 1: topic is null"):
        publishable_rows([table], None)


def test_an_invalid_topic_names_the_row_across_tables() -> None:
    one = pa.table({"topic": ["ok/1"], "value": [b"a"]})
    two = pa.table({"topic": ["ok/2", "#reserved/x"], "value": [b"b", b"c"]})
    with pytest.raises(BridgeError, match=r"row 2: .*#reserved/x"):
        publishable_rows([one, two], None)


def test_an_invalid_topic_option_is_refused() -> None:
    table = pa.table({"value": [b"a"]})
    with pytest.raises(SparkOptionError, match=r"option 'topic'.*#bad"):
        publishable_rows([table], "#bad")


def test_a_non_utf8_header_value_is_refused() -> None:
    table = pa.table(
        {
            "value": [b"a", b"b"],
            "headers": pa.array([[], [{"key": "h", "value": b"\xff\xfe"}]], HEADERS),
        }
    )
    with pytest.raises(BridgeError, match=r"header value .*not UTF-8"):
        publishable_rows([table], "t")


def test_a_non_utf8_header_value_error_names_the_row() -> None:
    table = pa.table(
        {
            "value": [b"a", b"b"],
            "headers": pa.array([[], [{"key": "h", "value": b"\xff\xfe"}]], HEADERS),
        }
    )
    with pytest.raises(BridgeError, match=r"row 1"):
        publishable_rows([table], "t")


@pytest.mark.parametrize(
    ("columns", "topic", "option", "why"),
    [
        ({"topic": pa.array(["t"])}, None, "value", "needs a 'value' column"),
        ({"value": pa.array([1])}, "t", "value", "binary or string, not int64"),
        ({"value": pa.array([[b"x"]])}, "t", "value", "binary or string"),
        ({"value": pa.array([b"x"]), "key": pa.array([1.5])}, "t", "key", "not double"),
        ({"value": pa.array([b"x"])}, None, "topic", "'topic' option or a 'topic' column"),
        ({"value": pa.array([b"x"]), "topic": pa.array([b"t"])}, None, "topic", "not binary"),
        ({"value": pa.array([b"x"]), "headers": pa.array([["a"]])}, "t", "headers", "struct"),
        ({"value": pa.array([b"x"]), "headers": pa.array(["a"])}, "t", "headers", "array"),
        (
            {"value": pa.array([b"x"]), "headers": pa.array([[{"name": "a", "value": b"v"}]])},
            "t",
            "headers",
            "struct<key, value>",
        ),
    ],
)
def test_bad_schemas_name_the_column(
    columns: dict[str, pa.Array], topic: str | None, option: str, why: str
) -> None:
    table = pa.table(columns)
    with pytest.raises(SparkOptionError) as info:
        check_write_schema(table.schema, topic)
    assert info.value.option == option
    assert repr(option) in str(info.value)
    assert why in str(info.value)
    with pytest.raises(SparkOptionError):
        publishable_rows([table], topic)


def test_good_schemas_pass() -> None:
    check_write_schema(pa.schema([("value", pa.string()), ("topic", pa.large_string())]), None)
    check_write_schema(pa.schema([("value", pa.binary()), ("topic", pa.int32())]), "t")
    check_write_schema(
        pa.schema([("value", pa.binary()), ("key", pa.string()), ("headers", HEADERS)]), "t"
    )


def test_no_row_is_returned_when_a_later_one_is_bad() -> None:
    good = pa.table({"topic": ["a"], "value": [b"1"]})
    bad = pa.table({"topic": [None], "value": [b"2"]}, schema=good.schema)
    with pytest.raises(BridgeError):
        publishable_rows([good, bad], None)
