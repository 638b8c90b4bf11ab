"""Two and three nodes in one process, linked over the in-memory network, on one clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from meshbus import Node
from meshbus.transports.testing import Mesh

pytestmark = pytest.mark.anyio


@pytest.fixture
async def mesh(anyio_backend: object) -> AsyncIterator[Mesh]:
    async with Mesh() as running:
        yield running


async def test_a_subscription_on_b_attracts_a_publish_on_a(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a", wants=["orders/>"])
    await mesh.in_sync(link)
    assert link.peer_node == "a"
    (accepted,) = a.vpn().links
    assert accepted.interest == ("orders/>",)

    subscriber = b.connect(client_name="sub")
    subscriber.subscribe("orders/>")
    publisher = a.connect(client_name="pub", timestamps=True)
    publisher.publish("orders/1", b"one", headers={"k": "v"}, correlation_id="c1")
    publisher.publish("invoices/1", b"not wanted")
    await mesh.clock.settle()

    message = subscriber.receive_nowait()
    assert message is not None
    assert (message.topic, message.payload, message.sender) == ("orders/1", b"one", "pub")
    assert message.headers == {"k": "v"}
    assert message.correlation_id == "c1"
    assert message.timestamp is not None
    assert message.origin is not None
    assert message.origin[0] == "a"
    assert subscriber.receive_nowait() is None
    assert accepted.statistics().forwarded == 1
    assert link.statistics().received == 1


def queue_depth(node: Node, name: str) -> int:
    return node.guaranteed.queue(name).usage()[0]  # type: ignore[attr-defined]


async def test_a_guaranteed_message_is_spooled_on_b_before_a_lets_it_go(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    a.guaranteed.create_queue("to-b", subscriptions=["orders/>"])
    b.guaranteed.create_queue("orders", subscriptions=["orders/>"], max_messages=1)
    sender_b = b.connect(client_name="local")
    await sender_b.send("orders/0", b"fills B's queue")
    link = mesh.link(b, "a", pulls=["to-b"])
    await mesh.in_sync(link)

    await a.connect(client_name="pub").send("orders/1", b"one", correlation_id="c1")
    await mesh.clock.settle()
    # B's queue is full: the message stays on A, unacknowledged, and is tried again.
    assert queue_depth(a, "to-b") == 1
    assert link.statistics().receive_failures >= 1

    consumer = await b.connect(client_name="consumer").bind("orders")
    first = await consumer.receive()
    assert first.payload == b"fills B's queue"
    consumer.ack(first)
    await mesh.clock.run(link.retry_interval)
    assert queue_depth(a, "to-b") == 0  # acknowledged once B held it
    second = await consumer.receive()
    assert (second.topic, second.payload, second.sender) == ("orders/1", b"one", "pub")
    assert second.correlation_id == "c1"
    assert second.origin is not None
    assert second.origin[0] == "a"
    assert link.pulled == 1
