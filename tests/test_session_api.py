"""One behaviour suite for every kind of session (meshbus.abc.SessionAPI).

Each test runs twice: against an in-process :class:`meshbus.Session` and against a
:class:`meshbus.transports.RemoteSession` logged in to the same node over a listener.
A ``peer`` session in the process publishes and receives alongside it, so each test
checks the session under test from the outside too.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from anyio.lowlevel import checkpoint

from meshbus import (
    AccessDeniedError,
    AclProfile,
    DeliveryMode,
    InvalidTopicError,
    Message,
    Node,
    PublishRejectedError,
    Session,
    StateError,
)
from meshbus.abc import SessionAPI
from meshbus.transports import ListenerSettings, RemoteSession, connect, start_server


@pytest.fixture(params=["local", "remote"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    async with Node(name="api") as running:
        vpn = running.vpn()
        vpn.add_acl_profile(
            AclProfile(
                "careful",
                subscribe_default="allow",
                subscribe_exceptions=["secret/>"],
                publish_exceptions=["secret/>"],
            )
        )
        vpn.add_user("careful", acl_profile="careful")
        running.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        yield running


async def open_session(node: Node, kind: str, **login: Any) -> Any:
    if kind == "local":
        return node.connect(**login)
    server = await start_server(node, ListenerSettings(port=0))
    session = connect(server.url, reconnect=False, **login)
    await session.__aenter__()
    return session


@pytest.fixture
async def session(node: Node, kind: str) -> AsyncIterator[Any]:
    opened = await open_session(node, kind, username="careful", client_name="tested")
    try:
        yield opened
    finally:
        await opened.aclose()
        if isinstance(opened, RemoteSession):
            await opened.__aexit__(None, None, None)


@pytest.fixture
def peer(node: Node) -> Session:
    return node.connect(client_name="peer")


def drain(session: Session) -> list[Message]:
    return list(iter(session.receive_nowait, None))


# --- the API itself ---------------------------------------------------------------------------


MEMBERS = [
    name
    for name, member in vars(SessionAPI).items()
    if not name.startswith("_") and (callable(member) or isinstance(member, property))
] + ["__aiter__"]


def test_both_sessions_implement_the_protocol_with_its_signatures() -> None:
    assert len(MEMBERS) >= 15
    for cls in (Session, RemoteSession):
        for name in MEMBERS:
            wanted = getattr(SessionAPI, name)
            if isinstance(wanted, property):
                continue  # an instance attribute will do: test_it_is_a_session_api
            got = getattr(cls, name, None)
            assert got is not None, f"{cls.__name__} has no {name}"
            expected = list(inspect.signature(wanted).parameters.values())
            actual = list(inspect.signature(got).parameters.values())
            assert [(p.name, p.kind, p.default) for p in actual] == [
                (p.name, p.kind, p.default) for p in expected
            ], f"{cls.__name__}.{name}"


async def test_it_is_a_session_api(session: Any) -> None:
    assert isinstance(session, SessionAPI)
    assert session.client_name == "tested"
    assert session.closed is False


# --- direct messaging -------------------------------------------------------------------------


async def test_it_receives_what_matches_its_subscriptions_once(session: Any, peer: Session) -> None:
    session.subscribe("news/>")
    session.subscribe("news/*/sport")
    await session.confirm()
    assert session.subscriptions == ("news/>", "news/*/sport")
    peer.publish("news/uk/sport", b"goal")
    peer.publish("weather/uk", b"rain")
    message = await session.receive()
    assert (message.topic, message.payload, message.sender) == ("news/uk/sport", b"goal", "peer")
    await session.confirm()
    assert session.receive_nowait() is None


async def test_what_it_publishes_arrives_whole(session: Any, peer: Session) -> None:
    peer.subscribe("out/>")
    session.publish(
        "out/1", b"body", headers={"k": [1, "v"]}, reply_to="inbox/me", correlation_id="c-1"
    )
    session.publish("out/2", "text")
    await session.confirm()
    first, second = drain(peer)
    assert (first.topic, first.payload, first.sender) == ("out/1", b"body", "tested")
    assert dict(first.headers) == {"k": [1, "v"]}
    assert (first.reply_to, first.correlation_id) == ("inbox/me", "c-1")
    assert second.payload == b"text"


async def test_a_direct_message_keeps_its_time_to_live_both_ways(
    session: Any, peer: Session, node: Node
) -> None:
    peer.subscribe("out/>")
    session.subscribe("in/>")
    await session.confirm()
    session.publish("out/1", b"x", ttl=30)
    session.publish("out/2", b"y", ttl=0)  # 0: no limit, as for send()
    peer.publish("in/1", b"z", ttl=30)
    await session.confirm()
    limited, unlimited = drain(peer)
    got = await session.receive()
    now = node.clock.time()
    assert limited.expires_at is not None
    assert now + 25 < limited.expires_at <= now + 30
    assert unlimited.expires_at is None
    assert got.expires_at is not None
    assert now + 25 < got.expires_at <= now + 30


@pytest.mark.parametrize("ttl", [-1, float("inf"), float("nan"), True, "5"])
async def test_a_bad_time_to_live_is_refused_at_the_call(
    session: Any, peer: Session, ttl: Any
) -> None:
    peer.subscribe("out/>")
    with pytest.raises(PublishRejectedError) as caught:
        session.publish("out/1", b"x", ttl=ttl)
    assert caught.value.reason == "invalid-ttl"
    await session.confirm()
    assert drain(peer) == []


async def test_unsubscribing_stops_delivery_and_is_a_no_op_when_not_held(
    session: Any, peer: Session
) -> None:
    session.subscribe("t")
    await session.confirm()
    session.unsubscribe("t")
    session.unsubscribe("never-held")
    await session.confirm()
    peer.publish("t", b"x")
    await session.confirm()
    assert session.receive_nowait() is None
    assert session.subscriptions == ()


async def test_an_invalid_topic_is_refused_at_the_call(session: Any) -> None:
    with pytest.raises(InvalidTopicError):
        session.publish("a/\x00", b"")
    with pytest.raises(InvalidTopicError):
        session.subscribe("")


async def test_what_its_acl_refuses_is_raised_by_the_call_or_by_confirm(
    session: Any, peer: Session
) -> None:
    peer.subscribe("secret/>")

    async def refused(call: Any, *args: Any) -> None:
        call(*args)
        await session.confirm()

    with pytest.raises(AccessDeniedError):
        await refused(session.subscribe, "secret/plans")
    with pytest.raises(AccessDeniedError):
        await refused(session.publish, "secret/plans", b"x")
    await session.confirm()  # each refusal is raised once
    assert drain(peer) == []


async def test_it_iterates_over_messages(session: Any, peer: Session) -> None:
    session.subscribe("it/>")
    await session.confirm()
    for i in range(3):
        peer.publish(f"it/{i}", b"")
    got = []
    async for message in session:
        got.append(message.topic)
        if len(got) == 3:
            break
    assert got == ["it/0", "it/1", "it/2"]


# --- guaranteed messaging ---------------------------------------------------------------------


async def test_a_guaranteed_message_is_held_bound_received_and_acked(
    session: Any, node: Node
) -> None:
    await session.send("orders/1", b"first", headers={"n": 1}, correlation_id="o-1")
    await session.send_to_queue("orders", b"second")
    results = await session.send_many([("orders/2", b"third"), ("a\x00", b"bad")])
    assert results[0] is None
    assert isinstance(results[1], InvalidTopicError)
    async with await session.bind("orders", window=10) as flow:
        got = [await flow.receive() for _ in range(3)]
        assert [m.payload for m in got] == [b"first", b"second", b"third"]
        assert got[0].delivery_mode is DeliveryMode.PERSISTENT
        assert (dict(got[0].headers), got[0].correlation_id) == ({"n": 1}, "o-1")
        assert got[0].sender == "tested"
        for message in got:
            flow.ack(message)
    service: Any = node.guaranteed
    await service.queue("orders").flush_acks()
    assert service.queue("orders").usage() == (0, 0)


async def test_an_unacked_message_comes_back_flagged(session: Any) -> None:
    await session.send("orders/9", b"again")
    async with await session.bind("orders") as flow:
        first = await flow.receive()
        assert not first.redelivered
    async with await session.bind("orders") as flow:
        second = await flow.receive()
        assert (second.payload, second.redelivered) == (b"again", True)
        flow.ack(second)


async def test_a_flow_hands_out_what_it_has_without_waiting(session: Any) -> None:
    for i in range(3):
        await session.send_to_queue("orders", str(i))
    async with await session.bind("orders", window=10) as flow:
        got = [await flow.receive()]
        with anyio.fail_after(5):
            while len(got) < 3:
                message = flow.receive_nowait()
                if message is None:
                    await checkpoint()
                else:
                    got.append(message)
        assert [m.payload for m in got] == [b"0", b"1", b"2"]
        for message in got:
            flow.ack(message)


async def test_a_subscription_manager_subscribes_another_session(
    node: Node, kind: str, peer: Session
) -> None:
    node.vpn().add_user("manager", subscription_manager=True)
    manager = await open_session(node, kind, username="manager")
    try:
        manager.subscribe_for("peer", "managed/>")
        await manager.confirm()
        assert peer.subscriptions == ("managed/>",)
        manager.unsubscribe_for("peer", "managed/>")

        async def subscribe_nobody() -> None:
            manager.subscribe_for("nobody", "a")
            await manager.confirm()

        with pytest.raises(StateError, match="nobody"):  # raised by the call or by confirm
            await subscribe_nobody()
        await manager.confirm()  # raised once
        assert peer.subscriptions == ()
    finally:
        await manager.aclose()
        if isinstance(manager, RemoteSession):
            await manager.__aexit__(None, None, None)


# --- closing ----------------------------------------------------------------------------------


async def test_a_closed_session_refuses_calls(node: Node, kind: str) -> None:
    session = await open_session(node, kind)
    await session.aclose()
    assert session.closed
    with pytest.raises(StateError):
        session.subscribe("t")
    with pytest.raises(StateError):
        await session.confirm()
    if isinstance(session, RemoteSession):
        await session.__aexit__(None, None, None)
