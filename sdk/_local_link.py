"""Links inside one process: two VPNs joined without a connection (SPEC 7).

A bridge between two VPNs of the same node, or between nodes that share a process,
needs no wire: :meth:`LocalLink.pair` makes the two ends, and a message one end
sends is handed, as the same object, to the other end's VPN (with the hop count the
sending end's stages gave it). Everything else a link does — stages, interest,
no-local, origin de-duplication, counters, state — is the :class:`Link` base's.

Delivery is synchronous: the far VPN routes the message before ``send`` returns,
as the near one did, so a publish that crosses costs two routings and no task
switch. A loop of local links ends where every loop of links ends: at the hop
limit or at the origin filter of a VPN the message was in before.

Guaranteed messages routed over it cross as their direct copy (what the far VPN's
subscriptions get), as over a wire link's DELIVER. A bridge moves guaranteed messages
across by binding a flow to a queue of the far VPN and spooling what it delivers with
:meth:`~meshbus.Link.receive_guaranteed_many` (``meshbus.plugins.bridge``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._crossing import restamped
from ._links import Link, LinkState
from ._messages import Envelope

if TYPE_CHECKING:
    from ._vpn import Vpn

__all__ = ["LocalLink"]


class LocalLink(Link):
    """One end of a link between two VPNs in this process; make both with :meth:`pair`.

    Attach each end to its VPN (``vpn.links.attach(end)``), after setting whatever a
    plugin reads from ``end.stash``; the pair is ``in-sync`` once both are attached.
    """

    def __init__(self, vpn: Vpn, name: str, *, kind: str = "bridge", dedup: bool = True) -> None:
        super().__init__(vpn, name, kind, dedup=dedup)
        #: The other end.
        self.peer: LocalLink | None = None

    @classmethod
    def pair(
        cls,
        near: Vpn,
        far: Vpn,
        name: str,
        *,
        far_name: str | None = None,
        kind: str = "bridge",
        dedup: bool = True,
    ) -> tuple[LocalLink, LocalLink]:
        """Two ends: one in ``near`` called ``name``, one in ``far`` called ``far_name``
        (default ``name``), neither attached yet."""
        if near is far:
            raise ValueError("a local link joins two different VPNs")
        a = cls(near, name, kind=kind, dedup=dedup)
        b = cls(far, far_name if far_name is not None else name, kind=kind, dedup=dedup)
        a.peer, b.peer = b, a
        return a, b

    def attached_to_vpn(self) -> None:
        """Called by the VPN's link router once this end is attached: the pair is up
        when both ends are."""
        peer = self.peer
        if peer is not None and peer.attached:
            for end, other in ((self, peer), (peer, self)):
                end.opened(other.vpn.node.node_id)
                end.set_state(LinkState.IN_SYNC)

    def send(self, envelope: Envelope) -> bool:
        peer = self.peer
        if peer is None or not peer.attached or self.state is not LinkState.IN_SYNC:
            return False
        message = envelope.message
        if envelope.hop_count != message.hop_count:
            message = restamped(message, message.origin, envelope.hop_count)
        peer.receive(message, envelope.mode)
        return True

    async def aclose(self, reason: str = "stopped") -> None:
        """:meth:`stop` (nothing waits in between: both ends are in this node)."""
        self.stop(reason)

    def stop(self, reason: str = "stopped") -> None:
        """Take both ends out of their VPNs (their state becomes ``disabled``)."""
        for end in (self, self.peer):
            if end is not None and end.attached:
                end.reason = reason
                end.vpn.links.detach(end)
