"""What a remote session offers beside the basics: subscriptions managed for other
sessions, its own statistics, and ``receive_nowait`` on its flows."""

from __future__ import annotations

import anyio
import pytest
from anyio.lowlevel import checkpoint

from meshbus import (
    AccessDeniedError,
    AclAction,
    AclProfile,
    ClientProfile,
    InvalidTopicError,
    LimitExceededError,
    Message,
    Node,
    StateError,
)
from meshbus.plugins.guaranteed._service import GuaranteedService
from meshbus.transports import RemoteFlow, RemoteSessionStatistics, Server, connect
from meshbus.transports import _events as ev
from meshbus.transports._framing import FrameKind

from .conftest import wait_until


def add_manager(node: Node) -> None:
    vpn = node.vpn()
    vpn.add_acl_profile(
        AclProfile(
            "no-secrets",
            subscribe_default=AclAction.ALLOW,
            subscribe_exceptions=["secret/>"],
        )
    )
    vpn.add_user("manager", subscription_manager=True, acl_profile="no-secrets")
    vpn.add_user("plain")


async def test_a_remote_manager_subscribes_another_session(node: Node, server: Server) -> None:
    add_manager(node)
    worker = node.connect(client_name="worker")
    async with connect(server.url, username="manager", client_name="manager") as manager:
        manager.subscribe_for("worker", "jobs/>")
        manager.subscribe_for("worker", "more/>")
        await manager.confirm()
        assert worker.subscriptions == ("jobs/>", "more/>")
        assert manager.subscriptions == ()  # they belong to the worker
        manager.unsubscribe_for("worker", "more/>")
        manager.unsubscribe_for("worker", "never-held")  # a no-op, as in-process
        await manager.confirm()
        assert worker.subscriptions == ("jobs/>",)
        manager.publish("jobs/1", b"x")
        await manager.confirm()
        assert worker.receive_nowait() is not None
        assert manager.statistics().errors == 0
    assert worker.subscriptions == ("jobs/>",)  # it stays when the manager leaves
    worker.close()


async def test_refusals_arrive_typed_at_confirm(node: Node, server: Server) -> None:
    add_manager(node)
    node.vpn().add_client_profile(ClientProfile("one", max_subscriptions=1))
    node.vpn().add_user("worker", client_profile="one")
    worker = node.connect(username="worker", client_name="worker")
    async with connect(server.url, username="manager") as manager:
        manager.subscribe_for("worker", "secret/x")  # the manager's own ACL says no
        with pytest.raises(AccessDeniedError, match="secret/x"):
            await manager.confirm()
        manager.subscribe_for("nobody", "a")
        with pytest.raises(StateError, match="nobody"):
            await manager.confirm()
        manager.subscribe_for("worker", "a")
        manager.subscribe_for("worker", "b")  # over the worker's max_subscriptions
        with pytest.raises(LimitExceededError):
            await manager.confirm()
        assert worker.subscriptions == ("a",)
        with pytest.raises(InvalidTopicError):
            manager.subscribe_for("worker", "#share/bad*name/t")  # checked before it is sent
        assert manager.statistics().errors == 3
    async with connect(server.url, username="plain") as plain:
        plain.unsubscribe_for("worker", "a")
        with pytest.raises(AccessDeniedError, match="not a subscription manager"):
            await plain.confirm()
    assert worker.subscriptions == ("a",)
    worker.close()


async def test_subscribe_for_after_close_raises(server: Server) -> None:
    async with connect(server.url) as session:
        pass
    with pytest.raises(StateError):
        session.subscribe_for("worker", "a")
    with pytest.raises(StateError):
        session.unsubscribe_for("worker", "a")


def test_subscribe_for_is_a_request_the_protocol_checks() -> None:
    event = ev.decode_event(
        FrameKind.REQUEST,
        {"id": 3, "what": "unsubscribe_for", "client": "w", "subscription": "a/>"},
    )
    assert event == ev.SubscribeFor(3, "w", "a/>", add=False)
    with pytest.raises(Exception, match="client must be a string"):
        ev.decode_event(FrameKind.REQUEST, {"id": 3, "what": "subscribe_for", "client": 1})
    # Other requests decode as before.
    assert ev.decode_event(FrameKind.REQUEST, {"id": 1, "what": "sync"}) == ev.Request(1, "sync")


async def test_statistics_count_what_the_client_did(node: Node, server: Server) -> None:
    async with connect(server.url) as session:
        before = session.statistics()
        assert isinstance(before, RemoteSessionStatistics)
        assert (before.published, before.delivered, before.connects) == (0, 0, 1)
        assert before.connected
        session.subscribe("a/>")
        session.publish("a/1", b"one")
        session.publish("a/2", b"two")
        await session.confirm()
        await wait_until(lambda: session.statistics().buffered_messages == 2)
        stats = session.statistics()
        assert (stats.published, stats.subscriptions, stats.buffered_bytes) == (2, 1, 6)
        assert (await session.receive()).topic == "a/1"
        assert session.statistics().delivered == 1
        assert session.statistics().buffered_messages == 1
    assert not session.statistics().connected


async def poll(flow: RemoteFlow) -> Message:
    with anyio.fail_after(5):
        while (message := flow.receive_nowait()) is None:
            await checkpoint()
    return message


async def test_remote_flow_receive_nowait(node: Node, server: Server) -> None:
    svc = node.guaranteed
    assert isinstance(svc, GuaranteedService)
    svc.create_queue("q")
    async with connect(server.url) as session:
        flow = await session.bind("q", window=2)
        assert flow.receive_nowait() is None
        for i in range(3):
            await session.send_to_queue("q", str(i))
        first, second = await poll(flow), await poll(flow)
        assert [first.payload, second.payload] == [b"0", b"1"]
        assert flow.receive_nowait() is None  # the window is full
        flow.ack(first)
        flow.ack(second)
        assert (await poll(flow)).payload == b"2"
        assert session.statistics().flows == 1
        await flow.unbind()
        with pytest.raises(StateError):
            flow.receive_nowait()
        assert session.statistics().flows == 0
