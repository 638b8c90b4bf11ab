"""Helpers shared by the guaranteed-messaging tests."""

from __future__ import annotations

import anyio
import pytest

from meshbus import Message, Node
from meshbus.abc import Flow
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
