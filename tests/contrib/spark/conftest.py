"""The shared SparkSession and a running node with a Spark bridge.

One local SparkSession serves every Spark test: starting one costs seconds and a
gigabyte, so tests never stop it and give each query its own checkpoint, consumer
and output directory instead. The tests skip, saying why, only where Java is absent.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from meshbus import DEFAULT_PLUGINS, Node

T = TypeVar("T")

JAVA = shutil.which("java")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if JAVA is None:
        pytest.skip("Spark tests need Java 17 on PATH (java was not found)")
    from meshbus.contrib.spark import local_spark_session

    session = local_spark_session()
    yield session
    session.stop()


async def blocking(call: Callable[[], T]) -> T:
    """Run a blocking Spark call off the event loop, as apps must."""
    return await anyio.to_thread.run_sync(call)


@asynccontextmanager
async def running_bridge(
    tmp_path: Path | None = None, **settings: Any
) -> AsyncIterator[tuple[Node, Any]]:
    """A node with a Spark bridge on a free loopback port."""
    from meshbus.contrib.spark import SparkBridge

    bridge = SparkBridge(listen="127.0.0.1:0", **settings)
    async with Node(plugins=[*DEFAULT_PLUGINS, bridge], data_dir=tmp_path) as node:
        yield node, bridge


async def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``condition`` until true; fail after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)
