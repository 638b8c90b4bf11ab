"""The blocking facade (``meshbus.blocking``): sync code driving a node on a background loop."""

from __future__ import annotations

import threading
import time

import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    AuthenticationError,
    InvalidTopicError,
    Message,
    StateError,
    blocking,
)

pytestmark = pytest.mark.parametrize("backend", ["asyncio", "trio"])


def test_publish_subscribe_receive(backend: str) -> None:
    with blocking.start(backend, name="sync") as node:
        assert node.node.running
        assert node.node.name == "sync"
        with node.connect(client_name="reader") as reader, node.connect() as writer:
            reader.subscribe("orders/>")
            writer.publish("orders/1", b"{}")
            writer.publish("orders/2", "text")
            writer.publish("other", b"ignored")
            first = reader.receive(timeout=2)
            second = reader.receive(timeout=2)
            assert (first.topic, first.payload) == ("orders/1", b"{}")
            assert (second.topic, second.payload) == ("orders/2", b"text")
            reader.unsubscribe("orders/>")
            writer.publish("orders/3", b"late")
            with pytest.raises(TimeoutError):
                reader.receive(timeout=0.05)
            assert reader.statistics().delivered == 2
            assert writer.statistics().published == 4
        assert reader.session.closed
        assert writer.session.closed
        stats = node.statistics()
        assert (stats.published, stats.delivered, stats.unmatched, stats.sessions) == (4, 2, 2, 0)
    assert not node.node.running


def test_receive_times_out_and_then_still_works(backend: str) -> None:
    with blocking.start(backend) as node, node.connect() as session:
        session.subscribe("t")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            session.receive(timeout=0.05)
        assert time.monotonic() - started < 1.5
        session.publish("t", b"x")
        assert session.receive(timeout=2).payload == b"x"


def test_receive_waits_for_a_publish_from_another_thread(backend: str) -> None:
    with blocking.start(backend) as node:
        reader = node.connect()
        reader.subscribe("t")
        writer = node.connect()
        timer = threading.Timer(0.05, writer.publish, args=("t", b"from thread"))
        timer.start()
        try:
            assert reader.receive(timeout=2).payload == b"from thread"
        finally:
            timer.join()


def test_connect_checks_a_password_off_the_event_loop(backend: str) -> None:
    with blocking.start(backend) as node:
        vpn = node.create_vpn("secure", authentication="basic")
        node.portal.call(lambda: vpn.add_user("alice", password="s3cret"))
        with node.connect("secure", username="alice", password="s3cret") as session:
            assert session.session.user is vpn.users["alice"]
        with pytest.raises(AuthenticationError, match="login refused"):
            node.connect("secure", username="alice", password="wrong")


def test_errors_reach_the_caller(backend: str) -> None:
    with blocking.start(backend) as node:
        vpn = node.create_vpn("ro")
        vpn.add_acl_profile(AclProfile("default", publish_default="deny"))
        session = node.connect("ro")
        with pytest.raises(AccessDeniedError):
            session.publish("t")
        with pytest.raises(InvalidTopicError):
            session.subscribe("#bad")
        with pytest.raises(StateError):
            node.connect("ro", client_name=session.session.client_name)
        session.close()
        with pytest.raises(StateError):
            session.receive(timeout=1)


def test_on_message_runs_on_the_nodes_thread(backend: str) -> None:
    seen: list[tuple[bytes, int]] = []

    def handler(message: Message) -> None:
        seen.append((message.payload, threading.get_ident()))

    with blocking.start(backend) as node:
        session = node.connect(on_message=handler)
        session.subscribe("t")
        session.publish("t", b"x")  # inline handler: done when publish returns
    assert [payload for payload, _ in seen] == [b"x"]
    assert seen[0][1] != threading.get_ident()


def test_stopping_closes_sessions(backend: str) -> None:
    with blocking.start(backend) as node:
        session = node.connect()
    assert session.session.closed
    assert not node.node.running
