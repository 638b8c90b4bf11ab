"""Statistics snapshots. Counters are plain ints on the live objects; these
values are only built when someone calls ``statistics()``, so reading is the
only cost."""

from __future__ import annotations

from bisect import bisect_left

import attrs

__all__ = [
    "LatencyHistogram",
    "NodeStatistics",
    "QueueStatistics",
    "SessionStatistics",
    "VpnStatistics",
]


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


@attrs.frozen
class QueueStatistics:
    """The state and counters of one queue or topic endpoint (SPEC 4)."""

    vpn: str
    """The VPN it belongs to."""
    name: str
    """Its name in that VPN."""
    kind: str
    """``"queue"`` or ``"topic-endpoint"``."""
    messages: int
    """Messages it holds now (spooled, not yet acknowledged), counted against its quota."""
    bytes: int
    """Payload bytes it holds now, counted against its quota."""
    max_messages: int | None
    """Its quota in messages, or ``None``."""
    max_bytes: int | None
    """Its quota in payload bytes, or ``None``."""
    flows: int
    """Consumer flows bound to it now."""
    in_flight: int
    """Messages handed to flows and not yet acknowledged."""
    subscriptions: tuple[str, ...]
    """The topic filters that attract messages to it."""
    dead_message_queue: str | None
    """Where messages past their redelivery limit or TTL go, or ``None``."""
    ingress_enabled: bool
    """Whether it accepts messages."""
    egress_enabled: bool
    """Whether flows may bind and receive."""
    spooled: int
    """Messages spooled to it since the node started."""
    delivered: int
    """Deliveries to flows (redeliveries included)."""
    acked: int
    """Messages acknowledged by consumers."""
    redelivered: int
    """Deliveries flagged as redelivered."""
    expired: int
    """Messages past their TTL."""
    dead_lettered: int
    """Messages moved to its dead message queue."""
    discarded: int
    """Messages dropped (past their limits with no dead message queue)."""


class LatencyHistogram:
    """Counts of durations in fixed buckets (seconds), cheap enough to fill per batch.

    The buckets are bounded and the same for every histogram, so two can be added up
    and a snapshot has a fixed shape: ``{"0.0001": n, ..., "10": n, "+Inf": n}``,
    each count the durations above the previous bound and up to this one.
    """

    BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
              0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
    """Upper bounds of the buckets, in seconds (one more bucket holds the rest)."""
    LABELS = (*(format(b, "g") for b in BOUNDS), "+Inf")
    """The snapshot's keys."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BOUNDS) + 1)

    def record(self, seconds: float, count: int = 1) -> None:
        """Count ``count`` durations of ``seconds``."""
        self.counts[bisect_left(self.BOUNDS, seconds)] += count

    def add(self, other: LatencyHistogram) -> None:
        """Add ``other``'s counts to this one's."""
        for i, n in enumerate(other.counts):
            self.counts[i] += n

    @property
    def total(self) -> int:
        """How many durations were counted."""
        return sum(self.counts)

    def snapshot(self) -> dict[str, int]:
        """The counts by bucket label (upper bound in seconds)."""
        return dict(zip(self.LABELS, self.counts, strict=True))
