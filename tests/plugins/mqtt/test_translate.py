"""MQTT 5 user properties as headers and back: every value, in the order sent
(MQTT-3.3.2-18), without a header for the order when grouping by name keeps it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshbus import Message
from meshbus.plugins.mqtt._translate import (
    USER_PROPERTY_ORDER,
    publish_options,
    take_header,
    v5_properties,
)


def packet(properties: list[tuple[str, str]]) -> Any:
    return SimpleNamespace(
        user_properties=properties,
        content_type=None,
        payload_format_indicator=0,
        response_topic=None,
        correlation_data=None,
    )


def round_trip(properties: list[tuple[str, str]]) -> list[tuple[str, str]]:
    headers = publish_options(packet(properties)).get("headers", {})
    out = v5_properties(Message("t", b"", headers=headers), 0.0)
    return [] if out is None else out["user_properties"]


@pytest.mark.parametrize(
    ("properties", "order"),
    [
        ([("a", "1"), ("b", "2")], None),
        ([("a", "1"), ("a", "2"), ("b", "3")], None),  # runs of a name: grouping keeps it
        ([("a", "1"), ("b", "2"), ("a", "3")], ["a", "b", "a"]),
        ([("a", "1"), ("b", "2"), ("b", "3"), ("a", "4")], ["a", "b", "b", "a"]),
    ],
)
def test_the_order_header_is_there_only_when_names_interleave(
    properties: list[tuple[str, str]], order: list[str] | None
) -> None:
    headers = publish_options(packet(properties))["headers"]
    assert headers.get(USER_PROPERTY_ORDER) == order
    assert round_trip(properties) == properties


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["1", "2", ""])), max_size=8))
def test_any_properties_go_out_as_they_came(properties: list[tuple[str, str]]) -> None:
    assert round_trip(properties) == properties


def test_taking_a_property_out_keeps_the_order_of_the_others() -> None:
    headers = publish_options(packet([("k", "1"), ("hop", "2"), ("j", "3"), ("k", "4")]))["headers"]
    assert take_header(headers, "hop") == "2"
    assert headers == {"k": ["1", "4"], "j": "3", USER_PROPERTY_ORDER: ["k", "j", "k"]}
    # once what is left comes in runs, the order header goes
    headers = publish_options(packet([("k", "1"), ("hop", "2"), ("k", "3")]))["headers"]
    assert take_header(headers, "hop") == "2"
    assert headers == {"k": ["1", "3"]}
    assert take_header(headers, "absent") is None


@pytest.mark.parametrize(
    "headers",
    [
        {"a": ["1", "2"], "b": "x", USER_PROPERTY_ORDER: ["a", "b"]},  # counts differ
        {"a": "1", "n": 5, USER_PROPERTY_ORDER: ["a", "n"]},  # not all text
        {"a": "1", USER_PROPERTY_ORDER: "a"},  # not a list
    ],
)
def test_an_order_header_that_does_not_fit_the_headers_is_an_ordinary_header(
    headers: dict[str, Any],
) -> None:
    out = v5_properties(Message("t", b"", headers=headers), 0.0)
    assert out is not None
    names = [name for name, _ in out["user_properties"]]
    assert USER_PROPERTY_ORDER in names
