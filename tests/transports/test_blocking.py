"""Blocking remote sessions (``meshbus.transports.blocking``): sync code talking to a
node over real TCP on 127.0.0.1, each session on an event loop thread of its own."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator

import pytest

from meshbus import (
    AuthenticationError,
    InvalidTopicError,
    PublishRejectedError,
    StateError,
    blocking,
)
from meshbus.blocking import BlockingNode
from meshbus.transports import ListenerSettings, RemoteSession, start_server
from meshbus.transports import blocking as remote

pytestmark = pytest.mark.parametrize("backend", ["asyncio", "trio"])


@pytest.fixture
def node(backend: str) -> Iterator[BlockingNode]:
    """A node on a background loop with a TCP listener on a free port."""
    running = blocking.start_node(backend, name="served")
    try:
        vpn = running.create_vpn("secure", authentication="basic")
        running.portal.call(lambda: vpn.add_user("alice", password="s3cret"))
        yield running
    finally:
        running.stop()


def session_threads() -> list[threading.Thread]:
    """The threads of blocking remote sessions still running."""
    return [t for t in threading.enumerate() if t.name == "meshbus-remote-session"]


def url_of(node: BlockingNode) -> str:
    server = node.portal.call(start_server, node.node, ListenerSettings(port=0))
    return str(server.url)


def test_remote_publish_subscribe_receive(node: BlockingNode, backend: str) -> None:
    url = url_of(node)
    with (
        remote.connect(url, backend=backend, client_name="far") as far,
        node.connect(client_name="near") as near,
    ):
        assert isinstance(far.session, RemoteSession)
        assert far.client_name == "far"
        assert far.url == url
        assert far.connected
        far.subscribe("in/>")
        near.subscribe("out/>")
        far.confirm()  # the subscription is applied on the node
        assert far.subscriptions == ("in/>",)
        near.publish("in/1", b"to far")
        assert far.receive(timeout=5).payload == b"to far"
        far.publish("out/1", b"to near", headers={"k": "v"})
        far.flush()
        message = near.receive(timeout=5)
        assert (message.payload, message.headers) == (b"to near", {"k": "v"})
        with pytest.raises(TimeoutError):
            far.receive(timeout=0.05)
        assert far.receive_nowait() is None
        far.unsubscribe("in/>")
        far.confirm()
        assert far.statistics().delivered == 1
        assert far.node_statistics()["vpns"]["default"]["sessions"] == 2
    assert far.closed
    assert not far.loop.thread.is_alive()


def test_remote_publish_many_in_one_call(
    node: BlockingNode, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with remote.connect(url_of(node), backend=backend) as far, node.connect() as near:
        near.subscribe("b/>")
        made: list[object] = []
        call = far.loop.call
        monkeypatch.setattr(far.loop, "call", lambda *a: made.append(a) or call(*a))
        far.publish_many([(f"b/{n}", str(n)) for n in range(300)])
        assert len(made) == 1
        far.confirm()
        got = [near.receive(timeout=5).payload for _ in range(300)]
        assert got == [str(n).encode() for n in range(300)]
        with pytest.raises(InvalidTopicError):  # checked locally, as the node would
            far.publish_many([("ok", b""), ("#bad", b"")])


def test_remote_guaranteed_send_bind_receive_ack(node: BlockingNode, backend: str) -> None:
    node.guaranteed.create_queue("jobs", subscriptions=["jobs/>"], max_messages=3)
    with remote.connect(url_of(node), backend=backend) as far:
        far.send("jobs/1", b"one")
        far.send_to_queue("jobs", b"two")
        results = far.send_many([("jobs/3", b"three"), ("jobs/4", b"four")])
        assert results[0] is None
        assert isinstance(results[1], PublishRejectedError)  # over the quota
        with far.bind("jobs", window=5) as flow:
            got = [flow.receive(timeout=5) for _ in range(3)]
            assert [m.payload for m in got] == [b"one", b"two", b"three"]
            for message in got:
                flow.ack(message)
            with pytest.raises(TimeoutError):
                flow.receive(timeout=0.05)
        far.confirm()  # the acks reached the node with the unbind
        [stats] = node.guaranteed.queue_statistics()
        assert (stats.messages, stats.flows) == (0, 0)


def test_remote_login_with_a_password(node: BlockingNode, backend: str) -> None:
    url = url_of(node)
    with remote.connect(
        url, backend=backend, vpn="secure", username="alice", password="s3cret"
    ) as far:
        assert far.session.vpn == "secure"
        far.publish("t")
        far.confirm()
    with pytest.raises(AuthenticationError):
        remote.connect(url, backend=backend, vpn="secure", username="alice", password="no")
    assert session_threads() == []  # the failed session's thread was ended


def test_close_without_with_and_use_after_close(node: BlockingNode, backend: str) -> None:
    far = remote.connect(url_of(node), backend=backend, client_name="short")
    far.subscribe("t")
    far.confirm()
    assert node.statistics().sessions == 1
    far.close()
    far.close()  # idempotent
    assert far.closed
    for call in (
        lambda: far.publish("t"),
        lambda: far.publish_many([("t", b"")]),
        lambda: far.receive(timeout=1),
        far.confirm,
        lambda: far.send("t"),
        lambda: far.bind("q"),
    ):
        with pytest.raises(StateError, match="remote session 'short' is closed"):
            call()
    assert list(far) == []
    near = node.connect()  # the node saw the logout: the client name is free again
    near.close()
    assert node.portal.call(lambda: node.node.vpn().sessions.get("short")) is None


def test_invalid_settings_start_no_thread(backend: str) -> None:
    with pytest.raises(TypeError):
        remote.connect("tcp://127.0.0.1:1", backend=backend, no_such_setting=1)
    assert session_threads() == []


def test_the_facade_has_no_async_methods(backend: str) -> None:
    # docs/explanation/api-rule.rst: the blocking facade waits on the caller's thread.
    classes = [
        blocking.BlockingNode,
        blocking.BlockingGuaranteed,
        blocking.BlockingSession,
        blocking.BlockingFlow,
        blocking.EventLoopThread,
        remote.BlockingRemoteSession,
    ]
    for cls in classes:
        for name in dir(cls):
            member = inspect.getattr_static(cls, name)
            if not name.startswith("_") and callable(member):
                assert not inspect.iscoroutinefunction(member), f"{cls.__name__}.{name}"
                assert not inspect.isasyncgenfunction(member), f"{cls.__name__}.{name}"
    assert not inspect.iscoroutinefunction(remote.connect)
    assert not inspect.iscoroutinefunction(blocking.start_node)
