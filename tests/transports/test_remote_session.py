"""Remote sessions over real TCP on 127.0.0.1: the same calls as an in-process
:class:`meshbus.Session` (SPEC 2, 6, 10) and guaranteed messaging over the wire (SPEC 4).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypeAlias

import anyio
import pytest

from meshbus import (
    AccessDeniedError,
    AclAction,
    AclProfile,
    AuthenticationError,
    DeliveryMode,
    InvalidTopicError,
    Message,
    Node,
    PublishRejectedError,
    Session,
    StateError,
    TopicLimits,
)
from meshbus.plugins.guaranteed._service import GuaranteedService
from meshbus.transports import (
    ListenerSettings,
    RemoteFlow,
    RemoteSession,
    Server,
    _answering,
    connect,
    start_server,
)
from meshbus.transports._connection import Connection
from meshbus.transports._protocol import Role

from .conftest import run_isolated, wait_until

Receiver: TypeAlias = RemoteSession | Session


async def receive(session: Receiver | RemoteFlow, timeout: float = 2.0) -> Message:
    """The next message, failing the test after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        return await session.receive()


async def nothing_for(session: Receiver | RemoteFlow, seconds: float = 0.1) -> None:
    """Assert that no message arrives for a short while."""
    with anyio.move_on_after(seconds):
        message = await session.receive()
        pytest.fail(f"unexpected {message!r}")


async def topics_until(session: Receiver, last: str) -> list[str]:
    """Topics received up to and including ``last`` (a sentinel published after the rest)."""
    topics: list[str] = []
    while not topics or topics[-1] != last:
        topics.append((await receive(session)).topic)
    return topics


def service(node: Node) -> GuaranteedService:
    svc = node.guaranteed
    assert isinstance(svc, GuaranteedService)
    return svc


# --- direct messaging ------------------------------------------------------------------------


async def test_remote_to_remote(server: Server) -> None:
    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        subscriber.subscribe("orders/>")
        await subscriber.confirm()
        assert subscriber.subscriptions == ("orders/>",)
        publisher.publish("orders/new", b"one")
        publisher.publish("orders/new/eu", "two")  # str payloads are UTF-8 encoded
        first, second = await receive(subscriber), await receive(subscriber)
        assert (first.topic, first.payload) == ("orders/new", b"one")
        assert (second.topic, second.payload) == ("orders/new/eu", b"two")
        assert first.sender == second.sender == publisher.client_name
        assert first.delivery_mode is DeliveryMode.DIRECT
        assert subscriber.receive_nowait() is None
        assert publisher.published == 2
        assert subscriber.delivered == 2


async def test_remote_publisher_in_process_subscriber(node: Node, server: Server) -> None:
    local = node.connect(client_name="local")
    local.subscribe("telemetry/*")
    async with connect(server.url, client_name="remote") as remote:
        remote.publish("telemetry/cpu", b"42")
        message = await receive(local)
    assert (message.topic, message.payload, message.sender) == ("telemetry/cpu", b"42", "remote")
    local.close()


async def test_in_process_publisher_remote_subscriber(node: Node, server: Server) -> None:
    local = node.connect(client_name="local")
    async with connect(server.url) as remote:
        remote.subscribe("telemetry/*")
        await remote.confirm()
        local.publish("telemetry/cpu", b"42")
        message = await receive(remote)
    assert (message.topic, message.payload, message.sender) == ("telemetry/cpu", b"42", "local")
    local.close()


async def test_wildcards_and_at_most_once_per_session(server: Server) -> None:
    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        for subscription in ("sport/*/score", "news/ab*", "deep/>", "sport/football/>"):
            subscriber.subscribe(subscription)
        subscriber.subscribe("end")
        await subscriber.confirm()
        for topic in (
            "sport/football/score",  # matches two subscriptions: delivered once
            "sport/football/score/half",
            "sport/score",  # no match: * is exactly one level
            "news/abc",
            "news/ab",
            "news/xab",  # no match
            "news/abc/more",  # no match: ab* is one level
            "deep",  # no match: > needs at least one more level
            "deep/a/b/c",
            "end",
        ):
            publisher.publish(topic)
        assert await topics_until(subscriber, "end") == [
            "sport/football/score",
            "sport/football/score/half",
            "news/abc",
            "news/ab",
            "deep/a/b/c",
            "end",
        ]


_OPTIONS: dict[str, Any] = {
    "headers": {"kind": "order", "n": 3, "nested": {"list": [1, 2.5, None, True]}},
    "reply_to": "replies/x",
    "correlation_id": "c-17",
    "eliding_eligible": True,
}


def _check_options(message: Message) -> None:
    assert dict(message.headers) == _OPTIONS["headers"]
    assert message.reply_to == "replies/x"
    assert message.correlation_id == "c-17"
    assert message.eliding_eligible is True
    assert message.discard_indication is False


async def test_message_options_survive_remote_to_remote(server: Server) -> None:
    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        subscriber.subscribe("opts")
        await subscriber.confirm()
        publisher.publish("opts", b"body", **_OPTIONS)
        publisher.publish("opts", b"plain")
        first, second = await receive(subscriber), await receive(subscriber)
        _check_options(first)
        assert first.payload == b"body"
        assert first.sender == publisher.client_name
        assert (dict(second.headers), second.reply_to, second.correlation_id) == ({}, None, None)
        assert second.eliding_eligible is False


async def test_message_options_survive_both_directions_with_in_process(
    node: Node, server: Server
) -> None:
    local = node.connect(client_name="local")
    local.subscribe("to-local")
    async with connect(server.url, client_name="remote") as remote:
        remote.subscribe("to-remote")
        await remote.confirm()
        remote.publish("to-local", b"a", **_OPTIONS)
        local.publish("to-remote", b"b", **_OPTIONS)
        at_local, at_remote = await receive(local), await receive(remote)
    _check_options(at_local)
    _check_options(at_remote)
    assert (at_local.sender, at_remote.sender) == ("remote", "local")
    local.close()


async def test_binary_payloads_and_empty_payloads_survive(server: Server) -> None:
    payloads = [b"", bytes(range(256)), b"\x00" * 70_000, bytearray(b"ba"), memoryview(b"mv")]
    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        subscriber.subscribe("bin")
        await subscriber.confirm()
        for payload in payloads:
            publisher.publish("bin", payload)
        received = [(await receive(subscriber)).payload for _ in payloads]
    assert received == [bytes(p) for p in payloads]
    assert all(type(p) is bytes for p in received)


async def test_many_publishes_arrive_in_order_after_flush(node: Node, server: Server) -> None:
    local = node.connect()
    local.subscribe("seq")
    async with connect(server.url) as publisher:
        for i in range(2000):
            publisher.publish("seq", str(i))
        await publisher.flush()
        await publisher.confirm()  # the node has applied every publish before it
        received = [local.receive_nowait() for _ in range(2000)]
    assert [int(m.payload) for m in received if m is not None] == list(range(2000))
    assert local.receive_nowait() is None
    local.close()


async def test_sync_on_message_handler(server: Server) -> None:
    got: list[Message] = []
    done = anyio.Event()

    def handler(message: Message) -> None:
        got.append(message)
        if len(got) == 3:
            done.set()

    async with (
        connect(server.url, on_message=handler) as subscriber,
        connect(server.url) as publisher,
    ):
        subscriber.subscribe("h/>")
        await subscriber.confirm()
        for i in range(3):
            publisher.publish(f"h/{i}", str(i))
        with anyio.fail_after(2):
            await done.wait()
        with pytest.raises(StateError):
            await subscriber.receive()  # messages go to the handler
    assert [m.topic for m in got] == ["h/0", "h/1", "h/2"]
    assert subscriber.delivered == 3


async def test_async_on_message_handler_and_errors_are_counted(server: Server) -> None:
    got: list[bytes] = []
    done = anyio.Event()

    async def handler(message: Message) -> None:
        await anyio.sleep(0)
        if message.payload == b"boom":
            raise RuntimeError("handler failure")
        got.append(message.payload)
        if message.payload == b"last":
            done.set()

    async with (
        connect(server.url, on_message=handler) as subscriber,
        connect(server.url) as publisher,
    ):
        subscriber.subscribe("h")
        await subscriber.confirm()
        for payload in (b"first", b"boom", b"last"):
            publisher.publish("h", payload)
        with anyio.fail_after(2):
            await done.wait()
        assert subscriber.connected  # a failing handler does not end the session
    assert got == [b"first", b"last"]
    assert subscriber.handler_errors == 1


async def test_on_message_must_be_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        connect("tcp://127.0.0.1:1", on_message="not a function")  # type: ignore[arg-type]


async def test_async_for(server: Server) -> None:
    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        subscriber.subscribe("it/>")
        await subscriber.confirm()
        for i in range(5):
            publisher.publish(f"it/{i}")
        seen = []
        with anyio.fail_after(2):
            async for message in subscriber:
                seen.append(message.topic)
                if len(seen) == 5:
                    break
    assert seen == [f"it/{i}" for i in range(5)]


async def test_async_for_ends_when_the_session_closes(server: Server) -> None:
    seen: list[str] = []
    ended = anyio.Event()

    async def consume(session: RemoteSession) -> None:
        async for message in session:
            seen.append(message.topic)
        ended.set()

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg, connect(server.url) as publisher:
            async with connect(server.url) as subscriber:
                subscriber.subscribe("x")
                await subscriber.confirm()
                tg.start_soon(consume, subscriber)
                publisher.publish("x")
                await wait_until(lambda: seen == ["x"])
            await ended.wait()  # closing the session ended the loop
    assert subscriber.closed


async def test_unsubscribe_stops_delivery(server: Server) -> None:
    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        subscriber.subscribe("a")
        subscriber.subscribe("b")
        await subscriber.confirm()
        publisher.publish("a", b"1")
        assert (await receive(subscriber)).topic == "a"
        subscriber.unsubscribe("a")
        await subscriber.confirm()
        assert subscriber.subscriptions == ("b",)
        publisher.publish("a", b"2")
        publisher.publish("b", b"3")
        message = await receive(subscriber)
        assert (message.topic, message.payload) == ("b", b"3")
        subscriber.unsubscribe("a")  # not subscribed any more: a no-op, as in a Session
        await subscriber.confirm()
        assert subscriber.subscriptions == ("b",)


async def test_subscribing_twice_is_one_subscription(server: Server) -> None:
    async with connect(server.url) as subscriber, connect(server.url) as publisher:
        subscriber.subscribe("twice")
        subscriber.subscribe("twice")
        await subscriber.confirm()
        assert subscriber.subscriptions == ("twice",)
        publisher.publish("twice")
        publisher.publish("end")  # not subscribed: never arrives
        await receive(subscriber)
        await nothing_for(subscriber)


@pytest.mark.parametrize("topic", ["", "a\x00b", "x" * 251])
async def test_invalid_topic_raises_locally(server: Server, topic: str) -> None:
    async with connect(server.url) as session:
        with pytest.raises(InvalidTopicError):
            session.publish(topic)
        with pytest.raises(InvalidTopicError):
            session.subscribe(topic)
        with pytest.raises(InvalidTopicError):
            await session.send(topic, b"x")
        assert session.published == 0
        assert session.subscriptions == ()
        await session.confirm()  # nothing reached the node
        assert session.errors == 0


async def test_invalid_subscription_raises_locally(server: Server) -> None:
    async with connect(server.url) as session:
        with pytest.raises(InvalidTopicError):
            session.subscribe("#share/bad*name/topic")  # a share name has no wildcards
        assert session.subscriptions == ()
        await session.confirm()


async def test_publish_after_close_raises(server: Server) -> None:
    session = connect(server.url)
    async with session:
        pass
    assert session.closed
    with pytest.raises(StateError):
        session.publish("x")
    with pytest.raises(StateError):
        session.subscribe("x")
    with pytest.raises(StateError):
        await session.confirm()


def _restricted(node: Node) -> None:
    vpn = node.vpn()
    vpn.add_acl_profile(
        AclProfile(
            "restricted",
            publish_exceptions=["secret/>"],
            subscribe_default=AclAction.DENY,
            subscribe_exceptions=["allowed/>"],
        )
    )
    vpn.add_user("carol", acl_profile="restricted")


async def test_acl_denied_subscribe_surfaces_in_confirm(node: Node, server: Server) -> None:
    _restricted(node)
    async with connect(server.url, username="carol") as session:
        session.subscribe("allowed/x")
        session.subscribe("forbidden/x")
        with pytest.raises(AccessDeniedError, match="forbidden/x"):
            await session.confirm()
        assert session.subscriptions == ("allowed/x",)  # the refused one is dropped
        assert session.errors == 1
        await session.confirm()  # reported once
        # A refusal and the confirm's answer often arrive in one read: every confirm
        # must still see the refusal made before it.
        for i in range(20):
            session.subscribe(f"forbidden/{i}")
            with pytest.raises(AccessDeniedError, match=f"forbidden/{i}"):
                await session.confirm()
        assert session.subscriptions == ("allowed/x",)


async def test_acl_denied_publish_surfaces_in_confirm(node: Node, server: Server) -> None:
    _restricted(node)
    watcher = node.connect()
    watcher.subscribe(">")
    async with connect(server.url, username="carol") as session:
        session.publish("secret/plans", b"x")
        session.publish("public/news", b"y")
        with pytest.raises(AccessDeniedError, match="secret/plans"):
            await session.confirm()
        assert session.errors == 1
        await session.confirm()
        # The denied publish changed nothing: only the allowed one was delivered.
        assert [m.topic for m in iter(watcher.receive_nowait, None)] == ["public/news"]
    assert node.vpn().statistics().denied == 1
    watcher.close()


async def test_errors_reported_by_the_node_carry_their_attributes(
    node: Node, server: Server
) -> None:
    _restricted(node)
    node.create_vpn("tight", topic_limits=TopicLimits(max_levels=3))
    async with connect(server.url, username="carol") as session:
        session.publish("secret/plans")
        with pytest.raises(AccessDeniedError) as denied:
            await session.confirm()
        assert (denied.value.action, denied.value.topic) == ("publish", "secret/plans")
        assert denied.value.username == "carol"
        await session.send("allowed/x", b"")
        with pytest.raises(AccessDeniedError) as denied:
            await session.send("secret/plans", b"")
        assert (denied.value.action, denied.value.topic) == ("publish", "secret/plans")
    async with connect(server.url, vpn="tight") as session:
        session.publish("a/b/c/d")  # valid by default, over this VPN's limits
        with pytest.raises(InvalidTopicError) as invalid:
            await session.confirm()
    assert invalid.value.topic == "a/b/c/d"
    assert invalid.value.reason


async def test_acl_denied_guaranteed_send_raises(node: Node, server: Server) -> None:
    _restricted(node)
    async with connect(server.url, username="carol") as session:
        with pytest.raises(AccessDeniedError):
            await session.send("secret/plans", b"x")
        await session.send("public/news", b"y")  # no endpoint: acked and discarded


async def test_timestamps_are_stamped_by_the_node_only_when_asked(server: Server) -> None:
    async with (
        connect(server.url, timestamps=True) as stamping,
        connect(server.url) as plain,
        connect(server.url) as sub,
    ):
        sub.subscribe("t")
        await sub.confirm()
        before = time.time()
        stamping.publish("t", b"stamped")
        await stamping.flush()
        plain.publish("t", b"plain")
        await plain.flush()
        first, second = await receive(sub), await receive(sub)
        after = time.time()
    assert (first.payload, second.payload) == (b"stamped", b"plain")
    assert first.timestamp is not None
    assert before <= first.timestamp <= after
    assert second.timestamp is None


async def test_no_local(server: Server) -> None:
    async with (
        connect(server.url, no_local=True) as quiet,
        connect(server.url) as chatty,
        connect(server.url) as other,
    ):
        for session in (quiet, chatty):
            session.subscribe("room")
        await quiet.confirm()
        await chatty.confirm()
        quiet.publish("room", b"from quiet")
        chatty.publish("room", b"from chatty")
        await quiet.flush()
        await chatty.flush()
        other.publish("room", b"from other")
        got_quiet = [(await receive(quiet)).payload for _ in range(2)]
        got_chatty = [(await receive(chatty)).payload for _ in range(3)]
        await nothing_for(quiet, 0.05)
    assert sorted(got_quiet) == [b"from chatty", b"from other"]
    assert sorted(got_chatty) == [b"from chatty", b"from other", b"from quiet"]


async def test_client_name_requested_and_generated(node: Node, server: Server) -> None:
    async with connect(server.url, client_name="alpha") as named, connect(server.url) as anon:
        assert named.client_name == "alpha"
        assert named.welcome["client_name"] == "alpha"
        assert anon.client_name is not None
        assert anon.client_name.startswith("node-")
        assert set(node.vpn().sessions) == {"alpha", anon.client_name}
        assert node.vpn().sessions["alpha"].username == "default"
        assert "alpha" in repr(named)
    await wait_until(lambda: not node.vpn().sessions)


async def test_duplicate_client_name_is_refused(node: Node, server: Server) -> None:
    existing = node.connect(client_name="dup")
    with pytest.raises(AuthenticationError, match="already in use"):
        async with connect(server.url, client_name="dup"):
            pytest.fail("logged in with a client name in use")
    assert server.statistics().refused == 1
    assert node.vpn().sessions["dup"] is existing  # the first one is untouched
    async with connect(server.url, client_name="dup2") as remote:
        with pytest.raises(AuthenticationError, match="already in use"):
            async with connect(server.url, client_name="dup2"):
                pass
        remote.subscribe("still")
        await remote.confirm()  # the first remote session still works
    existing.close()


async def test_node_statistics_of_a_management_user(node: Node, server: Server) -> None:
    node.vpn().add_user("ops", management=True)
    async with connect(server.url, username="ops") as a, connect(server.url) as b:
        b.subscribe("s")
        await b.confirm()
        a.publish("s", b"x")
        a.publish("nobody", b"y")
        await receive(b)
        stats = await a.node_statistics()
    assert set(stats) == {"node", "totals", "vpns", "links", "plugins", "listeners"}
    assert stats["links"] == {}  # no VPN has a link
    assert stats["node"] == "node"
    assert set(stats["vpns"]) == {"default"}
    default = stats["vpns"]["default"]
    assert default["sessions"] == 2
    assert default["published"] == 2
    assert default["delivered"] == 1
    assert default["unmatched"] == 1
    assert stats["totals"]["vpns"] == 1
    assert stats["totals"]["sessions"] == 2
    listener = stats["listeners"][server.url]
    assert listener["accepted"] == 2
    assert listener["logins"] == 2
    assert listener["open"] == 2
    assert listener["bytes_received"] > 0
    assert listener["bytes_sent"] > 0
    assert set(listener) == {
        "accepted",
        "open",
        "logins",
        "refused",
        "failed",
        "bytes_received",
        "bytes_sent",
        "turned_away",
    }


async def test_node_statistics_show_a_session_its_own_vpn_only(node: Node, server: Server) -> None:
    # SPEC 6: another tenant's counters (here its login failures) and the listeners'
    # are not a session's business without the management role.
    secret = node.create_vpn("secret", authentication="basic")
    secret.add_user("admin", password="pw")
    with pytest.raises(AuthenticationError):
        node.connect("secret", username="admin")  # no password given
    assert node.statistics().login_failures == 1
    async with connect(server.url, username="anyone") as anonymous:
        anonymous.publish("x", b"y")
        stats = await anonymous.node_statistics()
    assert set(stats) == {"node", "vpns", "links", "plugins"}
    assert stats["plugins"] == {}  # no plugin has figures of its own for this VPN
    assert stats["node"] == "node"
    assert list(stats["vpns"]) == ["default"]
    assert stats["links"] == {"default": {}}
    own = stats["vpns"]["default"]
    assert (own["sessions"], own["published"], own["login_failures"]) == (1, 1, 0)


async def test_node_statistics_of_a_management_user_cover_every_vpn(
    node: Node, server: Server
) -> None:
    secret = node.create_vpn("secret", authentication="basic")
    secret.add_user("admin", password="pw")
    with pytest.raises(AuthenticationError):
        node.connect("secret", username="admin")
    tenant = node.create_vpn("tenant")
    tenant.add_user("ops", management=True)
    async with connect(server.url, vpn="tenant", username="ops") as ops:
        stats = await ops.node_statistics()
    assert list(stats["vpns"]) == ["default", "secret", "tenant"]
    assert stats["vpns"]["secret"]["login_failures"] == 1
    assert stats["totals"]["login_failures"] == 1
    assert stats["totals"]["vpns"] == 3
    assert stats["listeners"][server.url]["logins"] == 1


async def test_request_reply(node: Node, server: Server) -> None:
    async def respond(message: Message) -> None:
        assert message.reply_to is not None
        responder.publish(
            message.reply_to, message.payload.upper(), correlation_id=message.correlation_id
        )

    async with (
        connect(server.url, client_name="responder", on_message=respond) as responder,
        connect(server.url, client_name="requester") as requester,
    ):
        responder.subscribe("service/upper")
        await responder.confirm()
        inbox = f"inbox/{requester.client_name}"
        requester.subscribe(inbox)
        await requester.confirm()
        for i in range(3):
            requester.publish("service/upper", f"req{i}", reply_to=inbox, correlation_id=str(i))
        replies = [await receive(requester) for _ in range(3)]
        # An in-process requester is served by the remote responder too.
        local = node.connect(client_name="local")
        local.subscribe("inbox/local")
        local.publish("service/upper", b"hi", reply_to="inbox/local", correlation_id="L")
        reply = await receive(local)
        local.close()
    assert [(r.payload, r.correlation_id, r.sender) for r in replies] == [
        (f"REQ{i}".encode(), str(i), "responder") for i in range(3)
    ]
    assert (reply.payload, reply.correlation_id) == (b"HI", "L")


_ACLOSE_IN_A_SCOPE = """
import os
import sys

import anyio

from meshbus import Node
from meshbus.transports import ListenerSettings, connect, start_server


async def scenario():
    async with Node() as node:
        server = await start_server(node, ListenerSettings(port=0))
        session = connect(server.url)
        async with session:
            with anyio.fail_after(2):  # any cancel scope opened inside the session
                await session.aclose()
            assert session.closed
        other = connect(server.url)
        async with other, anyio.create_task_group() as tg:
            tg.start_soon(other.aclose)  # closed by another task
        assert other.closed


async def main():
    try:
        await scenario()
    except BaseException as exc:
        print("SCENARIO FAILED:", repr(exc), flush=True)
        os._exit(1)  # not through the event loop's shutdown, which the bug can hang
    print("SCENARIO OK", flush=True)
    os._exit(0)


anyio.run(main, backend=sys.argv[1])
"""


async def test_aclose_inside_a_cancel_scope(anyio_backend: str) -> None:
    # In a child interpreter: the bug corrupts the event loop it runs in.
    output = await run_isolated(_ACLOSE_IN_A_SCOPE, anyio_backend, timeout=10)
    assert "SCENARIO OK" in output


async def test_closing_the_remote_session_closes_the_node_session(
    node: Node, server: Server
) -> None:
    local = node.connect()
    local.subscribe(">")
    async with connect(server.url, client_name="gone") as remote:
        remote.subscribe("x")
        await remote.confirm()
        assert "gone" in node.vpn().sessions
    assert remote.closed
    assert not remote.connected
    await wait_until(lambda: "gone" not in node.vpn().sessions)
    await wait_until(lambda: server.statistics().open == 0)
    local.publish("x")  # only the in-process session's own subscription matches
    assert node.vpn().statistics().unmatched == 0
    local.close()


# --- guaranteed messaging over the wire ------------------------------------------------------


async def test_send_queue_bind_receive_ack(node: Node, server: Server) -> None:
    svc = service(node)
    svc.create_queue("orders", subscriptions=["orders/>"])
    async with connect(server.url, client_name="producer") as producer:
        await producer.send("orders/1", b"first", headers={"h": 1}, correlation_id="c1")
        await producer.send("orders/2", b"second", persistent=False)
    assert svc.store.stats("default/orders").messages == 2
    async with connect(server.url) as consumer:
        flow = await consumer.bind("orders")
        first = await receive(flow)
        second = await receive(flow)
        assert (first.topic, first.payload) == ("orders/1", b"first")
        assert first.delivery_mode is DeliveryMode.PERSISTENT
        assert second.delivery_mode is DeliveryMode.NON_PERSISTENT
        assert dict(first.headers) == {"h": 1}
        assert first.correlation_id == "c1"
        assert first.sender == "producer"
        assert first.destination == "orders"
        assert first.redelivered is False
        assert first.message_id is not None
        flow.ack(first)
        flow.ack(second)
        await flow.unbind()
        assert flow.unbound
        await wait_until(lambda: svc.store.stats("default/orders").messages == 0)
        with pytest.raises(StateError):
            await flow.receive()


async def test_a_flow_s_backlog_goes_out_in_a_write_not_one_each(
    node: Node, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a bound flow holds already is written together with the message its
    feeder waited for, within the window, in order."""
    svc = service(node)
    svc.create_queue("orders", subscriptions=["orders/>"])
    async with connect(server.url) as producer:
        await producer.send_many([(f"orders/{i}", b"%d" % i) for i in range(10)])
    flushes = []
    flush = Connection.flush

    async def counted(self: Connection) -> None:
        if self.protocol.role is Role.SERVER:
            flushes.append(self)
        await flush(self)

    monkeypatch.setattr(Connection, "flush", counted)
    async with connect(server.url) as consumer:
        flow = await consumer.bind("orders", window=6)
        got = [await receive(flow) for _ in range(6)]
        await nothing_for(flow)  # the window is full
        writes = len(flushes)  # the BIND's answer, then the deliveries
        assert writes <= 3, writes
        for message in got:
            flow.ack(message)
        got += [await receive(flow) for _ in range(4)]
        assert [m.payload for m in got] == [b"%d" % i for i in range(10)]


async def test_a_backlog_longer_than_one_write_arrives_whole(
    node: Node, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_answering, "_FEED_BATCH", 4)  # many writes of at most 4
    svc = service(node)
    svc.create_queue("orders", subscriptions=["orders/>"])
    async with connect(server.url) as producer:
        await producer.send_many([(f"orders/{i}", b"%d" % i) for i in range(600)])
    async with connect(server.url) as consumer:
        flow = await consumer.bind("orders", window=600)
        got = [await receive(flow) for _ in range(600)]
        assert [m.payload for m in got] == [b"%d" % i for i in range(600)]


async def test_flow_ack_refuses_an_unknown_or_acked_message(node: Node, server: Server) -> None:
    service(node).create_queue("q", subscriptions=["q"])
    local = node.connect()
    await local.send("q", b"x")
    async with connect(server.url) as session:
        flow = await session.bind("q")
        message = await receive(flow)
        flow.ack(message)
        with pytest.raises(StateError):
            flow.ack(message)  # acked already
        with pytest.raises(StateError):
            flow.ack(message.evolve(message_id=10**9))
    local.close()


async def test_flow_async_for_ends_on_unbind(node: Node, server: Server) -> None:
    service(node).create_queue("q", subscriptions=["q/>"])
    async with connect(server.url) as session:
        for i in range(3):
            await session.send(f"q/{i}", b"")
        flow = await session.bind("q")
        seen = []
        with anyio.fail_after(2):
            async for message in flow:
                seen.append(message.topic)
                flow.ack(message)
                if len(seen) == 3:
                    await flow.unbind()
    assert seen == ["q/0", "q/1", "q/2"]


async def test_acks_are_committed_when_a_remote_flow_unbinds(node: Node, server: Server) -> None:
    svc = service(node)
    svc.create_queue("acks", subscriptions=["acks"])
    local = node.connect()
    async with connect(server.url) as session:
        for _ in range(40):  # the race is lost about one time in three
            await local.send("acks", b"1")
            flow = await session.bind("acks")
            flow.ack(await receive(flow))
            await local.send("acks", b"2")
            flow.ack(await receive(flow))
            await flow.unbind()
            # Unbinding commits the acks: nothing is left for a crash to bring back.
            await wait_until(lambda: svc.store.stats("default/acks").messages == 0, 0.5)
    local.close()


async def test_send_many_results(node: Node, server: Server) -> None:
    svc = service(node)
    svc.create_queue("small", subscriptions=["m/>"], max_messages=2)
    async with connect(server.url) as session:
        results = await session.send_many(
            [("m/1", b"a"), ("", b"bad topic"), ("m/2", "b"), ("m/3", b"over quota"), ("x", b"")]
        )
    assert results[0] is None
    assert isinstance(results[1], InvalidTopicError)
    assert results[2] is None
    assert isinstance(results[3], PublishRejectedError)
    assert results[3].reason == "over-quota"
    assert results[4] is None  # no matching endpoint: acked and discarded
    assert svc.store.stats("default/small").messages == 2


async def test_send_to_queue(node: Node, server: Server) -> None:
    svc = service(node)
    svc.create_queue("direct-q")
    async with connect(server.url) as session:
        await session.send_to_queue("direct-q", b"by name", reply_to="r/1")
        with pytest.raises(PublishRejectedError) as caught:
            await session.send_to_queue("missing", b"x")
        assert caught.value.reason == "no-such-queue"
        assert "missing" in str(caught.value)
        flow = await session.bind("direct-q")
        message = await receive(flow)
        assert (message.payload, message.reply_to) == (b"by name", "r/1")
        flow.ack(message)
        await session.send_to_queue("direct-q", b"still usable after a rejection")
        assert (await receive(flow)).payload == b"still usable after a rejection"


async def test_send_to_queue_denied_by_the_acl_raises_access_denied(
    node: Node, server: Server
) -> None:
    svc = service(node)
    svc.create_queue("alarms")
    node.vpn().add_acl_profile(
        AclProfile("plant", publish_default=AclAction.DENY, publish_exceptions=["plant/>"])
    )
    node.vpn().add_user("sensor", acl_profile="plant")
    async with connect(server.url, username="sensor") as session:
        with pytest.raises(AccessDeniedError) as caught:
            await session.send_to_queue("alarms", b"x")
        assert (caught.value.action, caught.value.topic) == ("publish", "#P2P/QUE/alarms")
        assert caught.value.username == "sensor"
        await session.send("plant/boiler", b"the session goes on")
    assert svc.store.stats("default/alarms").messages == 0
    assert node.vpn().statistics().denied == 1


async def test_bind_errors(node: Node, server: Server) -> None:
    async with connect(server.url) as session:
        with pytest.raises(StateError):
            await session.bind("no-such-queue")
        with pytest.raises(StateError):
            await session.bind_topic_endpoint("no-such-endpoint", "a/b")


async def test_unacked_messages_are_redelivered_after_the_session_closes(
    node: Node, server: Server
) -> None:
    service(node).create_queue("work", subscriptions=["work/>"])
    async with connect(server.url) as producer:
        for i in range(3):
            await producer.send(f"work/{i}", str(i))
    async with connect(server.url) as first:
        flow = await first.bind("work")
        taken = [await receive(flow) for _ in range(3)]
        flow.ack(taken[0])
        assert [m.redelivered for m in taken] == [False, False, False]
    # The first consumer went away with two unacked messages: the next one gets them, flagged.
    async with connect(server.url) as second:
        flow = await second.bind("work")
        again = [await receive(flow) for _ in range(2)]
        assert [m.payload for m in again] == [b"1", b"2"]
        assert [m.redelivered for m in again] == [True, True]
        for message in again:
            flow.ack(message)
        await nothing_for(flow)


async def test_standby_flow_takes_over_unacked_messages(node: Node, server: Server) -> None:
    service(node).create_queue("excl", subscriptions=["excl"])
    async with connect(server.url) as standby:
        standby_flow = await standby.bind("excl")
        async with connect(server.url) as active:
            await active.send("excl", b"job")
            # Exclusive: the first flow bound is active; the second one stands by.
            got = await receive(standby_flow)
            flow = await active.bind("excl")
            await nothing_for(flow, 0.05)
            assert got.redelivered is False
        async with connect(server.url) as other:
            await other.send("excl", b"job 2")
        assert (await receive(standby_flow)).payload == b"job 2"


async def test_window_limits_outstanding_messages(node: Node, server: Server) -> None:
    service(node).create_queue("win", subscriptions=["win"])
    async with connect(server.url) as session:
        for i in range(5):
            await session.send("win", str(i))
        flow = await session.bind("win", window=2)
        first = [await receive(flow), await receive(flow)]
        assert [m.payload for m in first] == [b"0", b"1"]
        await nothing_for(flow, 0.2)  # two unacked: the window is full
        flow.ack(first[0])
        assert (await receive(flow)).payload == b"2"
        await nothing_for(flow, 0.1)
        flow.ack(first[1])
        assert (await receive(flow)).payload == b"3"


async def test_topic_endpoint_bind(node: Node, server: Server) -> None:
    service(node).create_topic_endpoint("prices-te")
    async with connect(server.url) as consumer, connect(server.url) as producer:
        flow = await consumer.bind_topic_endpoint("prices-te", "prices/>")
        await producer.send("prices/eur", b"1.08")
        await producer.send("other/eur", b"not for the endpoint")
        message = await receive(flow)
        assert (message.topic, message.payload) == ("prices/eur", b"1.08")
        flow.ack(message)
        await nothing_for(flow)
        await flow.unbind()
        # The subscription stays with the endpoint (durable) while nobody is bound.
        await producer.send("prices/usd", b"1.00")
        flow = await consumer.bind_topic_endpoint("prices-te", "prices/>")
        assert (await receive(flow)).payload == b"1.00"


async def test_direct_subscriber_gets_guaranteed_send_as_direct(server: Server) -> None:
    async with connect(server.url) as subscriber, connect(server.url) as producer:
        subscriber.subscribe("g/>")
        await subscriber.confirm()
        await producer.send("g/1", b"x")
        message = await receive(subscriber)
        assert (message.topic, message.delivery_mode) == ("g/1", DeliveryMode.DIRECT)


async def test_persistent_message_survives_a_node_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with Node(data_dir=data_dir) as node:
        service(node).create_queue("durable", subscriptions=["d/>"])
        server = await start_server(node, ListenerSettings(port=0))
        async with connect(server.url) as producer:
            await producer.send("d/1", b"kept", headers={"k": "v"})
        async with connect(server.url) as consumer:
            flow = await consumer.bind("durable")
            taken = await receive(flow)  # delivered, never acked
            assert (taken.payload, taken.redelivered) == (b"kept", False)
    async with Node(data_dir=data_dir) as node:
        service(node).create_queue("durable", subscriptions=["d/>"])
        server = await start_server(node, ListenerSettings(port=0))
        async with connect(server.url) as consumer:
            flow = await consumer.bind("durable")
            message = await receive(flow)
            assert (message.topic, message.payload) == ("d/1", b"kept")
            assert dict(message.headers) == {"k": "v"}
            assert message.redelivered is True
            assert message.delivery_mode is DeliveryMode.PERSISTENT
            flow.ack(message)
            await nothing_for(flow)
