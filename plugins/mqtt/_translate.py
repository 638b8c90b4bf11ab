"""What an MQTT PUBLISH is as a meshbus message, and back (SPEC 13).

* Topics are the same strings: MQTT topic names have no wildcards, and meshbus takes
  any level text (a topic starting with ``#`` is reserved in meshbus and refused).
  Filters go through :func:`meshbus.from_mqtt_filter`, the one place the two syntaxes
  meet (``+`` is ``*``, ``a/#`` is ``a`` and ``a/>``, ``$share/g/f`` is ``#share/g/f``).
* QoS 0 is a direct message; QoS 1 and 2 are persistent guaranteed messages.
* MQTT 5 user properties are the message's headers (string values; another value
  goes out as its JSON text). A name that comes more than once keeps every value, in
  order, as a list of strings, and such a list goes out as one property per value.
  When the names were interleaved (``a, b, a``), the header ``user-property-order``
  lists the names in the order they came, so that they go out in that order again
  (MQTT-3.3.2-18); properties whose names come in runs need no such header.
  The response topic is the reply-to, the correlation data the correlation id (bytes
  as Latin-1 text, so any bytes survive), the message expiry interval the TTL, the
  content type the header ``content-type`` and a payload format indicator of 1 (UTF-8
  text) the header ``payload-format`` = ``"utf-8"``, sent on unaltered (MQTT-3.3.2-4).
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from meshbus import Message

__all__ = [
    "CONTENT_TYPE",
    "PAYLOAD_FORMAT",
    "USER_PROPERTY_ORDER",
    "correlation_bytes",
    "publish_options",
    "take_header",
    "v5_properties",
]

CONTENT_TYPE = "content-type"
"""The header an MQTT 5 content type is kept in."""

PAYLOAD_FORMAT = "payload-format"
"""The header that says a payload is UTF-8 text (``"utf-8"``): MQTT 5's payload
format indicator 1."""

USER_PROPERTY_ORDER = "user-property-order"
"""The header that lists user property names in the order they came, when grouping
the values by name would change it."""


def publish_options(packet: Any) -> dict[str, Any]:
    """The keyword arguments of a meshbus publish/send for an MQTT 5 PUBLISH's properties
    (empty for one without any, so the plain publish stays on its fast path)."""
    options: dict[str, Any] = {}
    properties = packet.user_properties
    content_type = packet.content_type
    utf8 = packet.payload_format_indicator
    if properties or content_type is not None or utf8:
        headers = _headers(properties)
        if content_type is not None:
            headers[CONTENT_TYPE] = content_type
        if utf8:
            headers[PAYLOAD_FORMAT] = "utf-8"
        options["headers"] = headers
    if packet.response_topic is not None:
        options["reply_to"] = packet.response_topic
    data = packet.correlation_data
    if data is not None:
        options["correlation_id"] = data.decode("latin-1")
    return options


def _headers(properties: Any) -> dict[str, Any]:
    """User properties as headers: a name given more than once keeps all its values,
    and their order is kept too when the names were interleaved."""
    headers: dict[str, Any] = {}
    for name, value in properties:
        held = headers.get(name)
        if held is None:
            headers[name] = value
        elif isinstance(held, list):
            held.append(value)
        else:
            headers[name] = [held, value]
    if len(headers) < len(properties) and USER_PROPERTY_ORDER not in headers:
        names = [name for name, _ in properties]
        if _interleaved(names):
            headers[USER_PROPERTY_ORDER] = names
    return headers


def _interleaved(names: list[str]) -> bool:
    """Whether a name comes again after another name (``a, b, a``)."""
    seen = set()
    last = None
    for name in names:
        if name != last:
            if name in seen:
                return True
            seen.add(name)
            last = name
    return False


def take_header(headers: dict[str, Any], name: str) -> Any:
    """Remove the user property ``name`` from ``headers`` made by :func:`publish_options`
    (and from its order); return its value (``None`` when absent)."""
    order = headers.get(USER_PROPERTY_ORDER)
    fits = order is not None and _values_per_name(headers, order) is not None
    value = headers.pop(name, None)
    if value is not None and fits and order is not None:
        rest = [n for n in order if n != name]
        if _interleaved(rest):
            headers[USER_PROPERTY_ORDER] = rest
        else:
            del headers[USER_PROPERTY_ORDER]
    return value


def _values_per_name(headers: Any, order: Any) -> dict[str, list[str]] | None:
    """Each user property's values, when ``order`` is a list of their names that holds
    each name as often as it has values (else ``None``: not an order made here)."""
    if not isinstance(order, list):
        return None
    values: dict[str, list[str]] = {}
    for name, value in headers.items():
        if name in (CONTENT_TYPE, PAYLOAD_FORMAT, USER_PROPERTY_ORDER):
            continue
        if isinstance(value, str):
            values[name] = [value]
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            values[name] = value
        else:
            return None
    counts: dict[str, int] = {}
    for name in order:
        counts[name] = counts.get(name, 0) + 1
    if counts != {name: len(held) for name, held in values.items()}:
        return None
    return values


def _pairs(headers: Any) -> list[tuple[str, str]]:
    """Headers as user properties (a list of strings: one property per value), in the
    order the headers say, when they say it."""
    order = headers.get(USER_PROPERTY_ORDER)
    if order is not None:
        values = _values_per_name(headers, order)
        if values is not None:
            taken = dict.fromkeys(values, 0)
            pairs = []
            for name in order:
                pairs.append((name, values[name][taken[name]]))
                taken[name] += 1
            return pairs
    pairs = []
    for name, value in headers.items():
        if name in (CONTENT_TYPE, PAYLOAD_FORMAT):
            continue
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            pairs += [(str(name), v) for v in value]
        else:
            pairs.append((str(name), _text(value)))
    return pairs


def correlation_bytes(correlation_id: str) -> bytes:
    """A correlation id as MQTT 5 correlation data (the inverse of Latin-1 text)."""
    try:
        return correlation_id.encode("latin-1")
    except UnicodeEncodeError:  # set by a meshbus client: its UTF-8 bytes
        return correlation_id.encode("utf-8")


def _text(value: object) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode("utf-8")


def v5_properties(
    message: Message, now: float, extra: tuple[tuple[str, str], ...] = ()
) -> dict[str, Any] | None:
    """The MQTT 5 PUBLISH properties of ``message`` (``None`` when it has none), with
    the user properties ``extra`` after its own."""
    options = message.options
    headers = options.headers
    if (
        not headers
        and not extra
        and options.reply_to is None
        and options.correlation_id is None
        and options.expires_at is None
    ):
        return None
    properties: dict[str, Any] = {}
    pairs = _pairs(headers) if headers else []
    pairs += extra
    if pairs:
        properties["user_properties"] = pairs
    if headers:
        content_type = headers.get(CONTENT_TYPE)
        if isinstance(content_type, str):
            properties["content_type"] = content_type
        if headers.get(PAYLOAD_FORMAT) == "utf-8":
            properties["payload_format_indicator"] = 1
    if options.reply_to is not None:
        properties["response_topic"] = options.reply_to
    if options.correlation_id is not None:
        properties["correlation_data"] = correlation_bytes(options.correlation_id)
    if options.expires_at is not None:
        left = options.expires_at - now
        properties["message_expiry_interval"] = max(1, math.ceil(left)) if left > 0 else 1
    return properties or None
