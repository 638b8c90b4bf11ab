"""Helpers shared by the guaranteed-messaging tests."""

from __future__ import annotations

import anyio
import pytest

from meshbus import Message, Node, Session
from meshbus.abc import Flow
from meshbus.plugins.guaranteed._queue import Queue
from meshbus.plugins.guaranteed._service import GuaranteedService

PLUGINS = ["direct", "shared", "eliding", "guaranteed"]


def service(node: Node) -> GuaranteedService:
    """The node's guaranteed service, typed."""
    svc = node.guaranteed
    assert isinstance(svc, GuaranteedService)
    return svc


async def receive(flow: Flow, timeout: float = 2) -> Message:
    """The next message of ``flow``, failing the test after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        return await flow.receive()


async def nothing_for(flow: Flow, seconds: float = 0.05) -> None:
    """Assert no message arrives on ``flow`` for a short while."""
    with anyio.move_on_after(seconds):
        message = await flow.receive()
        pytest.fail(f"unexpected {message!r}")


def held(node: Node, queue: str) -> tuple[int, int]:
    """(messages, bytes) the store holds for ``queue``."""
    stats = service(node).store.stats(f"default/{queue}")
    return stats.messages, stats.bytes


async def drain(session: Session) -> list[Message]:
    """The direct messages waiting for ``session`` (delivered inline by the publish)."""
    out = []
    while (message := session.receive_nowait()) is not None:
        out.append(message)
    return out


async def spooled(queue: Queue, count: int) -> None:
    """Wait for the spooler to store ``count`` messages for ``queue``."""
    with anyio.fail_after(2):
        while queue.store.stats(queue.endpoint).messages < count:
            await anyio.sleep(0.001)
