"""A blocking facade for applications without an event loop.

The node runs on an event loop in a background thread (an anyio blocking
portal); every method here hands its work to that thread and waits::

    from meshbus import blocking

    with blocking.start() as node:
        with node.connect() as session:
            session.subscribe("orders/>")
            session.publish("orders/1", b"{}")
            print(session.receive(timeout=1.0))

``on_message`` handlers run on the node's thread, not the caller's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._messages import Message
from ._node import Node
from ._session import Session
from ._stats import NodeStatistics, SessionStatistics
from ._vpn import Vpn

__all__ = ["BlockingNode", "BlockingSession", "start"]


@contextmanager
def start(backend: str = "asyncio", **node_options: Any) -> Iterator[BlockingNode]:
    """Start a :class:`meshbus.Node` on a background event loop; stop it on exit.

    :param backend: ``"asyncio"`` or ``"trio"``.
    :param node_options: passed to :class:`meshbus.Node`.
    """
    node = Node(**node_options)
    with start_blocking_portal(backend) as portal, portal.wrap_async_context_manager(node):
        yield BlockingNode(portal, node)


class BlockingNode:
    """Blocking view of a running :class:`meshbus.Node`."""

    def __init__(self, portal: BlockingPortal, node: Node) -> None:
        self.portal = portal
        self.node = node

    def connect(self, vpn: str = "default", **options: Any) -> BlockingSession:
        """Log in and open a session; takes the options of :meth:`meshbus.Node.login`.

        It waits for the login as :meth:`meshbus.Node.login` does, so it also serves
        VPNs whose passwords are checked in a worker thread.
        """
        session = self.portal.call(functools.partial(self.node.login, vpn, **options))
        return BlockingSession(self.portal, session)

    def create_vpn(self, name: str, **options: Any) -> Vpn:
        """Create a VPN; takes the options of :meth:`meshbus.Node.create_vpn`."""
        return self.portal.call(functools.partial(self.node.create_vpn, name, **options))

    def statistics(self) -> NodeStatistics:
        """Totals over every VPN."""
        return self.portal.call(self.node.statistics)


class BlockingSession:
    """Blocking view of a :class:`meshbus.Session`."""

    def __init__(self, portal: BlockingPortal, session: Session) -> None:
        self.portal = portal
        self.session = session

    def publish(self, topic: str, payload: bytes | str = b"", **options: Any) -> None:
        """Publish a direct message (see :meth:`meshbus.Session.publish`)."""
        self.portal.call(functools.partial(self.session.publish, topic, payload, **options))

    def subscribe(self, subscription: str) -> None:
        """Add a subscription."""
        self.portal.call(self.session.subscribe, subscription)

    def unsubscribe(self, subscription: str) -> None:
        """Remove a subscription."""
        self.portal.call(self.session.unsubscribe, subscription)

    def receive(self, timeout: float | None = None) -> Message:
        """Wait for the next message; raise :class:`TimeoutError` after ``timeout`` seconds."""
        return self.portal.call(self._receive, timeout)

    async def _receive(self, timeout: float | None) -> Message:
        with anyio.fail_after(timeout):
            return await self.session.receive()

    def statistics(self) -> SessionStatistics:
        """A snapshot of the session's counters."""
        return self.portal.call(self.session.statistics)

    def close(self) -> None:
        """Close the session."""
        self.portal.call(self.session.close)

    def __enter__(self) -> BlockingSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
