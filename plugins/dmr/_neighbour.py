"""One neighbour of one VPN: the two links to it, what it wants, and its counters.

Between two nodes there are two connections, one each node dialled, and each
carries one direction of the routing (SPEC 8):

* over the link **this node dialled** (:attr:`Neighbour.out`) go this node's messages
  for the neighbour: the direct ones as they are published, the guaranteed ones from
  this node's *waiting queue* for it (``dmr.<neighbour>``, which the neighbour binds a
  flow to). The neighbour's advertisements come in over it: they are the link's
  interest, and the waiting queue's subscriptions are their guaranteed part.
* over the link **the neighbour dialled** (:attr:`Neighbour.into`) this node advertises
  what it wants, binds the flow to the neighbour's waiting queue for it, and receives
  the neighbour's messages.

So a node that starts learns each reachable neighbour's interest over its own
connection, as soon as it is up, without waiting for the neighbour to dial back;
and a neighbour that cannot be reached keeps its interest on :attr:`out`
(``keeps_interest``), so direct messages for it are counted as dropped and
guaranteed ones wait in its queue.
"""

from __future__ import annotations

from typing import Any

from meshbus import LinkState
from meshbus.transports import WireLink

from ._interest import CLASSES
from ._settings import Peer

__all__ = ["QUEUE_PREFIX", "Neighbour", "link_name", "parse_link_name"]

QUEUE_PREFIX = "dmr."
"""Queue names starting with this are the waiting queues of dynamic routing."""

_LINK = "dmr"


def link_name(source: str, target: str) -> str:
    """The name of the link node ``source`` dials to node ``target``."""
    return f"{_LINK}:{source}:{target}"


def parse_link_name(name: str) -> tuple[str, str] | None:
    """``(source, target)`` of a routing link's name, or ``None`` for another name."""
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != _LINK or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


class Neighbour:
    """A peer node, as one VPN of this node sees it."""

    def __init__(self, peer: Peer, vpn_name: str) -> None:
        self.peer = peer
        #: Its node name.
        self.name = peer.name
        #: ``"internal"`` (same cluster) or ``"external"`` (a gateway of another cluster).
        self.kind = "external" if peer.external else "internal"
        #: The waiting queue of its guaranteed messages on this node.
        self.queue = QUEUE_PREFIX + peer.name
        self.endpoint = f"{vpn_name}/{self.queue}"
        #: The link this node dialled to it: this node's messages go out over it, and
        #: its advertisements come in.
        self.out: WireLink | None = None
        #: The link it dialled to this node, while it is up: this node's advertisements
        #: go out over it, and its messages come in.
        self.into: WireLink | None = None
        #: What it wants, by class (its last snapshot and the changes since).
        self.learned: dict[str, set[str]] = {c: set() for c in CLASSES}
        #: A snapshot being received (in several frames), by class.
        self.receiving: dict[str, set[str]] | None = None
        #: Whether its whole interest arrived since :attr:`out` last connected.
        self.synced = False
        #: Reply-to topics routed to it (requests from it came with them).
        self.replies: set[str] = set()
        self.node_id: str | None = None
        #: Why routing with it stopped (a configuration conflict found at run time), or
        #: ``None`` while it goes on.
        self.refused: str | None = None
        # Counters of the control plane, both ways.
        self.adverts_in = 0
        self.adverts_out = 0
        self.filters_in = 0
        self.filters_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.resyncs_asked = 0
        self.snapshots_out = 0

    def wants(self, topic_filter: str) -> bool:
        """Whether ``topic_filter`` should be in :attr:`out`'s interest."""
        return topic_filter in self.replies or any(
            topic_filter in filters for filters in self.learned.values()
        )

    def wants_guaranteed(self, topic_filter: str) -> bool:
        """Whether ``topic_filter`` should be a subscription of its waiting queue."""
        return topic_filter in self.learned["g"] or topic_filter in self.learned["fg"]

    @property
    def reachable(self) -> bool:
        """Whether the link carrying messages to it is up."""
        out = self.out
        return out is not None and out.state in (LinkState.SYNCING, LinkState.IN_SYNC)

    @property
    def settled(self) -> bool:
        """Whether nothing is awaited from it: its interest is here, or it could not be
        reached (a neighbour not tried yet is awaited)."""
        if self.synced or self.refused:
            return True
        out = self.out
        if out is None or out.state in (LinkState.SYNCING, LinkState.IN_SYNC):
            return False
        return out.connects + out.connect_failures > 0

    @property
    def state(self) -> str:
        """``in-sync`` once its interest arrived over a live link; else the link's state
        (``syncing`` while the interest is on its way)."""
        out = self.out
        if out is None:
            return LinkState.CONNECTING.value
        if out.state in (LinkState.SYNCING, LinkState.IN_SYNC):
            return LinkState.IN_SYNC.value if self.synced else LinkState.SYNCING.value
        return str(out.state.value)

    def statistics(self) -> dict[str, Any]:
        """Its links, interest and control-plane counters, as plain values."""
        out, into = self.out, self.into
        data: dict[str, Any] = {
            "kind": self.kind,
            "state": self.state,
            "node_id": self.node_id,
            "refused": self.refused,
            "interest": {c: len(f) for c, f in self.learned.items() if f},
            "replies": len(self.replies),
            "control": {
                "adverts_in": self.adverts_in,
                "adverts_out": self.adverts_out,
                "filters_in": self.filters_in,
                "filters_out": self.filters_out,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
                "resyncs_asked": self.resyncs_asked,
                "snapshots_out": self.snapshots_out,
            },
        }
        if out is not None:
            s = out.statistics()
            data["out"] = {
                "state": s.state.value,
                "messages": s.forwarded,
                "bytes_out": out.bytes_sent,
                "bytes_in": out.bytes_received,
                "failures": s.forward_failures,
                "dropped": dict(s.dropped),
                "connects": s.connects,
            }
        if into is not None:
            s = into.statistics()
            data["in"] = {
                "state": s.state.value,
                "messages": s.received,
                "bytes_out": into.bytes_sent,
                "bytes_in": into.bytes_received,
                "pulled": into.pulled,
                "dropped": dict(s.dropped),
            }
        return data
