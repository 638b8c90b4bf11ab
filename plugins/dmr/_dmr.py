"""A node's dynamic routing: its neighbours, its links to them, and being in sync.

:func:`start_dmr` starts it on a running node (``meshbus run`` does it from the
``[dmr]`` table): for each routed VPN it makes a waiting queue per neighbour, dials
every neighbour, and returns once each reachable neighbour's interest has arrived
(or ``sync_timeout`` passed), so an application that serves its clients after it
returns never publishes into a view of the mesh that is still filling (SPEC 8).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import attrs

from meshbus import ConfigurationError, Link, LinkState, Node, StashKey, Vpn
from meshbus.transports import ConnectSettings, WireLink

from ._neighbour import Neighbour, link_name
from ._routing import Routing
from ._settings import DmrSettings, Peer

__all__ = ["DMR", "NEIGHBOUR", "ROUTING", "Dmr", "dmr_of", "start_dmr"]

log = logging.getLogger("meshbus.dmr")

#: The routing state of a VPN (``vpn.stash``).
ROUTING: StashKey[Routing] = StashKey()
#: A node's :class:`Dmr` once started (``node.stash``).
DMR: StashKey[Dmr] = StashKey()
#: On a routing link: the routing and the neighbour it leads to or comes from.
NEIGHBOUR: StashKey[tuple[Routing, Neighbour]] = StashKey()

_AFTER_CONNECTING = tuple(s for s in LinkState if s is not LinkState.CONNECTING)


class Dmr:
    """Dynamic routing on one node (make it with :func:`start_dmr`)."""

    def __init__(self, node: Node, settings: DmrSettings) -> None:
        settings.check(node.name, node.cluster)
        self.node = node
        #: What it runs with: what it was started with, its peers as changed since.
        self.settings = settings
        self.node_name = node.name
        self.cluster = node.cluster
        #: The routing state of each routed VPN.
        self.routings: dict[str, Routing] = {}
        self.started_at = node.clock.monotonic()
        #: Seconds from the start until every reachable neighbour's interest was here
        #: (``None`` while not yet).
        self.synced_after: float | None = None
        self._changed = anyio.Event()

    # --- starting -------------------------------------------------------------------------

    def _start(self) -> None:
        node = self.node
        for vpn_name in self.settings.vpns:
            vpn = node.vpn(vpn_name)
            routing = vpn.stash.get(ROUTING, None)
            if routing is None:
                raise ConfigurationError(
                    "the dmr plugin is not registered on this node (Node(plugins=[..., 'dmr']))"
                )
            if routing.dmr is not None:
                raise RuntimeError(f"dynamic routing runs in VPN {vpn_name!r} already")
            routing.start(self)
            self.routings[vpn_name] = routing
            for peer in self.settings.peers:
                self._add(routing, peer)
            for neighbour in routing.neighbours.values():
                self._dial(routing, neighbour)

    def _add(self, routing: Routing, peer: Peer) -> Neighbour:
        neighbour = Neighbour(peer, routing.vpn.name)
        routing.add_neighbour(neighbour)
        guaranteed = self.node.guaranteed
        if guaranteed is not None:  # or the one kept from before a restart or a removal
            guaranteed.create_queue(neighbour.queue, vpn=routing.vpn.name, accept_direct=False)
        return neighbour

    # --- changing peers while running ------------------------------------------------

    def add_peer(self, peer: Peer) -> None:
        """Route with one more neighbour in every routed VPN (it joined the cluster, or
        this gateway links to one more cluster): dial it, and take its link."""
        # Checked first: a name listed twice, a second link to one cluster.
        settings = attrs.evolve(self.settings, peers=(*self.settings.peers, peer))
        settings.check(self.node_name, self.cluster)
        for routing in self.routings.values():
            self._dial(routing, self._add(routing, peer))
        self.settings = settings
        log.info("dmr: routing with peer %r from now on", peer.name)
        self.sync_changed()

    async def remove_peer(self, name: str, why: str = "no longer a peer") -> None:
        """Stop routing with neighbour ``name`` in every routed VPN, and return once its
        links have closed (each writes what it had taken first). Its interest is
        forgotten at once; the messages its waiting queue holds stay there."""
        links = []
        for routing in self.routings.values():
            neighbour = routing.neighbours.get(name)
            if neighbour is not None:
                links += routing.remove_neighbour(neighbour, why)
        self.settings = attrs.evolve(
            self.settings, peers=tuple(p for p in self.settings.peers if p.name != name)
        )
        log.info("dmr: no longer routing with peer %r: %s", name, why)
        for link in links:
            await link.aclose(why)
        self.sync_changed()

    def _dial(self, routing: Routing, neighbour: Neighbour) -> None:
        settings = self.settings
        vpn = routing.vpn
        connect = ConnectSettings(
            (neighbour.peer.target,),
            vpn=vpn.name,
            username=settings.username,
            password=settings.password,
            tls=settings.tls,
            compression=settings.compression,
            backoff=settings.backoff,
            clock=self.node.clock,
        )
        link = WireLink(
            vpn,
            link_name(self.node_name, neighbour.name),
            kind=neighbour.kind,
            settings=connect,
            endpoint=neighbour.endpoint,
            drain_timeout=settings.drain_timeout,
        )
        link.keeps_interest = True
        link.on_advertise = on_advertise
        link.stash[NEIGHBOUR] = (routing, neighbour)
        neighbour.out = link
        vpn.links.attach(link)
        self.node.task_group.start_soon(link.run, name=f"meshbus dmr link {link.name}")

    async def wait_in_sync(self, timeout: float | None = None) -> bool:
        """Wait until every reachable neighbour's interest is here (``timeout``
        seconds of the node's clock at most; ``None``: ``sync_timeout``). Return
        whether it is.

        Waits on events, not on the clock: a node on a virtual clock that nobody moves
        is in sync as soon as its neighbours' interest arrived."""
        clock = self.node.clock
        limit = clock.monotonic() + (self.settings.sync_timeout if timeout is None else timeout)
        async with anyio.create_task_group() as tg:

            async def expire() -> None:
                await clock.sleep_until(limit)
                tg.cancel_scope.cancel()

            tg.start_soon(expire)
            while not self.in_sync:
                await self._something_changed()
            tg.cancel_scope.cancel()
        return self.in_sync

    async def _something_changed(self) -> None:
        """Return when a neighbour's interest arrived, a routing link opened or closed,
        or a first attempt to reach a neighbour ended."""
        changed = self._changed = anyio.Event()
        first_tries = [
            n.out
            for routing in self.routings.values()
            for n in routing.neighbours.values()
            if n.out is not None and not n.settled and n.out.state is LinkState.CONNECTING
        ]
        async with anyio.create_task_group() as tg:

            async def moved(link: Link) -> None:
                await link.wait_for(*_AFTER_CONNECTING)
                tg.cancel_scope.cancel()

            async def told() -> None:
                await changed.wait()
                tg.cancel_scope.cancel()

            for link in first_tries:
                tg.start_soon(moved, link)
            tg.start_soon(told)

    def sync_changed(self) -> None:
        """Something that being in sync depends on changed: wake :meth:`wait_in_sync`,
        and note when the node was first in sync."""
        self._changed.set()
        if self.synced_after is None and self.in_sync:
            self.synced_after = self.node.clock.monotonic() - self.started_at

    # --- state --------------------------------------------------------------------------

    @property
    def in_sync(self) -> bool:
        """Whether every routed VPN has each reachable neighbour's whole interest; a
        neighbour this node has not tried to reach yet counts as not in sync."""
        return all(routing.in_sync for routing in self.routings.values())

    @property
    def state(self) -> str:
        """``in-sync`` or ``syncing``."""
        return LinkState.IN_SYNC.value if self.in_sync else LinkState.SYNCING.value

    def neighbour(self, name: str, vpn: str = "default") -> Neighbour:
        """The neighbour called ``name`` as VPN ``vpn`` sees it."""
        return self.routings[vpn].neighbours[name]

    def statistics(self) -> dict[str, Any]:
        """State, interest table sizes, and per neighbour its links and counters."""
        return {
            "cluster": self.cluster,
            "node": self.node_name,
            "state": self.state,
            "synced_after": self.synced_after,
            "vpns": {name: routing.statistics() for name, routing in self.routings.items()},
        }


def on_advertise(link: WireLink, event: Any) -> None:
    """A routing link's ``on_advertise``: hand the frame to its VPN's routing."""
    found = link.stash.get(NEIGHBOUR, None)
    if found is not None:
        routing, neighbour = found
        routing.advertised(neighbour, link, event)


async def start_dmr(node: Node, settings: DmrSettings, *, wait: bool = True) -> Dmr:
    """Start dynamic routing on the running ``node`` and (``wait``) return once it is in
    sync or ``settings.sync_timeout`` passed (then it logs which neighbours it waits for).

    :raises ConfigurationError: the settings do not fit the node (no cluster, a peer
        that is the node itself ...), or a routed VPN does not exist.
    """
    if DMR in node.stash:
        raise RuntimeError("dynamic routing runs on this node already")
    dmr = Dmr(node, settings)
    node.stash[DMR] = dmr
    dmr._start()
    if wait and not await dmr.wait_in_sync():
        waiting = [
            f"{vpn}:{n.name}"
            for vpn, routing in dmr.routings.items()
            for n in routing.neighbours.values()
            if not n.synced
        ]
        log.warning(
            "dmr: not in sync after %.1f s; still waiting for %s",
            settings.sync_timeout,
            ", ".join(waiting),
        )
    dmr.sync_changed()
    return dmr


def dmr_of(node: Node) -> Dmr | None:
    """The node's dynamic routing, or ``None`` when it was not started."""
    return node.stash.get(DMR, None)


def routing_of(vpn: Vpn) -> Routing:
    """The routing state of ``vpn``."""
    return vpn.stash[ROUTING]


def neighbour_of(link: Link) -> tuple[Routing, Neighbour] | None:
    """The routing and neighbour of a routing link, or ``None`` for another link."""
    return link.stash.get(NEIGHBOUR, None)
