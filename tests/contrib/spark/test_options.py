"""Options of format("meshbus"): parsing, spelling, defaults and each refusal (no Spark)."""

from __future__ import annotations

import os

import pytest

from meshbus.contrib.spark import ADDRESS_ENV, DEFAULT_ADDRESS, SparkOptionError
from meshbus.contrib.spark._client import NodeTarget
from meshbus.contrib.spark._options import (
    check_known,
    parse_address,
    read_options,
    sink_id_for,
    write_options,
)
from meshbus.errors import ConfigurationError


@pytest.fixture(autouse=True)
def _no_address_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADDRESS_ENV, raising=False)


def test_every_read_option_parses() -> None:
    parsed = read_options(
        {
            "subscribe": " a/> , b/*/c ,a/>",
            "startingOffsets": "Latest",
            "maxOffsetsPerTrigger": " 250 ",
            "includeHeaders": "TRUE",
            "consumer": " reports ",
            "address": "10.1.2.3:4567, tls://gw.example:55443",
            "vpn": "plant",
            "username": "spark",
            "password": " secret ",
            "tlsCa": "/etc/ca.pem",
            "tlsCertificate": "/etc/me.pem",
            "tlsPrivateKey": "/etc/me.key",
            "partitions": "4",
            "checkpointLocation": "/tmp/ck",
            "path": "ignored",
        }
    )
    assert parsed.subscribe == ("a/>", "b/*/c")  # stripped, de-duplicated, in order
    assert parsed.queue is None
    assert parsed.starting_offsets == "latest"
    assert parsed.max_offsets_per_trigger == 250
    assert parsed.include_headers is True
    assert parsed.consumer == "reports"
    assert parsed.node == NodeTarget(
        urls=("tcp://10.1.2.3:4567", "tls://gw.example:55443"),  # in connect order
        vpn="plant",
        username="spark",
        password=" secret ",  # a password is taken as written
        tls_ca="/etc/ca.pem",
        tls_certificate="/etc/me.pem",
        tls_private_key="/etc/me.key",
    )
    assert "secret" not in repr(parsed.node)
    assert parsed.partitions == 4
    assert parsed.stream == {"subscribe": ["a/>", "b/*/c"], "partitions": 4}


def test_kafkas_offset_options_parse() -> None:
    parsed = read_options(
        {
            "subscribe": "a/>",
            "partitions": "2",
            "startingOffsets": '{"0": 5, "1": -2}',
            "endingOffsets": '{"0": 9, "1": -1}',
            "failOnDataLoss": "false",
            "minOffsetsPerTrigger": "100",
            "maxTriggerDelay": "30s",
        }
    )
    assert parsed.starting_offsets == {"0": 5, "1": -2}
    assert parsed.ending_offsets == {"0": 9, "1": -1}
    assert parsed.fail_on_data_loss is False
    assert (parsed.min_offsets_per_trigger, parsed.max_trigger_delay) == (100, 30.0)
    assert read_options(
        {"queue": "q", "startingTimestamp": "1700000000000"}
    ).starting_timestamp == (1700000000000)
    for text, seconds in (("500ms", 0.5), ("15m", 900.0), ("2h", 7200.0), ("1d", 86400.0)):
        assert read_options({"queue": "q", "maxTriggerDelay": text}).max_trigger_delay == seconds


def test_a_queue_read_parses_and_names_the_queue_stream() -> None:
    parsed = read_options({"queue": " orders ", "startingOffsets": "committed"})
    assert (parsed.queue, parsed.subscribe) == ("orders", None)
    assert parsed.starting_offsets == "committed"
    assert parsed.stream == {"queue": "orders"}


def test_include_headers_false_parses() -> None:
    assert read_options({"queue": "q", "includeHeaders": "False"}).include_headers is False


def test_every_write_option_parses() -> None:
    parsed = write_options(
        {
            "topic": "out/x",
            "deliveryMode": "Persistent",
            "sinkId": " s1 ",
            "address": "[::1]:9",
            "checkpointLocation": "/tmp/ck",
        }
    )
    assert parsed.topic == "out/x"
    assert parsed.delivery_mode == "persistent"
    assert parsed.sink_id == "s1"
    assert parsed.node.urls == ("tcp://[::1]:9",)
    assert parsed.checkpoint_location == "/tmp/ck"


@pytest.mark.parametrize("mode", ["direct", "persistent", "non-persistent"])
def test_every_delivery_mode_parses(mode: str) -> None:
    assert write_options({"deliveryMode": mode.upper()}).delivery_mode == mode


def test_lower_case_names_as_spark_passes_them() -> None:
    parsed = read_options(
        {
            "subscribe": "a/>",
            "startingoffsets": "latest",
            "maxoffsetspertrigger": "7",
            "includeheaders": "true",
            "consumer": "c",
        }
    )
    assert (parsed.starting_offsets, parsed.max_offsets_per_trigger) == ("latest", 7)
    assert parsed.include_headers is True
    written = write_options({"deliverymode": "non-persistent", "sinkid": "s", "TOPIC": "t"})
    assert (written.delivery_mode, written.sink_id, written.topic) == ("non-persistent", "s", "t")
    assert write_options({"checkpointlocation": "/ck"}).checkpoint_location == "/ck"


def test_read_defaults() -> None:
    parsed = read_options({"subscribe": "a/>"})
    assert (
        parsed.starting_offsets is None
    )  # the reader's: latest for a stream, earliest for a batch
    assert parsed.starting_timestamp is None
    assert parsed.ending_offsets == "latest"
    assert parsed.fail_on_data_loss is True
    assert parsed.min_offsets_per_trigger is None
    assert parsed.max_trigger_delay == 900.0
    assert parsed.consumer == "default"
    assert parsed.max_offsets_per_trigger is None
    assert parsed.include_headers is False
    assert parsed.partitions == 1
    assert parsed.node == NodeTarget(urls=(DEFAULT_ADDRESS,))
    assert DEFAULT_ADDRESS == "tcp://127.0.0.1:55555"  # a node's default listener


def test_write_defaults() -> None:
    parsed = write_options({})
    assert parsed.delivery_mode == "direct"
    assert (parsed.topic, parsed.sink_id, parsed.checkpoint_location) == (None, None, None)
    assert parsed.node.urls == (DEFAULT_ADDRESS,)


def test_address_comes_from_the_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADDRESS_ENV, "10.0.0.9:1234")
    assert read_options({"queue": "q"}).node.urls == ("tcp://10.0.0.9:1234",)
    assert write_options({}).node.urls == ("tcp://10.0.0.9:1234",)
    assert read_options({"queue": "q", "address": "h:1"}).node.urls == ("tcp://h:1",)
    monkeypatch.setenv(ADDRESS_ENV, "")
    assert write_options({}).node.urls == (DEFAULT_ADDRESS,)


def expect_option_error(option: str, call: object) -> SparkOptionError:
    assert callable(call)
    with pytest.raises(SparkOptionError) as info:
        call()
    assert info.value.option == option
    assert repr(option) in str(info.value)
    assert isinstance(info.value, ConfigurationError)
    return info.value


@pytest.mark.parametrize(
    ("options", "option", "why"),
    [
        ({"subscribe": "a/>", "queue": "q"}, "queue", "not both"),
        ({"Subscribe": "a/>", "QUEUE": "q"}, "queue", "not both"),
        ({}, "subscribe", "'queue'"),
        ({"consumer": "c"}, "subscribe", "'queue'"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger", "'ten'"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", "'0'"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "-3"}, "maxOffsetsPerTrigger", "'-3'"),
        ({"subscribe": "a", "maxoffsetspertrigger": "1.5"}, "maxOffsetsPerTrigger", "'1.5'"),
        ({"subscribe": "a", "includeHeaders": "yes"}, "includeHeaders", "true or false"),
        ({"subscribe": "a", "includeheaders": ""}, "includeHeaders", "true or false"),
        ({"subscribe": "a", "startingOffsets": "newest"}, "startingOffsets", "'newest'"),
        ({"subscribe": "a", "startingoffsets": "0"}, "startingOffsets", "earliest"),
        ({"subscribe": "a/>,#bad/x"}, "subscribe", "'#bad/x'"),
        ({"subscribe": " , ,"}, "subscribe", "one or more"),
        ({"queue": "  "}, "queue", "empty"),
        ({"queue": "q", "consumer": " "}, "consumer", "empty"),
        ({"subscribe": "a", "topic": "t"}, "topic", "writes only"),
        ({"subscribe": "a", "deliverymode": "direct"}, "deliveryMode", "writes only"),
        ({"subscribe": "a", "SINKID": "s"}, "sinkId", "writes only"),
        ({"subscribe": "a", "address": "nohost"}, "address", "host:port"),
        ({"subscribe": "a", "address": "h:port"}, "address", "host:port"),
        ({"subscribe": "a", "address": "h:65536"}, "address", "host:port"),
        ({"subscribe": "a", "address": ":55700"}, "address", "host:port"),
        ({"subscribe": "a", "address": "http://h:1"}, "address", "tcp:// or tls://"),
        ({"subscribe": "a", "address": "0.0.0.0:1"}, "address", "wildcard"),
        ({"subscribe": "a", "address": " , "}, "address", "one or more"),
        ({"subscribe": "a", "partitions": "0"}, "partitions", "positive"),
        ({"subscribe": "a", "partitions": "257"}, "partitions", "at most 256"),
        ({"subscribe": "a", "vpn": " "}, "vpn", "empty"),
        ({"subscribe": "a", "tlsCertificate": "/c.pem"}, "tlsCertificate", "tlsPrivateKey"),
        ({"subscribe": "a", "startingOffsets": "{bad"}, "startingOffsets", "not JSON"),
        ({"subscribe": "a", "startingOffsets": "[1]"}, "startingOffsets", "earliest, latest"),
        ({"subscribe": "a", "startingOffsets": '{"x": 1}'}, "startingOffsets", "partition"),
        ({"subscribe": "a", "startingOffsets": '{"0": -3}'}, "startingOffsets", "-3"),
        ({"subscribe": "a", "startingOffsets": '{"0": 1, "1": 2}'}, "startingOffsets", "has 1"),
        ({"subscribe": "a", "endingOffsets": "earliest"}, "endingOffsets", "latest"),
        ({"subscribe": "a", "startingTimestamp": "-1"}, "startingTimestamp", "epoch"),
        (
            {"subscribe": "a", "startingTimestamp": "1", "startingOffsets": "latest"},
            "startingTimestamp",
            "either",
        ),
        ({"subscribe": "a", "failOnDataLoss": "no"}, "failOnDataLoss", "true or false"),
        ({"subscribe": "a", "minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger", "positive"),
        ({"subscribe": "a", "maxTriggerDelay": "soon"}, "maxTriggerDelay", "duration"),
    ],
)
def test_bad_read_options_name_the_option(options: dict[str, str], option: str, why: str) -> None:
    error = expect_option_error(option, lambda: read_options(options))
    assert why in str(error)


@pytest.mark.parametrize(
    ("options", "option", "why"),
    [
        ({"topic": "#reserved/x"}, "topic", "'#reserved/x'"),
        ({"topic": ""}, "topic", "not a valid topic"),
        ({"deliveryMode": "guaranteed"}, "deliveryMode", "'guaranteed'"),
        ({"sinkId": ""}, "sinkId", "empty"),
        ({"subscribe": "a/>"}, "subscribe", "reads only"),
        ({"queue": "q"}, "queue", "reads only"),
        ({"startingOffsets": "latest"}, "startingOffsets", "reads only"),
        ({"maxoffsetspertrigger": "5"}, "maxOffsetsPerTrigger", "reads only"),
        ({"includeHeaders": "true"}, "includeHeaders", "reads only"),
        ({"consumer": "c"}, "consumer", "reads only"),
        ({"address": "127.0.0.1"}, "address", "host:port"),
        ({"partitions": "2"}, "partitions", "reads only"),
    ],
)
def test_bad_write_options_name_the_option(options: dict[str, str], option: str, why: str) -> None:
    error = expect_option_error(option, lambda: write_options(options))
    assert why in str(error)


@pytest.mark.parametrize("parse", [read_options, write_options, check_known])
def test_an_unknown_option_is_refused_and_the_known_ones_listed(parse: object) -> None:
    assert callable(parse)
    error = expect_option_error("startingOffset", lambda: parse({"startingOffset": "latest"}))
    assert "not an option" in str(error)
    assert "startingOffsets" in str(error)  # the list of known names helps with a typo


def test_check_known_accepts_every_documented_name_in_any_case() -> None:
    names = [
        "subscribe",
        "startingOffsets",
        "maxOffsetsPerTrigger",
        "includeHeaders",
        "consumer",
        "topic",
        "deliveryMode",
        "sinkId",
        "address",
        "vpn",
        "username",
        "password",
        "tlsCa",
        "tlsCertificate",
        "tlsPrivateKey",
        "partitions",
        "startingTimestamp",
        "endingOffsets",
        "failOnDataLoss",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "checkpointLocation",
        "path",
    ]
    check_known(dict.fromkeys(names, "x"))
    check_known(dict.fromkeys((n.lower() for n in names), "x"))
    check_known({"queue": "q", "ADDRESS": "x"})


def test_check_known_refuses_subscribe_with_queue() -> None:
    expect_option_error("queue", lambda: check_known({"subscribe": "a", "queue": "q"}))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:55700", ("127.0.0.1", 55700)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9", ("::1", 9)),
        ("::1:9", ("::1", 9)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


def test_parse_address_names_the_option_it_was_given() -> None:
    expect_option_error("bridge", lambda: parse_address("nope", "bridge"))


def test_parse_address_refuses_non_ascii_digits_with_an_option_error() -> None:
    expect_option_error("address", lambda: parse_address("h:²"))


def test_sink_id_for_is_stable_per_path_and_differs_between_paths() -> None:
    first = sink_id_for("/data/ck/one")
    assert first == sink_id_for("/data/ck/one")
    assert first == sink_id_for("/data/ck/../ck/one")  # the same directory, spelt otherwise
    assert first != sink_id_for("/data/ck/two")
    assert first.startswith("checkpoint-")
    assert len(first) == len("checkpoint-") + 16
    relative = sink_id_for("ck")
    assert relative == sink_id_for(os.path.join(os.getcwd(), "ck"))
