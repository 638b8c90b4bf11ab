"""The link-plugin tutorial (examples/pair_link.py): nodes in one process on one clock."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from meshbus import DEFAULT_PLUGINS, DeliveryMode, LinkState, ManualClock, Node

pytestmark = pytest.mark.anyio


def tutorial() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "examples" / "pair_link.py"
    spec = importlib.util.spec_from_file_location("pair_link_tutorial", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


pair_link = tutorial()


@contextlib.asynccontextmanager
async def tutorial_nodes(
    *names: str,
) -> AsyncIterator[tuple[ManualClock, Any, list[Node]]]:
    """Nodes of these names on one manual clock, with the tutorial's plugin loaded:
    ``(clock, the plugin, nodes)``."""
    clock = ManualClock()
    pairs = pair_link.PairLinks()
    plugins = [*DEFAULT_PLUGINS, pairs]
    async with contextlib.AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(
                Node(name=name, node_id=name, clock=clock, plugins=plugins)
            )
            for name in names
        ]
        yield clock, pairs, nodes


async def test_a_subscription_on_b_attracts_a_publish_on_a_and_only_while_it_lasts() -> None:
    async with tutorial_nodes("a", "b") as (_, pairs, (a, b)):
        a_side, b_side = pairs.join(a.vpn(), b.vpn())
        publisher = a.connect(client_name="pub")
        publisher.publish("news/0", b"nobody on b wants it yet")
        assert a_side.statistics().forwarded == 0

        listener = b.connect(client_name="listener")
        listener.subscribe("news/>")
        assert a_side.interest == ("news/>",)
        publisher.publish("news/1", b"now b does", correlation_id="c1")
        message = listener.receive_nowait()
        assert message is not None
        assert (message.payload, message.sender, message.correlation_id) == (
            b"now b does",
            "pub",
            "c1",
        )
        assert message.origin is not None
        assert message.origin[0] == "a"

        listener.unsubscribe("news/>")
        assert a_side.interest == ()
        publisher.publish("news/2", b"gone again")
        assert listener.receive_nowait() is None
        assert a_side.statistics().forwarded == 1
        assert b_side.statistics().received == 1


async def test_a_guaranteed_message_leaves_a_only_once_b_spooled_it() -> None:
    async with tutorial_nodes("a", "b") as (clock, pairs, (a, b)):
        a.guaranteed.create_queue("to-b", subscriptions=["orders/>"])
        b.guaranteed.create_queue("orders", subscriptions=["orders/>"], max_messages=1)
        await b.connect(client_name="local").send("orders/0", b"fills b's queue")
        a_side, b_side = pairs.join(a.vpn(), b.vpn())
        a.task_group.start_soon(a_side.pull, "to-b")

        await a.connect(client_name="shop").send("orders/1", b"one order")
        await clock.run(10)  # b refuses it every second: a keeps it all along
        assert a.guaranteed.queue("to-b").usage()[0] == 1
        assert b_side.statistics().receive_failures >= 10

        flow = await b.connect(client_name="warehouse").bind("orders")
        flow.ack(await flow.receive())
        await clock.run(1)
        assert a.guaranteed.queue("to-b").usage()[0] == 0
        order = await flow.receive()
        assert (order.payload, order.sender) == (b"one order", "shop")


async def test_three_nodes_in_a_triangle_deliver_each_publish_once() -> None:
    async with tutorial_nodes("a", "b", "c") as (_, pairs, (a, b, c)):
        listeners = []
        for node in (a, b, c):
            listener = node.connect(client_name=f"listener-{node.name}")
            listener.subscribe("news/>")
            listeners.append(listener)
        pairs.join(a.vpn(), b.vpn())
        pairs.join(b.vpn(), c.vpn())
        pairs.join(c.vpn(), a.vpn())

        a.connect(client_name="pub").publish("news/1", b"once each")
        for listener in listeners:
            got = [m.payload for m in iter(listener.receive_nowait, None)]
            assert got == [b"once each"], listener.client_name
        links = [link for node in (a, b, c) for link in node.vpn().links]
        assert len(links) == 6
        assert all(link.state is LinkState.IN_SYNC for link in links)
        assert sum(link.dropped.get("duplicate", 0) for link in links) >= 1


async def test_a_guaranteed_messages_direct_copy_is_spooled_nowhere_on_the_other_side() -> None:
    async with tutorial_nodes("a", "b") as (_, pairs, (a, b)):
        pairs.join(a.vpn(), b.vpn())
        service: Any = b.guaranteed
        queue = service.create_queue("q", subscriptions=["news/>"])  # takes direct ones
        listener = b.connect(client_name="listener")
        listener.subscribe("news/>")
        await a.connect(client_name="pub").send("news/1", b"guaranteed")
        message = listener.receive_nowait()
        assert message is not None
        assert message.delivery_mode is DeliveryMode.DIRECT
        assert queue.usage()[0] == 0  # the copy is not the message
