"""Fixtures for the spool tests: every contract test runs against every store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from meshbus.plugins.guaranteed._memory import MemoryStore
from meshbus.plugins.guaranteed._sqlite import SqliteStore
from meshbus.plugins.guaranteed._store import SpoolStore

StoreFactory = Callable[[], SpoolStore]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Makes a (closed) store; for SQLite, each call opens the same file again."""
    if request.param == "memory":
        return MemoryStore
    return lambda: SqliteStore(tmp_path / "spool.db")


@pytest.fixture
async def store(make_store: StoreFactory, anyio_backend: object) -> AsyncIterator[SpoolStore]:
    """An open store, checked for consistency after the test."""
    async with make_store() as opened:
        yield opened
        await opened.check()


@pytest.fixture(params=["memory", "sqlite"])
def data_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    """``None`` runs the node on a MemoryStore, a directory on a SqliteStore."""
    return tmp_path / "data" if request.param == "sqlite" else None


class BaseDefaultsStore(MemoryStore):
    """A store that keeps the base class's defaults for what :class:`SpoolStore` does
    not require (a filtered scan for ``read_expired``, a put then an ack for
    ``put_and_ack``), as a third-party store may."""

    read_expired = SpoolStore.read_expired
    put_and_ack = SpoolStore.put_and_ack


@pytest.fixture(params=["memory", "sqlite", "base defaults"])
async def any_store(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: object
) -> AsyncIterator[SpoolStore]:
    """An open store of each kind, the base class's defaults included, checked after."""
    made: SpoolStore
    if request.param == "memory":
        made = MemoryStore()
    elif request.param == "sqlite":
        made = SqliteStore(tmp_path / "spool.db")
    else:
        made = BaseDefaultsStore()
    async with made:
        yield made
        await made.check()
