"""A remote session tells a lost connection from a close by the application.

``meshbus sub`` relies on it: a session that stops delivering because its node went
away must not look like one the application closed (``RemoteSession.lost``).
"""

from __future__ import annotations

import anyio
import pytest

from meshbus import Node
from meshbus.errors import StateError, TransportError
from meshbus.transports import ListenerSettings, Server, connect, start_server

from .conftest import wait_until


async def test_a_lost_connection_says_so_and_why() -> None:
    async with Node() as node:
        server = await start_server(node, ListenerSettings(port=0))
        async with connect(server.url, reconnect=False) as session:
            session.subscribe("t/>")
            await session.confirm()
            assert session.lost is None
            received = []
            async with anyio.create_task_group() as tg:

                async def consume() -> None:
                    async for message in session:  # ends when the session closes
                        received.append(message)

                tg.start_soon(consume)
                await server.aclose()  # the node says goodbye and hangs up
            assert session.closed
            lost = session.lost
            assert isinstance(lost, TransportError)
            assert str(lost).startswith(f"connection to {server.url} lost: "), lost
            assert isinstance(lost.__cause__, TransportError)
            assert str(lost).endswith(str(lost.__cause__))
            with pytest.raises(StateError):
                await session.confirm()
        assert session.lost is lost  # closing it afterwards keeps the reason
    assert received == []


async def test_a_session_the_application_closes_was_not_lost(server: Server) -> None:
    session = connect(server.url, reconnect=False)
    async with session:
        assert session.lost is None
    assert session.closed
    assert session.lost is None


async def test_a_reconnecting_session_is_not_lost_while_it_reconnects() -> None:
    async with Node() as node:
        server = await start_server(node, ListenerSettings(port=0))
        async with connect(server.url) as session:
            await server.aclose()
            await wait_until(lambda: not session.connected)
            assert not session.closed
            assert session.lost is None
