"""Input limits over the wire (SPEC 10): what a node accepts it can deliver, and a client
refuses locally what the node would refuse."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc

from meshbus import HEADER_LIMITS, Message, Node, PublishRejectedError
from meshbus.plugins.guaranteed._service import GuaranteedService
from meshbus.transports import (
    RemoteFlow,
    RemoteSession,
    Server,
    connect,
)


def nested(depth: int) -> dict[str, Any]:
    """Headers nested ``depth`` levels deep, the headers object itself being the first."""
    value: Any = "bottom"
    for _ in range(depth - 1):
        value = [value]
    return {"k": value}


async def receive(session: RemoteSession | RemoteFlow, timeout: float = 3.0) -> Message:
    with anyio.fail_after(timeout):
        return await session.receive()


def service(node: Node) -> GuaranteedService:
    svc = node.guaranteed
    assert isinstance(svc, GuaranteedService)
    return svc


# --- defect 1: headers a node accepts are headers it can deliver ------------------------------


async def test_deep_headers_a_publish_accepts_reach_a_remote_subscriber(
    node: Node, server: Server
) -> None:
    async with connect(server.url, reconnect=False) as subscriber:
        subscriber.subscribe("deep/>")
        await subscriber.confirm()
        publisher = node.connect()
        limit = HEADER_LIMITS.max_depth
        accepted, refused = [], set()
        for depth in (limit - 1, limit, limit + 1, 97, 98, 99, 150):
            headers = nested(depth)
            try:
                # Two at once: the node writes them as one DELIVER_BATCH, its deepest frame.
                publisher.publish("deep/a", b"1", headers=headers)
                publisher.publish("deep/b", b"2", headers=headers)
            except PublishRejectedError as exc:
                refused.add(exc.reason)
                continue
            accepted.append(depth)
            got = [await receive(subscriber), await receive(subscriber)]
            assert [(m.topic, m.headers) for m in got] == [
                ("deep/a", headers),
                ("deep/b", headers),
            ]
        assert subscriber.connected
        assert subscriber.connects == 1
        assert accepted == [limit - 1, limit]
        assert refused == {"headers-too-deep"}
