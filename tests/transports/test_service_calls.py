"""Services plugins provide, called by remote clients (``RemoteSession.call``)."""

from __future__ import annotations

from typing import Any, TypeAlias

import anyio
import pytest

from meshbus import Node, Session
from meshbus.errors import AccessDeniedError, StateError
from meshbus.transports import MemoryNetwork, connect, start_server

pytestmark = pytest.mark.anyio

Answer: TypeAlias = tuple[dict[str, Any], bytes]


async def echo(session: Session, args: dict[str, Any], body: bytes) -> Answer:
    return {"user": session.username, "vpn": session.vpn.name, "args": args}, body[::-1]


async def refuse(session: Session, args: dict[str, Any], body: bytes) -> Answer:
    raise AccessDeniedError(session.username, "call", "x", "not for you")


async def broken(session: Session, args: dict[str, Any], body: bytes) -> Answer:
    raise KeyError("bug")


async def served(node: Node, network: MemoryNetwork) -> None:
    await start_server(node, listener=network.listen("node"))


async def test_a_call_reaches_the_handler_with_the_callers_session_and_body() -> None:
    network = MemoryNetwork()
    async with Node() as node:
        node.provide_service("echo", echo)
        await served(node, network)
        async with connect(network.connectable("node")) as remote:
            result, body = await remote.call("echo", {"n": 1}, b"abc")
    assert result == {"user": "default", "vpn": "default", "args": {"n": 1}}
    assert body == b"cba"


async def test_a_large_body_travels_both_ways() -> None:
    network = MemoryNetwork()
    payload = bytes(range(256)) * 40_000  # 10 MB
    async with Node() as node:
        node.provide_service("echo", echo)
        await served(node, network)
        async with connect(network.connectable("node")) as remote:
            _, body = await remote.call("echo", {}, payload)
    assert body == payload[::-1]


async def test_errors_come_back_typed_and_the_connection_stays_usable() -> None:
    network = MemoryNetwork()
    async with Node() as node:
        node.provide_service("refuse", refuse)
        node.provide_service("broken", broken)
        node.provide_service("echo", echo)
        await served(node, network)
        async with connect(network.connectable("node")) as remote:
            with pytest.raises(AccessDeniedError, match="not for you"):
                await remote.call("refuse")
            with pytest.raises(StateError, match="'nothing'"):
                await remote.call("nothing")
            with pytest.raises(StateError, match="failed"):
                await remote.call("broken")
            assert (await remote.call("echo", {}, b"ok"))[1] == b"ko"


async def test_calls_run_concurrently_so_a_slow_one_does_not_hold_up_the_next() -> None:
    network = MemoryNetwork()
    release = anyio.Event()
    order: list[str] = []

    async def slow(session: Session, args: dict[str, Any], body: bytes) -> Answer:
        await release.wait()
        order.append("slow")
        return {}, b""

    async def fast(session: Session, args: dict[str, Any], body: bytes) -> Answer:
        order.append("fast")
        release.set()
        return {}, b""

    async with Node() as node:
        node.provide_service("slow", slow)
        node.provide_service("fast", fast)
        await served(node, network)
        async with connect(network.connectable("node")) as remote, anyio.create_task_group() as tg:
            tg.start_soon(remote.call, "slow")
            await anyio.wait_all_tasks_blocked()
            await remote.call("fast")
    assert order == ["fast", "slow"]


async def test_two_plugins_cannot_provide_one_service_name() -> None:
    async with Node() as node:
        node.provide_service("echo", echo)
        node.provide_service("echo", echo)  # the same handler again: harmless
        with pytest.raises(Exception, match="two plugins provide the service 'echo'"):
            node.provide_service("echo", refuse)
        node.withdraw_service("echo")
        assert node.find_service("echo") is None


async def test_a_call_frame_without_a_service_name_ends_the_connection() -> None:
    from meshbus.errors import MeshbusError
    from meshbus.transports import FrameKind

    network = MemoryNetwork()
    async with Node() as node:
        node.provide_service("echo", echo)
        await served(node, network)
        async with connect(network.connectable("node"), reconnect=False) as remote:
            assert (await remote.call("echo", {}, b"ab"))[1] == b"ba"
            remote._send_frame(FrameKind.REQUEST, {"what": "call", "id": 99})
            with pytest.raises(MeshbusError, match="lost"):
                await remote.call("echo")
