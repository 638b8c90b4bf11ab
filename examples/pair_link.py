"""A link plugin in about fifty lines: VPNs of nodes in one process, linked in pairs.

Each side of a pair is a :class:`meshbus.Link`. What the sessions of one side
subscribe to becomes the other side's interest (so a subscription on node B
attracts publishes on node A), a direct message crosses by a plain call, and
guaranteed messages are pulled from a queue on one side and acknowledged there
only once the other side has spooled them. Everything else (the link router,
no-local, loop de-duplication, counters) is the core's. Run it:
``python examples/pair_link.py``.
"""

from __future__ import annotations

from collections import Counter

import anyio

from meshbus import (
    DEFAULT_PLUGINS,
    Envelope,
    Link,
    LinkState,
    ManualClock,
    Node,
    Session,
    Subscription,
    Vpn,
)
from meshbus.hookspecs import hookimpl


class PairLink(Link):
    """One side of a pair: what it sends, its twin receives."""

    twin: PairLink

    def send(self, envelope: Envelope) -> bool:
        if self.twin.state is not LinkState.IN_SYNC:
            return False  # counted as a forward failure
        # The mode too: a guaranteed message's direct copy is delivered there to
        # subscribers, and spooled nowhere (its queues get the message itself).
        return self.twin.receive(envelope.message, envelope.mode)

    async def pull(self, queue: str) -> None:
        """Move the guaranteed messages of ``queue`` (on this side) to the twin's VPN."""
        clock = self.vpn.node.clock
        async with await self.vpn.node.connect(self.vpn.name).bind(queue) as flow:
            async for message in flow:
                while True:
                    try:
                        await self.twin.receive_guaranteed(message)
                        break  # spooled on the other side (or not wanted there)
                    except Exception:  # an endpoint there is full: try again later
                        await clock.sleep_until(clock.monotonic() + 1.0)
                flow.ack(message)  # only now does this side let it go


class PairLinks:
    """The plugin: ``pairs.join(vpn_a, vpn_b)`` links two VPNs (any VPN, any number)."""

    def __init__(self) -> None:
        self.sides: dict[Vpn, list[PairLink]] = {}
        self.wanted: Counter[tuple[Vpn, str]] = Counter()

    def join(self, a: Vpn, b: Vpn) -> tuple[PairLink, PairLink]:
        one = PairLink(a, f"pair-{b.node.name}", "pair")
        two = PairLink(b, f"pair-{a.node.name}", "pair")
        one.twin, two.twin = two, one
        for side in (one, two):
            self.sides.setdefault(side.vpn, []).append(side)
            side.vpn.links.attach(side)
            side.opened(side.twin.vpn.node.node_id)
            for (vpn, topic_filter), count in self.wanted.items():
                if vpn is side.vpn and count:
                    side.twin.add_interest(topic_filter)
            side.set_state(LinkState.IN_SYNC)
        return one, two

    @hookimpl
    def meshbus_subscription_added(self, session: Session, subscription: Subscription) -> None:
        key = (session.vpn, subscription.filter)
        self.wanted[key] += 1
        if self.wanted[key] == 1:
            for side in self.sides.get(session.vpn, ()):
                side.twin.add_interest(subscription.filter)  # the other side sends it here

    @hookimpl
    def meshbus_subscription_removed(self, session: Session, subscription: Subscription) -> None:
        key = (session.vpn, subscription.filter)
        self.wanted[key] -= 1
        if self.wanted[key] == 0:
            for side in self.sides.get(session.vpn, ()):
                side.twin.remove_interest(subscription.filter)


async def main() -> None:
    clock = ManualClock()
    pairs = PairLinks()
    async with (
        Node(name="a", node_id="a", clock=clock, plugins=[*DEFAULT_PLUGINS, pairs]) as a,
        Node(name="b", node_id="b", clock=clock, plugins=[*DEFAULT_PLUGINS, pairs]) as b,
    ):
        a.guaranteed.create_queue("to-b", subscriptions=["orders/>"])
        b.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        a_side, _ = pairs.join(a.vpn(), b.vpn())
        a.task_group.start_soon(a_side.pull, "to-b")

        listener = b.connect(client_name="listener")
        listener.subscribe("news/>")
        a.connect(client_name="writer").publish("news/today", b"hello from a")
        await (a.connect(client_name="shop")).send("orders/1", b"one order")
        await clock.settle()

        news = listener.receive_nowait()
        assert news is not None
        origin = news.origin[0] if news.origin else "?"
        print(f"b got {news.topic}: {news.payload.decode()} (sent by {news.sender} on {origin})")
        flow = await b.connect(client_name="warehouse").bind("orders")
        order = await flow.receive()
        flow.ack(order)
        print(f"b spooled {order.topic}: {order.payload.decode()} (sent by {order.sender})")
        print(f"a's queue holds {a.guaranteed.queue('to-b').usage()[0]} messages")
        stats = a_side.statistics()
        print(f"link {stats.name}: forwarded={stats.forwarded} interest={stats.interest}")


if __name__ == "__main__":
    anyio.run(main)
