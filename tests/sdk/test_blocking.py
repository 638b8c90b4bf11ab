"""The blocking facade (``meshbus.blocking``): sync code driving a node on a background loop."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    AuthenticationError,
    ConfigurationError,
    InvalidTopicError,
    Message,
    PublishRejectedError,
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


# --- started and stopped without ``with`` ---------------------------------------------


def test_start_node_and_stop_without_with(backend: str) -> None:
    node = blocking.start_node(backend, name="plain")
    try:
        assert node.running
        assert node.loop.thread.daemon
        session = node.connect()
        session.subscribe("t")
        session.publish("t", b"x")
        assert session.receive(timeout=2).payload == b"x"
    finally:
        node.stop()
    assert not node.running
    assert not node.node.running
    assert not node.loop.thread.is_alive()
    assert session.closed
    node.stop()  # idempotent
    session.close()  # a no-op once the node has stopped


def test_a_stopped_node_refuses_every_call(backend: str) -> None:
    node = blocking.start_node(backend, name="gone")
    session = node.connect()
    node.guaranteed.create_queue("q")
    flow = session.bind("q")
    node.stop()
    calls = [
        node.connect,
        node.statistics,
        lambda: node.create_vpn("other"),
        lambda: node.guaranteed.queue_statistics(),
        lambda: session.publish("t"),
        lambda: session.publish_many([("t", b"")]),
        lambda: session.receive(timeout=1),
        lambda: session.send("t"),
        lambda: session.bind("q"),
        flow.receive,
        flow.receive_nowait,
    ]
    for call in calls:
        with pytest.raises(StateError, match="node 'gone' has stopped"):
            call()
    flow.unbind()  # a no-op, as close() is
    assert list(session) == []
    assert list(flow) == []


def test_the_node_used_as_a_context_manager(backend: str) -> None:
    with blocking.start_node(backend) as node:
        assert node.running
    assert not node.running


def test_invalid_node_options_start_no_thread(backend: str) -> None:
    with pytest.raises(ConfigurationError):
        blocking.start_node(backend, name="")
    assert not [t for t in threading.enumerate() if t.name.startswith("meshbus-node")]


def test_stop_wakes_a_thread_waiting_in_receive(backend: str) -> None:
    node = blocking.start_node(backend)
    session = node.connect()
    session.subscribe("t")
    failures: list[BaseException] = []

    def wait() -> None:
        try:
            session.receive()
        except BaseException as exc:
            failures.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    node.stop()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert [type(exc) for exc in failures] == [StateError]


def test_stopping_from_the_nodes_own_thread_is_refused(backend: str) -> None:
    refusals: list[Exception] = []

    with blocking.start(backend) as node:

        def handler(message: Message) -> None:
            try:
                node.stop()
            except StateError as exc:
                refusals.append(exc)

        session = node.connect(on_message=handler)
        session.subscribe("t")
        session.publish("t")
        assert node.running
    assert [str(exc) for exc in refusals] == ["cannot stop an event loop from its own thread"]


# --- batches ----------------------------------------------------------------------------


def calls_to_the_loop(monkeypatch: pytest.MonkeyPatch, loop: blocking.EventLoopThread) -> list[str]:
    """Record each call that crosses to ``loop``'s thread."""
    made: list[str] = []
    call = loop.call

    def counted(func: Any, *args: Any) -> Any:
        made.append(getattr(func, "__name__", repr(func)))
        return call(func, *args)

    monkeypatch.setattr(loop, "call", counted)
    return made


def test_publish_many_crosses_to_the_loop_once(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with blocking.start(backend) as node, node.connect() as reader, node.connect() as writer:
        reader.subscribe("b/>")
        made = calls_to_the_loop(monkeypatch, node.loop)
        writer.publish_many((f"b/{n}", str(n)) for n in range(500))
        assert len(made) == 1
        got = [reader.receive(timeout=2) for _ in range(500)]
        assert [(m.topic, m.payload) for m in got] == [
            (f"b/{n}", str(n).encode()) for n in range(500)
        ]
        assert writer.statistics().published == 500


def test_publish_many_applies_its_options_to_every_message(backend: str) -> None:
    with blocking.start(backend) as node, node.connect() as session:
        session.subscribe("o/>")
        session.publish_many(
            [("o/1", b"a"), ("o/2", b"b")], headers={"k": 1}, reply_to="r", correlation_id="c"
        )
        for _ in range(2):
            message = session.receive(timeout=2)
            assert (message.headers, message.reply_to, message.correlation_id) == (
                {"k": 1},
                "r",
                "c",
            )


def test_publish_many_stops_at_a_bad_message(backend: str) -> None:
    with blocking.start(backend) as node, node.connect() as session:
        session.subscribe(">")
        with pytest.raises(InvalidTopicError):
            session.publish_many([("a", b"1"), ("#bad", b"2"), ("c", b"3")])
        assert session.receive(timeout=2).topic == "a"
        assert session.receive_nowait() is None
        assert session.statistics().published == 1


# --- guaranteed messaging ---------------------------------------------------------------


def test_send_bind_receive_ack(backend: str) -> None:
    with blocking.start(backend) as node, node.connect() as session:
        node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        session.send("orders/1", b"one")
        session.send_to_queue("orders", "two", headers={"n": 2})
        with session.bind("orders", window=10) as flow:
            first = flow.receive(timeout=2)
            assert (first.topic, first.payload) == ("orders/1", b"one")
            second = flow.receive_nowait()  # fetched with the first, up to the window
            assert second is not None
            assert (second.payload, second.headers) == (b"two", {"n": 2})
            [stats] = node.guaranteed.queue_statistics()
            assert (stats.name, stats.messages, stats.in_flight, stats.flows) == ("orders", 2, 2, 1)
            flow.ack(first)
            flow.ack(second)
            with pytest.raises(TimeoutError):
                flow.receive(timeout=0.05)
        [stats] = node.guaranteed.queue_statistics("default")
        assert (stats.messages, stats.flows) == (0, 0)
        with pytest.raises(StateError, match="unbound"):
            flow.receive(timeout=1)
        assert node.guaranteed.queue_statistics("other") == []


def test_unacked_messages_come_back_after_unbind(backend: str) -> None:
    with blocking.start(backend) as node, node.connect() as session:
        node.guaranteed.create_queue("q", subscriptions=["t"])
        session.send("t", b"x")
        flow = session.bind("q")
        assert flow.receive(timeout=2).payload == b"x"
        flow.unbind()
        flow.unbind()  # idempotent
        again = session.bind("q")
        message = again.receive(timeout=2)
        assert (message.payload, message.redelivered) == (b"x", True)
        again.ack(message)


def test_flow_iteration_ends_when_it_is_unbound(backend: str) -> None:
    with blocking.start(backend) as node, node.connect() as session:
        node.guaranteed.create_queue("q", subscriptions=["t/>"])
        session.send_many([("t/1", b"1"), ("t/2", b"2")])
        flow = session.bind("q")
        got = []
        for message in flow:
            got.append(message.payload)
            flow.ack(message)
            if len(got) == 2:
                flow.unbind()
        assert got == [b"1", b"2"]


def test_send_many_reports_each_message(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with blocking.start(backend) as node, node.connect() as session:
        node.guaranteed.create_queue("q", subscriptions=["s/>"], max_messages=2)
        made = calls_to_the_loop(monkeypatch, node.loop)
        results = session.send_many(
            [("s/1", b"a"), ("#bad", b"b"), ("s/2", "c"), ("s/3", b"d")], ttl=60
        )
        assert len(made) == 1
        assert results[0] is None
        assert results[2] is None
        assert isinstance(results[1], InvalidTopicError)
        assert isinstance(results[3], PublishRejectedError)
        [stats] = node.guaranteed.queue_statistics()
        assert stats.messages == 2


def test_queue_management(backend: str) -> None:
    with blocking.start(backend) as node, node.connect() as session:
        guaranteed = node.guaranteed
        queue = guaranteed.create_queue("q", subscriptions=["a"])
        assert guaranteed.create_queue("q", subscriptions=["a"]) is queue
        guaranteed.add_subscription("q", "b")
        guaranteed.remove_subscription("q", "a")
        assert guaranteed.queue_statistics()[0].subscriptions == ("b",)
        session.send("b", b"1")
        session.send("b", b"2")
        with pytest.raises(PublishRejectedError):
            session.send_to_queue("nope", b"")
        guaranteed.enable_queue("q", ingress=False)
        with pytest.raises(PublishRejectedError):
            session.send_to_queue("q", b"3")
        guaranteed.enable_queue("q", ingress=True)
        assert guaranteed.purge_queue("q") == 2
        assert guaranteed.queue_statistics()[0].messages == 0
        guaranteed.delete_queue("q")
        assert guaranteed.queue_statistics() == []
        with pytest.raises(StateError):
            guaranteed.purge_queue("q")
        with pytest.raises(StateError):
            session.bind("q")


def test_guaranteed_needs_the_plugin(backend: str) -> None:
    with (
        blocking.start(backend, plugins=[]) as node,
        pytest.raises(ConfigurationError, match="guaranteed"),
    ):
        node.guaranteed  # noqa: B018


def test_a_durable_node_keeps_acked_state_across_stop_and_start(
    backend: str, tmp_path: Path
) -> None:
    node = blocking.start_node(backend, data_dir=tmp_path)
    node.guaranteed.create_queue("q", subscriptions=["t/>"])
    session = node.connect()
    assert session.send_many([(f"t/{n}", str(n)) for n in range(3)]) == [None] * 3
    flow = session.bind("q", window=1)
    first = flow.receive(timeout=2)
    flow.ack(first)  # recorded now, committed by the stop at the latest
    assert first.payload == b"0"
    node.stop()

    node = blocking.start_node(backend, data_dir=tmp_path)
    try:
        node.guaranteed.create_queue("q", subscriptions=["t/>"])
        assert node.guaranteed.queue_statistics()[0].messages == 2
        with node.connect() as session, session.bind("q") as flow:
            got = [flow.receive(timeout=2) for _ in range(2)]
            assert [(m.payload, m.redelivered) for m in got] == [(b"1", False), (b"2", False)]
    finally:
        node.stop()


def test_a_node_not_stopped_is_stopped_at_exit(backend: str, tmp_path: Path) -> None:
    # A real interpreter exit: the ack is committed by the stop the atexit hook makes.
    script = textwrap.dedent(
        f"""
        import atexit
        import sys
        from meshbus import blocking

        # Registered first, so it runs after the hook of the node's loop.
        atexit.register(lambda: print("running at exit:", node.running))
        node = blocking.start_node({backend!r}, data_dir=sys.argv[1])
        node.guaranteed.create_queue("q", subscriptions=["t"])
        session = node.connect()
        if sys.argv[2] == "first":
            session.send("t", b"one")
            session.send("t", b"two")
            flow = session.bind("q", window=1)
            flow.ack(flow.receive(timeout=5))
        print("held:", node.guaranteed.queue_statistics()[0].messages)
        """
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path), which],
            capture_output=True,
            text=True,
            timeout=50,
            check=False,
        )
        for which in ("first", "second")
    ]
    assert [(r.returncode, r.stderr) for r in runs] == [(0, ""), (0, "")]
    assert [r.stdout.split() for r in runs] == [
        ["held:", "1", "running", "at", "exit:", "False"],
        ["held:", "1", "running", "at", "exit:", "False"],
    ]
