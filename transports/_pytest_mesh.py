"""meshbus's ``mesh`` fixture: several nodes in one process on one virtual clock.

pytest loads it by itself where meshbus is installed (the ``pytest11`` entry point
``meshbus-mesh``). It is apart from the core's plugin (``meshbus``) because it
needs the transports, which the core does not import. Like the core's async
fixtures it is registered when pytest is configured, to run on anyio's plugin or
pytest-asyncio, whichever runs the test (see ``meshbus._pytest_plugin``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from meshbus._pytest_plugin import register_async_fixtures

from .testing import Mesh

__all__ = ["pytest_configure"]


def pytest_configure(config: pytest.Config) -> None:
    register_async_fixtures(config, "meshbus-mesh-fixtures", {"mesh": _mesh})


async def _mesh() -> AsyncIterator[Mesh]:
    """A :class:`~meshbus.transports.testing.Mesh`: start nodes with
    ``await mesh.start(name)``, link them with ``mesh.link(...)``; all of them stop
    after the test."""
    async with Mesh() as running:
        yield running
