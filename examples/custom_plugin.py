"""A third-party style plugin: per-topic traffic auditing.

The plugin counts messages and payload bytes per topic in each VPN with a
router it contributes to the VPN's pipeline (called for every publish, with no
hook in between), logs sessions opening and closing, and prints a report when
the node stops. The docs' plugin tutorial builds it step by step.

A packaged plugin would declare an entry point so it can be named::

    [project.entry-points.meshbus]
    audit = "my_package.audit"

Run it with ``python examples/custom_plugin.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio

from meshbus import Envelope, Node, Pipeline, Session, StashKey, Vpn, hookimpl


class TopicAudit:
    """What the plugin knows about one VPN: traffic per topic."""

    def __init__(self) -> None:
        self.messages: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def route(self, envelope: Envelope) -> int:
        """The router: called once per published message, so it only counts."""
        message = envelope.message
        self.messages[message.topic] += 1
        self.bytes[message.topic] += len(message.payload)
        return 0  # it observes; delivering is the direct plugin's job


# One key per kind of state; the stash of each VPN holds that VPN's TopicAudit.
AUDIT: StashKey[TopicAudit] = StashKey()


class AuditPlugin:
    """Counts traffic per topic and logs sessions. Compose it with ``Node(plugins=[...])``."""

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.log = log

    @hookimpl
    def meshbus_vpn_created(self, vpn: Vpn) -> None:
        vpn.stash[AUDIT] = TopicAudit()

    @hookimpl
    def meshbus_vpn_pipeline(self, vpn: Vpn, pipeline: Pipeline) -> None:
        pipeline.add_router("audit", vpn.stash[AUDIT].route)

    @hookimpl
    def meshbus_session_opened(self, session: Session) -> None:
        self.log(
            f"audit: {session.client_name} logged in to {session.vpn.name} as {session.username}"
        )

    @hookimpl
    def meshbus_session_closed(self, session: Session) -> None:
        stats = session.statistics()
        self.log(
            f"audit: {session.client_name} left after publishing {stats.published} "
            f"and receiving {stats.delivered} messages"
        )

    @hookimpl
    def meshbus_lifespan(self, node: Node) -> AbstractAsyncContextManager[None]:
        return self._report_on_stop(node)

    @asynccontextmanager
    async def _report_on_stop(self, node: Node) -> AsyncIterator[None]:
        yield  # the node runs
        for vpn in node.vpns.values():
            self.log(f"audit: traffic in VPN {vpn.name!r}")
            for topic, count in sorted(audit_of(vpn).messages.items()):
                self.log(f"audit:   {topic:<24} {count:>3} msgs {audit_of(vpn).bytes[topic]:>5} B")


def audit_of(vpn: Vpn) -> TopicAudit:
    """The traffic counters of ``vpn``."""
    return vpn.stash[AUDIT]


async def main() -> None:
    # Entry-point names and plugin objects mix freely; keep "direct" for delivery.
    async with Node(plugins=["direct", AuditPlugin()]) as node:
        print(f"routers of VPN 'default': {node.vpn().routers}")
        async with (
            node.connect(client_name="shop") as shop,
            node.connect(client_name="warehouse") as warehouse,
        ):
            warehouse.subscribe("orders/>")
            for n in range(3):
                shop.publish(f"orders/{n}", b'{"sku": 42}')
            shop.publish("metrics/cpu", b"0.3")  # nobody subscribes: still audited
            received = [m.topic for m in iter(warehouse.receive_nowait, None)]
            print(f"warehouse received {received}")
            counts = audit_of(node.vpn()).messages
            print(f"audited so far: {sum(counts.values())} messages on {len(counts)} topics")


if __name__ == "__main__":
    anyio.run(main)
