"""Deterministic multi-node tests: several nodes in one process, on one virtual clock.

A :class:`Mesh` runs nodes that share a :class:`~meshbus.ManualClock` and a
:class:`MemoryNetwork`: each node listens on the network under its name, and
:meth:`Mesh.link` opens a :class:`WireLink` from one node's VPN to another's over
it. Nothing waits on real time: keepalive, login timeouts and reconnect backoff
run on the clock, so a test moves time (:meth:`~meshbus.ManualClock.run`,
:meth:`~meshbus.ManualClock.wait_for`) or lets everything settle
(:meth:`~meshbus.ManualClock.settle`), and a link can be cut, delayed or made
half-open through :attr:`Mesh.network`. ::

    async with Mesh() as mesh:
        a, b = await mesh.start("a"), await mesh.start("b")
        link = mesh.link(b, "a", wants=["orders/>"])
        await mesh.clock.wait_for(lambda: link.state is LinkState.IN_SYNC)

With pytest, the ``mesh`` fixture (the ``meshbus-mesh`` pytest plugin, loaded by
itself) gives each test a fresh :class:`Mesh`.

It lives with the transports, not in :mod:`meshbus.testing`, because it needs them:
the core imports nothing above it.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import attrs

from meshbus import ManualClock, Node, Vpn
from meshbus._links import LinkState

from ._backoff import Backoff
from ._dialing import ConnectSettings
from ._link import WireLink, open_link
from ._memory import MemoryNetwork
from ._server import Server, start_server
from ._settings import ListenerSettings

__all__ = ["QUICK_LISTENER", "Mesh"]

QUICK_LISTENER = ListenerSettings(keepalive=1.0, keepalive_timeout=3.0, handshake_timeout=5.0)
"""A mesh node's listener: a ping after 1 s of silence, a peer dead after 3 s."""


class Mesh:
    """Nodes on one clock and one in-memory network (use it with ``async with``).

    :param clock: the clock every node runs on (default: a new manual clock at 0).
    """

    def __init__(self, clock: ManualClock | None = None) -> None:
        #: The clock of every node, connection and link of the mesh.
        self.clock = clock if clock is not None else ManualClock()
        #: The in-memory network between the nodes (cut, partition, half-open, delay).
        self.network = MemoryNetwork(self.clock)
        #: The running nodes by name.
        self.nodes: dict[str, Node] = {}
        #: Each node's listener on :attr:`network`, by node name.
        self.servers: dict[str, Server] = {}
        self._stack = AsyncExitStack()
        self._stops: dict[str, tuple[anyio.Event, anyio.Event]] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Mesh:
        await self._stack.__aenter__()
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.push_async_callback(self._stop_all)
        return self

    async def _stop_all(self) -> None:
        for name in reversed(list(self._stops)):  # the last started first, as before
            await self.stop(name)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)

    async def start(
        self,
        name: str,
        *,
        listener: ListenerSettings = QUICK_LISTENER,
        allow_links: bool = True,
        **node_options: Any,
    ) -> Node:
        """Start a node called ``name`` (also its node id unless given) listening on
        the network as ``name``; it stops when the mesh does.

        :param allow_links: let every VPN's default client profile open links (so
            :meth:`link` logs in without more set-up).
        :param node_options: the other arguments of :class:`~meshbus.Node`.
        """
        node_options.setdefault("node_id", name)
        node_options.setdefault("seed", 0)
        node = Node(name=name, clock=self.clock, **node_options)
        stop = anyio.Event()
        stopped = anyio.Event()

        async def run(*, task_status: anyio.abc.TaskStatus[Server]) -> None:
            # Each node lives in a task of its own, so that one can stop before others
            # started after it (a node's task group must end in the task it began in).
            try:
                async with node:
                    if allow_links:
                        for vpn in node.vpns.values():
                            allow_bridges(vpn)
                    listening = self.network.listen(name)
                    server = await start_server(node, listener, listener=listening)
                    task_status.started(server)
                    await stop.wait()
                    await server.aclose()
            finally:
                stopped.set()

        assert self._tg is not None, "use the mesh with 'async with'"
        server = await self._tg.start(run, name=f"mesh node {name}")
        self.nodes[name] = node
        self.servers[name] = server
        self._stops[name] = (stop, stopped)
        return node

    async def stop(self, name: str) -> None:
        """Stop node ``name`` and its listener (start it again with :meth:`start`).
        Time passes on the clock while its links write what they had taken (see
        :attr:`~meshbus.transports.WireLink.drain_timeout`), if they need it to."""
        stop, stopped = self._stops.pop(name)
        del self.nodes[name], self.servers[name]
        stop.set()
        clock = self.clock
        while not stopped.is_set():
            await clock.settle()
            if stopped.is_set():
                break
            deadline = clock.next_deadline
            if deadline is None:  # waiting for what is off the clock (a spool's thread)
                await anyio.sleep(0.001)
            else:
                clock.advance_to(max(deadline, clock.monotonic()))

    def link(
        self,
        source: Node | str,
        target: str,
        *,
        vpn: str = "default",
        remote_vpn: str = "default",
        name: str | None = None,
        wants: tuple[str, ...] | list[str] = (),
        pulls: tuple[str, ...] | list[str] = (),
        backoff: Backoff | None = None,
        kind: str = "bridge",
        **settings: Any,
    ) -> WireLink:
        """Open a link from ``source``'s VPN ``vpn`` to node ``target``'s ``remote_vpn``.

        :param backoff: between reconnects (default: 1 s doubling to 2 min, no jitter,
            so that a test can count attempts).
        :param settings: more :class:`ConnectSettings` (``username``, ``password``, ...).
        """
        node = self.nodes[source] if isinstance(source, str) else source
        settings.setdefault("clock", self.clock)
        connect = ConnectSettings(
            self.network.connectable(target, source=node.name),
            vpn=remote_vpn,
            backoff=backoff if backoff is not None else Backoff(jitter=0.0),
            **settings,
        )
        return open_link(
            node.vpn(vpn),
            name or f"{vpn}-to-{target}",
            connect,
            kind=kind,
            wants=wants,
            pulls=pulls,
        )

    async def in_sync(self, *links: WireLink, within: float = 60.0) -> None:
        """Let time pass until every one of ``links`` is in sync.

        :raises TimeoutError: one was not within ``within`` seconds of clock time.
        """
        await self.clock.wait_for(
            lambda: all(link.state is LinkState.IN_SYNC for link in links), within=within
        )


def allow_bridges(vpn: Vpn) -> None:
    """Let ``vpn``'s default client profile open links."""
    profile = vpn.client_profiles["default"]
    vpn.add_client_profile(attrs.evolve(profile, allow_bridge_connections=True))
