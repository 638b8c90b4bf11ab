"""Statistics snapshots. Counters are plain ints on the live objects; these
values are only built when someone calls ``statistics()``, so reading is the
only cost."""

from __future__ import annotations

import attrs

__all__ = ["NodeStatistics", "SessionStatistics", "VpnStatistics"]


@attrs.frozen
class SessionStatistics:
    """Counters of one session."""

    published: int
    """Messages this session published."""
    delivered: int
    """Messages handed to this session's handler or receive calls."""
    discarded: int
    """Messages dropped from its egress buffer because it consumed too slowly."""
    denied: int
    """Publishes and subscribes refused by its ACL profile."""
    handler_errors: int
    """Exceptions raised by its message handler (logged, then ignored)."""
    egress_messages: int
    """Messages waiting in its egress buffer now."""
    egress_bytes: int
    """Payload bytes waiting in its egress buffer now."""
    subscriptions: int
    """Subscriptions it holds now."""


@attrs.frozen
class VpnStatistics:
    """Counters of one Message VPN, including sessions that have closed."""

    sessions: int
    """Sessions open now."""
    published: int
    """Messages published in the VPN."""
    delivered: int
    """Deliveries to sessions (one message to three sessions counts three)."""
    discarded: int
    """Messages dropped from slow consumers' egress buffers."""
    denied: int
    """Operations refused by ACL profiles."""
    unmatched: int
    """Published messages that matched no subscription."""
    login_failures: int
    """Logins refused (authentication or connect ACL)."""


@attrs.frozen
class NodeStatistics:
    """Totals over every VPN of a node."""

    node_id: str
    """The node's identity among linked nodes."""
    cluster: str | None
    """The cluster it belongs to, or ``None``."""
    vpns: int
    """VPNs on the node."""
    sessions: int
    """Sessions open now, in all VPNs."""
    published: int
    """Messages published, in all VPNs."""
    delivered: int
    """Deliveries to sessions, in all VPNs."""
    discarded: int
    """Messages dropped from slow consumers' egress buffers."""
    denied: int
    """Operations refused by ACL profiles."""
    unmatched: int
    """Published messages that matched no subscription."""
    login_failures: int
    """Logins refused."""
