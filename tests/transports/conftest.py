"""Shared fixtures of the transport tests: a running node with a TCP listener on
127.0.0.1 (a free port), and development certificates made once per test session.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import attrs
import pytest

from meshbus import Node
from meshbus.transports import ListenerSettings, Server, start_server
from meshbus.transports.certs import (
    CertificatePaths,
    make_ca,
    make_client_certificate,
    make_server_certificate,
)


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    """A running node with the default plugins (guaranteed messages in memory)."""
    async with Node(name="node") as running:
        yield running


@pytest.fixture
async def server(node: Node) -> Server:
    """A plain TCP listener of ``node`` on 127.0.0.1, on a free port (closes with the node)."""
    return await start_server(node, ListenerSettings(port=0))


@attrs.frozen
class Certificates:
    """A development PKI: one CA with a server and two client certificates, and a
    second, unrelated CA with its own server certificate."""

    directory: Path
    ca: Path
    server: CertificatePaths
    alice: CertificatePaths
    bob: CertificatePaths
    other_ca: Path
    other_server: CertificatePaths


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """Certificates made once per test session with :mod:`meshbus.transports.certs`."""
    directory = tmp_path_factory.mktemp("certs")
    ca = make_ca(directory)
    server = make_server_certificate(directory)
    alice = make_client_certificate(directory, "alice")
    bob = make_client_certificate(directory, "bob")
    other = directory / "other"
    other_ca = make_ca(other, name="another CA")
    other_server = make_server_certificate(other)
    return Certificates(
        directory=directory,
        ca=ca.certificate,
        server=server,
        alice=alice,
        bob=bob,
        other_ca=other_ca.certificate,
        other_server=other_server,
    )


async def wait_until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    """Poll ``condition`` until it holds, failing the test after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.005)


async def run_isolated(script: str, *args: str, timeout: float = 20.0) -> str:
    """Run ``script`` in a fresh interpreter and return what it printed.

    For scenarios that can hang or corrupt the event loop (and every later test with
    it) while a bug is open. The child dumps its stacks and exits after ``timeout``;
    a failure there fails the calling test with the child's output.
    """
    prologue = f"import faulthandler\nfaulthandler.dump_traceback_later({timeout}, exit=True)\n"
    with anyio.fail_after(timeout + 10):
        result = await anyio.run_process(
            [sys.executable, "-c", prologue + script, *args], check=False
        )
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output
    return output
