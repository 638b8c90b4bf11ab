"""meshbus's ``mesh`` fixture: several nodes in one process on one virtual clock.

pytest loads it by itself where meshbus is installed (the ``pytest11`` entry point
``meshbus-mesh``). It is apart from the core's plugin (``meshbus``) because it
needs the transports, which the core does not import.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .testing import Mesh

__all__ = ["mesh"]


@pytest.fixture
async def mesh(anyio_backend: object) -> AsyncIterator[Mesh]:
    """A :class:`~meshbus.transports.testing.Mesh`: start nodes with
    ``await mesh.start(name)``, link them with ``mesh.link(...)``; all of them stop
    after the test."""
    async with Mesh() as running:
        yield running
