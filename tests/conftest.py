"""Every async test runs on asyncio and on trio; fixtures more than one folder uses."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.watchdog"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A development CA and a server certificate signed by it (``ca.pem``,
    ``server.pem``, ``server-key.pem``), for TLS listeners."""
    from meshbus.transports.certs import make_ca, make_server_certificate

    folder = tmp_path_factory.mktemp("certs")
    make_ca(folder)
    make_server_certificate(folder)
    return folder
