"""Helpers shared by the remote-session tests: the next message within a time limit,
or none for a short while."""

from __future__ import annotations

from typing import TypeAlias

import anyio
import pytest

from meshbus import Message, Session
from meshbus.transports import RemoteFlow, RemoteSession

Receiver: TypeAlias = RemoteSession | Session


async def receive(session: Receiver | RemoteFlow, timeout: float = 2.0) -> Message:
    """The next message, failing the test after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        return await session.receive()


async def nothing_for(session: Receiver | RemoteFlow, seconds: float = 0.1) -> None:
    """Assert that no message arrives for a short while."""
    with anyio.move_on_after(seconds):
        message = await session.receive()
        pytest.fail(f"unexpected {message!r}")
