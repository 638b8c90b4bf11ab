"""meshbus's pytest plugin: the fixtures described in :mod:`meshbus.testing`.

pytest loads it by itself in any project that has meshbus installed (the
``pytest11`` entry point ``meshbus``; with plugin autoloading off, ``-p meshbus``).
It lives apart from :mod:`meshbus.testing` because it needs pytest, and the
helpers must import without it: in an application's runtime, or for a
documentation build that installs only the ``docs`` extra.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ._clock import ManualClock
from ._node import Node
from ._session import Session

__all__ = ["meshbus_clock", "meshbus_node", "meshbus_session"]


@pytest.fixture
def meshbus_clock() -> ManualClock:
    """A clock that moves only when the test calls ``advance``."""
    return ManualClock()


@pytest.fixture
async def meshbus_node(anyio_backend: object, meshbus_clock: ManualClock) -> AsyncIterator[Node]:
    """A running node with the default plugins, a fixed random seed and a manual clock."""
    async with Node(name="test", clock=meshbus_clock, seed=0) as node:
        yield node


@pytest.fixture
async def meshbus_session(meshbus_node: Node) -> AsyncIterator[Session]:
    """A session on the default VPN of ``meshbus_node``."""
    async with meshbus_node.connect(client_name="test-session") as session:
        yield session
