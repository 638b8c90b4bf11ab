"""Remote sessions over real TCP on 127.0.0.1: the same calls as an in-process
:class:`meshbus.Session` (SPEC 2, 10) for direct messaging: publish and subscribe,
message options, handlers and ``async for``, invalid topics, timestamps and no_local,
request-reply, and closing.

Access control, client names and node statistics are in test_remote_access.py;
guaranteed messaging over the wire is in test_remote_guaranteed.py.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from meshbus import DeliveryMode, InvalidTopicError, Message, Node, StateError
from meshbus.transports import RemoteSession, Server, connect

from ._remote import Receiver, nothing_for, receive
from .conftest import run_isolated, wait_until


async def topics_until(session: Receiver, last: str) -> list[str]:
    """Topics received up to and including ``last`` (a sentinel published after the rest)."""
    topics: list[str] = []
    while not topics or topics[-1] != last:
        topics.append((await receive(session)).topic)
    return topics


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


async def test_what_was_published_just_before_closing_is_written(
    node: Node, server: Server
) -> None:
    """Leaving the session writes the publishes still buffered, as ``aclose`` says:
    a device that publishes and disconnects loses nothing to the writer's turn."""
    got: list[Message] = []
    local = node.connect(on_message=got.append)
    local.subscribe("last/>")
    async with connect(server.url) as publisher:
        for i in range(5):
            publisher.publish("last/words", b"%d" % i)
    await wait_until(lambda: len(got) == 5, 2.0)
    assert [m.payload for m in got] == [b"0", b"1", b"2", b"3", b"4"]
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
