"""Guaranteed messaging over the wire (SPEC 4), remote sessions over real TCP on
127.0.0.1: send, send_many and send_to_queue, binding queues and topic endpoints,
acks, windows, redelivery of unacked messages, and a persistent message across a
node restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from meshbus import (
    AccessDeniedError,
    AclAction,
    AclProfile,
    DeliveryMode,
    InvalidTopicError,
    Node,
    PublishRejectedError,
    StateError,
)
from meshbus.plugins.guaranteed._service import GuaranteedService
from meshbus.transports import ListenerSettings, Server, _answering, connect, start_server
from meshbus.transports._connection import Connection
from meshbus.transports._protocol import Role

from ._remote import nothing_for, receive
from .conftest import wait_until


def service(node: Node) -> GuaranteedService:
    svc = node.guaranteed
    assert isinstance(svc, GuaranteedService)
    return svc


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


async def test_the_acks_of_a_turn_go_as_one_frame_per_flow(
    node: Node, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer acking message by message sends the node one ACK per flow and
    write, not one per message; each id is acked once and the queue empties."""
    svc = service(node)
    svc.create_queue("a", subscriptions=["a"])
    svc.create_queue("b", subscriptions=["b"])
    frames: list[tuple[int, int]] = []
    ack = _answering.ServedFlows.ack

    def counted(self: _answering.ServedFlows, event: Any) -> None:
        frames.append((event.flow, len(event.ids)))
        ack(self, event)

    monkeypatch.setattr(_answering.ServedFlows, "ack", counted)
    local = node.connect()
    for i in range(40):
        await local.send("a" if i % 2 else "b", b"%d" % i)
    async with connect(server.url) as consumer:
        flow_a = await consumer.bind("a", window=20)
        flow_b = await consumer.bind("b", window=20)
        got = [await receive(flow_a) for _ in range(20)] + [
            await receive(flow_b) for _ in range(20)
        ]
        for i in range(20):  # interleaved, as an application acks
            flow_a.ack(got[i])
            flow_b.ack(got[20 + i])
        await consumer.flush()
        await wait_until(lambda: sum(n for _, n in frames) == 40)
        assert sorted(frames) == sorted([(flow_a.number, 20), (flow_b.number, 20)])
        await wait_until(lambda: svc.store.stats("default/a").messages == 0)
        await wait_until(lambda: svc.store.stats("default/b").messages == 0)
    local.close()


async def test_acks_made_just_before_closing_are_committed(node: Node, server: Server) -> None:
    svc = service(node)
    svc.create_queue("tail", subscriptions=["tail"])
    local = node.connect()
    for i in range(10):
        await local.send("tail", b"%d" % i)
    async with connect(server.url) as consumer:
        flow = await consumer.bind("tail", window=10)
        for message in [await receive(flow) for _ in range(10)]:
            flow.ack(message)
    # Acked before the session ended: nothing is given back to the queue.
    await wait_until(lambda: svc.store.stats("default/tail").messages == 0)
    async with connect(server.url) as again:
        await nothing_for(await again.bind("tail"))
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
