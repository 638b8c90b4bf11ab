"""The examples of docs/how-to/test-multi-node.rst, as written there, with the fixture."""

from __future__ import annotations

import pytest

from meshbus import LinkState

pytestmark = pytest.mark.anyio


async def test_orders_reach_the_warehouse(mesh):  # type: ignore[no-untyped-def]
    shop = await mesh.start("shop")
    warehouse = await mesh.start("warehouse")
    # The warehouse's VPN asks the shop's for orders.
    link = mesh.link(warehouse, "shop", wants=["orders/>"])
    await mesh.in_sync(link)

    picker = warehouse.connect(client_name="picker")
    picker.subscribe("orders/>")
    shop.connect(client_name="till").publish("orders/42", b"2 chairs")
    await mesh.clock.settle()

    order = picker.receive_nowait()
    assert order.payload == b"2 chairs"
    assert order.sender == "till"  # kept across the link
    assert order.origin[0] == "shop"  # where it was published


async def test_a_silent_link_is_noticed_and_restored(mesh):  # type: ignore[no-untyped-def]
    await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a", wants=["t/>"])
    await mesh.in_sync(link)

    mesh.network.half_open("b", "a")
    lost_after = await mesh.clock.wait_for(lambda: link.state is LinkState.BACKOFF, within=60)
    assert 3.0 <= lost_after <= 4.0

    mesh.network.heal("b", "a")
    await mesh.in_sync(link, within=60)  # it reconnects after its backoff


async def test_nothing_is_lost_while_the_warehouse_is_full(mesh):  # type: ignore[no-untyped-def]
    shop = await mesh.start("shop")
    warehouse = await mesh.start("warehouse")
    shop.guaranteed.create_queue("to-warehouse", subscriptions=["orders/>"])
    warehouse.guaranteed.create_queue("orders", subscriptions=["orders/>"])
    link = mesh.link(warehouse, "shop", pulls=["to-warehouse"])
    await mesh.in_sync(link)

    await shop.connect().send("orders/1", b"one order")
    await mesh.clock.settle()
    assert shop.guaranteed.queue("to-warehouse").usage()[0] == 0
    flow = await warehouse.connect().bind("orders")
    assert (await flow.receive()).payload == b"one order"


async def test_ten_minutes_of_attempts_happen_at_once(mesh):  # type: ignore[no-untyped-def]
    await mesh.start("a")
    b = await mesh.start("b")
    mesh.network.partition("b", "a")
    link = mesh.link(b, "a")
    await mesh.clock.run(600)
    assert link.statistics().connect_failures >= 10
