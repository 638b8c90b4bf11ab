"""What a client writes, checked as the node will check it (SPEC 10).

A node closes a connection that sends a frame larger than it reads, and refuses
headers over :data:`meshbus.HEADER_LIMITS`. A remote session therefore checks both
before it queues anything, and refuses locally with the node's own error
(:class:`~meshbus.PublishRejectedError`): a message the node would refuse never
costs the connection, nor every request sent after it. The checks cost nothing
for a message far below the frame limit; only one close to it is measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from meshbus._messages import HEADER_LIMITS, measure
from meshbus._session import check_ttl
from meshbus.errors import PublishRejectedError

from ._codec import FrameTooLarge, PublishEntry, encode_publish_batch

__all__ = [
    "PUBLISH_OVERHEAD",
    "check_publish",
    "encode_publishes",
    "send_header",
    "send_refusal",
    "wire_options",
]

PUBLISH_OVERHEAD = 2048
"""Most bytes a PUBLISH_BATCH frame of one message takes besides its payload and
options: the prefix, the topic (at most 250 bytes, each at most 6 as JSON), the size."""
_SEND_OVERHEAD = HEADER_LIMITS.max_bytes + 512
"""The same for a SEND besides its payload and its topic or queue name: options within
the header limits, the flags, the TTL and the request id."""


def wire_options(
    headers: Mapping[str, Any] | None,
    eliding_eligible: bool,
    reply_to: str | None,
    correlation_id: str | None,
) -> tuple[dict[str, Any], int]:
    """The wire options of a publish or send, and most bytes they take as JSON.

    The headers are checked against :data:`~meshbus.HEADER_LIMITS` as the node will
    check them, and encoded once, here: the frame takes the bytes as they are.

    :raises PublishRejectedError: over the header limits.
    :raises TypeError: headers JSON cannot hold.
    """
    encoded = measure(
        dict(headers) if headers else None, reply_to, correlation_id, HEADER_LIMITS, strict=True
    )[0]
    wire: dict[str, Any] = {}
    size = 2
    if encoded:
        wire["h"] = orjson.Fragment(encoded)
        size += len(encoded) + 6
    if eliding_eligible:
        wire["e"] = True
        size += 9
    if reply_to is not None:
        wire["r"] = reply_to
        size += 6 * len(reply_to) + 8
    if correlation_id is not None:
        wire["c"] = correlation_id
        size += 6 * len(correlation_id) + 8
    return wire, size


def send_header(
    persistent: bool,
    headers: Mapping[str, Any] | None,
    ttl: float | None,
    eliding_eligible: bool,
    reply_to: str | None,
    correlation_id: str | None,
) -> dict[str, Any]:
    """The header of a SEND frame, without its topic or queue and its id."""
    check_ttl(ttl)
    header: dict[str, Any] = {"persistent": bool(persistent)}
    if ttl is not None:
        header["ttl"] = ttl
    if (
        headers is not None
        or eliding_eligible
        or reply_to is not None
        or correlation_id is not None
    ):
        header.update(wire_options(headers, eliding_eligible, reply_to, correlation_id)[0])
    return header


def check_publish(
    topic: str, payload: bytes, options: dict[str, Any] | None, limit: int, url: str
) -> None:
    """Refuse a direct publish whose frame would be larger than ``limit``.

    :raises PublishRejectedError: ``"too-large"``, with the limit and the frame's size.
    """
    entry = [topic, len(payload)] if options is None else [topic, len(payload), options]
    size = 9 + len(orjson.dumps([entry])) + len(payload)
    if size > limit:
        raise too_large(size, limit, url)


def send_refusal(
    header: dict[str, Any], payload: bytes, limit: int, url: str
) -> PublishRejectedError | None:
    """Why a node reading frames up to ``limit`` would refuse this SEND, or ``None``."""
    name = header.get("topic") or header.get("queue") or ""
    if len(payload) + _SEND_OVERHEAD + 6 * len(name) <= limit:
        return None  # far enough below the limit: no need to measure
    size = 9 + len(orjson.dumps({**header, "id": 2**31})) + len(payload)
    return too_large(size, limit, url) if size > limit else None


def encode_publishes(
    entries: list[PublishEntry], out: bytearray, limit: int, url: str
) -> list[PublishRejectedError]:
    """Append PUBLISH_BATCH frames of ``entries`` to ``out``, none larger than ``limit``;
    return the refusals of entries that do not fit on their own (they are left out)."""
    try:
        out += encode_publish_batch(entries, limit)
        return []
    except FrameTooLarge:
        refusals = []
        for entry in entries:
            try:
                out += encode_publish_batch([entry], limit)
            except FrameTooLarge as exc:
                refusals.append(too_large(exc.size, limit, url))
        return refusals


def too_large(size: int, limit: int, url: str) -> PublishRejectedError:
    """The refusal of a frame of ``size`` bytes by a node that reads up to ``limit``."""
    return PublishRejectedError(
        "too-large", f"a frame of {size} bytes, more than the node at {url} reads", limit, size
    )
