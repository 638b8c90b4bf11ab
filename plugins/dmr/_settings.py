"""What a node needs to route dynamically (SPEC 8): its neighbours, and how to reach them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import attrs

from meshbus import ConfigurationError
from meshbus.transports import Backoff, TlsSettings, validate_compression

__all__ = ["DmrSettings", "Peer"]


def _identity(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value or any(c in value for c in "/:*> \x00"):
        raise ConfigurationError(
            f"{attribute.name} must be a non-empty str without '/', ':', '*', '>' or "
            f"spaces, got {value!r}"
        )


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigurationError(f"{attribute.name} must be a positive number, got {value!r}")


def _compression(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    validate_compression(value)


def _count(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{attribute.name} must be an int >= 1, got {value!r}")


@attrs.frozen
class Peer:
    """A neighbour: another node of this cluster, or (with ``cluster``) the gateway of
    another cluster that this node, a gateway, links to."""

    name: str = attrs.field(validator=_identity)
    """The neighbour's node name (its ``[node] name``)."""
    target: Any = attrs.field()
    """Where it listens: a URL (``tcp://host:port``, ``tls://...``), a
    :class:`~meshbus.transports.Remote`, or a connectable (an in-memory network's)."""
    cluster: str | None = attrs.field(default=None)
    """The other cluster, for an external link; ``None`` for a node of this cluster."""

    @cluster.validator
    def _cluster(self, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None:
            _identity(self, attribute, value)

    @property
    def external(self) -> bool:
        """Whether the link to it is external (it is in another cluster)."""
        return self.cluster is not None


def _peers(value: object) -> tuple[Peer, ...]:
    if isinstance(value, Peer):
        return (value,)
    peers: list[Peer] = []
    for item in cast("Iterable[object]", value):  # not iterable: TypeError, as before
        if not isinstance(item, Peer):
            raise ConfigurationError(f"peers must be Peer values, got {item!r}")
        peers.append(item)
    return tuple(peers)


def _vpns(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError(f"vpns must be a list of VPN names, got {value!r}")
    return tuple(value)


@attrs.frozen
class DmrSettings:
    """A node's place in the mesh: its neighbours and how its links behave.

    The node's own cluster is its :attr:`meshbus.Node.cluster`; every node of the
    cluster lists every other one in ``peers`` (internal links form a full mesh), and
    a gateway lists, in ``peers`` too, the gateway of each cluster it links to (a
    :class:`Peer` with ``cluster``): at most one per other cluster.
    """

    peers: tuple[Peer, ...] = attrs.field(default=(), converter=_peers)
    """The neighbours this node links to (none: a cluster of one node, so far)."""
    vpns: tuple[str, ...] = attrs.field(default=("default",), converter=_vpns)
    """The VPNs that route across the mesh (each links to the same VPN on its peers)."""
    username: str = "default"
    """The client username this node logs in to its peers as (its client profile must
    allow bridge connections)."""
    password: str | None = None
    tls: TlsSettings | None = None
    """For ``tls://`` peers."""
    compression: bool | str = attrs.field(default=False, validator=_compression)
    """Compress the links: ``True`` (the best algorithm both ends have), or the name of
    one (``"lz4"``, ``"zlib"``)."""
    backoff: Backoff = attrs.field(factory=lambda: Backoff(initial=0.5, maximum=5.0))
    """Between reconnects to a peer (a peer that comes back is redialled at once)."""
    window: int = attrs.field(default=255, validator=_count)
    """Guaranteed messages in flight from a neighbour's waiting queue."""
    sync_timeout: float = attrs.field(default=5.0, validator=_positive)
    """The longest :meth:`Dmr.start` waits for the reachable neighbours' interest."""
    chunk: int = attrs.field(default=1000, validator=_count)
    """Most filters in one advertisement frame."""
    reply_routes: int = attrs.field(default=10_000, validator=_count)
    """Most reply-to topics remembered for routing replies to a requester's node."""
    reply_ttl: float = attrs.field(default=60.0, validator=_positive)
    """Seconds a reply-to topic is routed back after its request came."""
    drain_timeout: float = attrs.field(default=5.0, validator=_positive)
    """Seconds a link to a peer may take, as it closes (the node stops), to write what it
    had taken for the peer; then it is cut. Links peers opened to this node take their
    listener's ``drain_timeout``."""

    def __attrs_post_init__(self) -> None:
        names: set[str] = set()
        clusters: dict[str, str] = {}
        for peer in self.peers:
            if peer.name in names:
                raise ConfigurationError(f"peer {peer.name!r} is listed twice")
            names.add(peer.name)
            if peer.cluster is not None:
                other = clusters.get(peer.cluster)
                if other is not None:
                    raise ConfigurationError(
                        f"a second external link to cluster {peer.cluster!r} (through "
                        f"{peer.name!r}; {other!r} is one already): two clusters are "
                        "joined by at most one external link"
                    )
                clusters[peer.cluster] = peer.name
        if not self.vpns:
            raise ConfigurationError("vpns must name at least one VPN")

    def check(self, node_name: str, cluster: str | None) -> None:
        """Refuse settings that cannot work on a node called ``node_name`` of
        ``cluster``.

        :raises ConfigurationError: the node has no cluster, lists itself, or links
            externally to its own cluster.
        """
        if cluster is None:
            raise ConfigurationError("dynamic routing needs the node's cluster (Node(cluster=...))")
        for peer in self.peers:
            if peer.name == node_name:
                raise ConfigurationError(f"peer {peer.name!r} is this node")
            if peer.cluster == cluster:
                raise ConfigurationError(
                    f"peer {peer.name!r}: an external link to the node's own cluster "
                    f"{cluster!r} (list it without cluster: an internal link)"
                )
