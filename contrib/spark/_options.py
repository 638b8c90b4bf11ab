"""Options of ``format("meshbus")``, checked whole before any work starts.

Spark hands a Python data source its options as a case-insensitive map of strings,
so names are compared in lower case and every value is parsed here, once, into
:class:`ReadOptions` or :class:`WriteOptions`. Each failure names the option.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from meshbus import parse_subscription, validate_topic
from meshbus.errors import InvalidTopicError

from ._client import NodeTarget
from ._errors import SparkOptionError

__all__ = [
    "DEFAULT_ADDRESS",
    "ADDRESS_ENV",
    "ReadOptions",
    "WriteOptions",
    "check_known",
    "parse_address",
    "parse_urls",
    "sink_id_for",
    "read_options",
    "write_options",
]

#: Where the data source connects without an ``address`` option: a node's default
#: listener on this machine.
DEFAULT_ADDRESS = "tcp://127.0.0.1:55555"
#: An environment variable that overrides :data:`DEFAULT_ADDRESS` for the data source.
ADDRESS_ENV = "MESHBUS_SPARK_ADDRESS"

STARTING_OFFSETS = ("earliest", "latest", "committed")
#: Most partitions a stream can be split into.
MAX_PARTITIONS = 256
DELIVERY_MODES = ("direct", "persistent", "non-persistent")

# Documented spelling by lower-case name.
_READ = (
    "subscribe",
    "queue",
    "startingOffsets",
    "maxOffsetsPerTrigger",
    "includeHeaders",
    "consumer",
    "partitions",
    "startingTimestamp",
    "endingOffsets",
    "failOnDataLoss",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
)
_WRITE = ("topic", "deliveryMode", "sinkId")
_COMMON = (
    "address",
    "vpn",
    "username",
    "password",
    "tlsCa",
    "tlsCertificate",
    "tlsPrivateKey",
)
# Set by Spark itself for some sinks and sources; accepted and ignored.
_SPARK_OWN = ("checkpointLocation", "path")
_SPELLING = {name.lower(): name for name in (*_READ, *_WRITE, *_COMMON, *_SPARK_OWN)}


def _fail(name: str, why: str) -> SparkOptionError:
    return SparkOptionError(_SPELLING.get(name, name), why)


def check_known(options: Mapping[str, str]) -> None:
    """Refuse an option no read or write of the data source knows."""
    for key in options:
        if key.lower() not in _SPELLING:
            close = difflib.get_close_matches(key.lower(), list(_SPELLING), n=1)
            hint = f"did you mean {_SPELLING[close[0]]!r}? " if close else ""
            known = ", ".join(sorted(_SPELLING.values(), key=str.lower))
            raise SparkOptionError(key, f"not an option of format('meshbus'); {hint}known: {known}")
    given = {k.lower() for k in options}
    if "subscribe" in given and "queue" in given:
        raise SparkOptionError("queue", "give either 'subscribe' or 'queue', not both")


def parse_address(text: str, option: str = "address") -> tuple[str, int]:
    """``host:port`` as a pair; IPv6 hosts go in brackets (``[::1]:55555``)."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not (port.isascii() and port.isdecimal()) or int(port) > 65535:
        raise SparkOptionError(option, f"expected host:port, got {text!r}")
    return host, int(port)


def parse_urls(text: str, option: str = "address") -> tuple[str, ...]:
    """Node URLs in connect order, separated by commas: ``tcp://host:port``,
    ``tls://host:port``, or a bare ``host:port`` (TCP)."""
    urls = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        scheme, sep, rest = item.partition("://")
        if not sep:
            scheme, rest = "tcp", item
        if scheme not in ("tcp", "tls"):
            raise SparkOptionError(option, f"{item!r}: a node URL starts with tcp:// or tls://")
        host, port = parse_address(rest, option)
        if host in ("0.0.0.0", "::"):
            raise SparkOptionError(
                option,
                f"{item!r} is a wildcard bind address, not one a machine can connect to: "
                "give the node's host name or IP address",
            )
        urls.append(f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}")
    if not urls:
        raise SparkOptionError(option, "expected one or more node URLs separated by commas")
    return tuple(urls)


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


def _text(name: str, value: str) -> str:
    if not value.strip():
        raise _fail(name, "must not be empty")
    return value.strip()


def _positive_int(name: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise _fail(name, f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise _fail(name, f"expected a positive integer, got {value!r}")
    return number


def _boolean(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise _fail(name, f"expected true or false, got {value!r}")
    return lowered == "true"


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise _fail(name, f"expected one of {', '.join(choices)}, got {value!r}")
        return lowered

    return parse


def _filters(name: str, value: str) -> tuple[str, ...]:
    filters = tuple(dict.fromkeys(f.strip() for f in value.split(",") if f.strip()))
    if not filters:
        raise _fail(name, "expected one or more topic filters separated by commas")
    for topic_filter in filters:
        try:
            parse_subscription(topic_filter)
        except InvalidTopicError as exc:
            raise _fail(name, f"{topic_filter!r} is not a valid topic filter: {exc}") from None
    return filters


def _topic(name: str, value: str) -> str:
    try:
        validate_topic(value)
    except InvalidTopicError as exc:
        raise _fail(name, f"{value!r} is not a valid topic: {exc}") from None
    return value


def _address(name: str, value: str) -> tuple[str, ...]:
    return parse_urls(value, "address")


def _partitions(name: str, value: str) -> int:
    number = _positive_int(name, value)
    if number > MAX_PARTITIONS:
        raise _fail(name, f"at most {MAX_PARTITIONS} partitions, got {value!r}")
    return number


def _path(name: str, value: str) -> str:
    return _text(name, value)


def _offsets_json(name: str, value: str, words: tuple[str, ...]) -> str | dict[str, int]:
    """One of ``words``, or a JSON object of offsets by partition (``{"0": 12, "1": -2}``;
    -2 is the earliest offset and -1 the latest, as in Kafka's options)."""
    text = value.strip()
    if not text.startswith("{"):
        return _choice(words)(name, value)
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise _fail(name, f"not JSON: {exc}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise _fail(name, 'expected an object of offsets by partition, like {"0": 12, "1": -2}')
    offsets: dict[str, int] = {}
    for key, offset in parsed.items():
        if not (isinstance(key, str) and key.isdecimal()):
            raise _fail(name, f"{key!r} is not a partition number")
        if type(offset) is not int or offset < -2:
            raise _fail(name, f"partition {key}: {offset!r} is not an offset (or -2, -1)")
        offsets[str(int(key))] = offset
    return offsets


def _starting(name: str, value: str) -> str | dict[str, int]:
    return _offsets_json(name, value, STARTING_OFFSETS)


def _ending(name: str, value: str) -> str | dict[str, int]:
    return _offsets_json(name, value, ("latest",))


def _timestamp(name: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise _fail(name, f"expected milliseconds since the epoch, got {value!r}") from None
    if number < 0:
        raise _fail(name, f"expected milliseconds since the epoch, got {value!r}")
    return number


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(name: str, value: str) -> float:
    """Seconds of a duration written as Spark writes them: ``500ms``, ``10s``, ``15m``."""
    text = value.strip().lower()
    for unit in sorted(_UNITS, key=len, reverse=True):
        number = text.removesuffix(unit)
        if number != text and number.strip().isdecimal():
            return int(number) * _UNITS[unit]
    raise _fail(name, f"expected a duration such as 500ms, 10s or 15m, got {value!r}")


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "address": _address,
    "vpn": _text,
    "username": _text,
    "password": lambda name, value: value,
    "tlsca": _path,
    "tlscertificate": _path,
    "tlsprivatekey": _path,
    "partitions": _partitions,
    "subscribe": _filters,
    "queue": _text,
    "startingoffsets": _starting,
    "startingtimestamp": _timestamp,
    "endingoffsets": _ending,
    "failondataloss": _boolean,
    "minoffsetspertrigger": _positive_int,
    "maxtriggerdelay": _duration,
    "maxoffsetspertrigger": _positive_int,
    "includeheaders": _boolean,
    "consumer": _text,
    "topic": _topic,
    "deliverymode": _choice(DELIVERY_MODES),
    "sinkid": _text,
}


def _parsed(options: Mapping[str, str], allowed: tuple[str, ...], mode: str) -> dict[str, Any]:
    check_known(options)
    lowered = _lower(options)
    allowed_lower = {a.lower() for a in (*allowed, *_COMMON, *_SPARK_OWN)}
    values: dict[str, Any] = {}
    for key, value in lowered.items():
        if key not in allowed_lower:
            raise _fail(key, f"applies to {'writes' if mode == 'read' else 'reads'} only")
        parser = _PARSERS.get(key)
        if parser is not None:
            values[key] = parser(key, value)
    return values


def default_address() -> tuple[str, ...]:
    """The URLs a data source without an ``address`` option connects to."""
    return parse_urls(os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS, ADDRESS_ENV)


def _target(values: dict[str, Any]) -> NodeTarget:
    if ("tlscertificate" in values) != ("tlsprivatekey" in values):
        raise SparkOptionError(
            "tlsCertificate", "a client certificate needs both 'tlsCertificate' and 'tlsPrivateKey'"
        )
    return NodeTarget(
        urls=values.get("address") or default_address(),
        vpn=values.get("vpn", "default"),
        username=values.get("username", "default"),
        password=values.get("password"),
        tls_ca=values.get("tlsca"),
        tls_certificate=values.get("tlscertificate"),
        tls_private_key=values.get("tlsprivatekey"),
    )


@attrs.frozen
class ReadOptions:
    """What ``read``/``readStream`` were asked for."""

    node: NodeTarget
    subscribe: tuple[str, ...] | None
    queue: str | None
    starting_offsets: str | dict[str, int] | None
    """``None``: the default, ``latest`` for a stream and ``earliest`` for a batch read."""
    max_offsets_per_trigger: int | None
    include_headers: bool
    consumer: str
    partitions: int = 1
    starting_timestamp: int | None = None
    """Milliseconds since the epoch: start at each partition's first message this new."""
    ending_offsets: str | dict[str, int] = "latest"
    fail_on_data_loss: bool = True
    min_offsets_per_trigger: int | None = None
    max_trigger_delay: float = 900.0

    @property
    def stream(self) -> dict[str, Any]:
        """The stream spec sent to the bridge."""
        spec: dict[str, Any] = (
            {"queue": self.queue}
            if self.queue is not None
            else {"subscribe": list(self.subscribe or ())}
        )
        if self.partitions != 1:
            spec["partitions"] = self.partitions
        return spec


@attrs.frozen
class WriteOptions:
    """What ``write``/``writeStream`` were asked for."""

    node: NodeTarget
    topic: str | None
    delivery_mode: str
    sink_id: str | None
    checkpoint_location: str | None


def read_options(options: Mapping[str, str]) -> ReadOptions:
    """Parse the options of a read; exactly one of ``subscribe`` and ``queue`` is needed."""
    values = _parsed(options, _READ, "read")
    if "subscribe" not in values and "queue" not in values:
        raise SparkOptionError("subscribe", "a read needs 'subscribe' (topic filters) or 'queue'")
    if "startingtimestamp" in values and "startingoffsets" in values:
        raise _fail("startingtimestamp", "give either 'startingTimestamp' or 'startingOffsets'")
    for given in ("startingoffsets", "endingoffsets"):
        offsets = values.get(given)
        if isinstance(offsets, dict):
            wanted = {str(n) for n in range(values.get("partitions", 1))}
            if set(offsets) != wanted:
                raise _fail(
                    given,
                    f"names partitions {sorted(offsets, key=int)}, but the stream has "
                    f"{len(wanted)} ({', '.join(sorted(wanted, key=int))})",
                )
    return ReadOptions(
        node=_target(values),
        subscribe=values.get("subscribe"),
        queue=values.get("queue"),
        starting_offsets=values.get("startingoffsets"),
        max_offsets_per_trigger=values.get("maxoffsetspertrigger"),
        include_headers=values.get("includeheaders", False),
        consumer=values.get("consumer", "default"),
        partitions=values.get("partitions", 1),
        starting_timestamp=values.get("startingtimestamp"),
        ending_offsets=values.get("endingoffsets", "latest"),
        fail_on_data_loss=values.get("failondataloss", True),
        min_offsets_per_trigger=values.get("minoffsetspertrigger"),
        max_trigger_delay=values.get("maxtriggerdelay", 900.0),
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    """Parse the options of a write."""
    values = _parsed(options, _WRITE, "write")
    lowered = _lower(options)
    return WriteOptions(
        node=_target(values),
        topic=values.get("topic"),
        delivery_mode=values.get("deliverymode", "direct"),
        sink_id=values.get("sinkid"),
        checkpoint_location=lowered.get("checkpointlocation"),
    )


def sink_id_for(checkpoint_location: str) -> str:
    """A sink id that stays the same for one checkpoint directory."""
    digest = hashlib.sha256(os.path.abspath(checkpoint_location).encode()).hexdigest()
    return "checkpoint-" + digest[:16]
