"""Every async test runs on asyncio and on trio."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.watchdog"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]
