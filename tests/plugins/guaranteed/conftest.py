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
