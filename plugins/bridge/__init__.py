"""Plugin ``bridge``: Message VPN bridges (SPEC 7).

Built so far: bridges opened from Python (:func:`open_bridge`) or from the
configuration file (``[[vpns.NAME.bridges]]``) that carry direct
messages between a VPN of this node and a VPN of another node (over a
:class:`~meshbus.transports.WireLink`) or of this node (over a
:class:`~meshbus.LocalLink`), with remote subscriptions changeable while running,
topic mapping in both directions (:class:`TopicMapper`), hop counting and origin
de-duplication, and guaranteed flows bound to remote queues (each message spooled
to all matching local endpoints before its ack), failover in connect order and
fail-back. Not built yet: guaranteed messages over a same-node bridge, sharing one
connection between the two bridges of a pair, a forward-latency histogram and
bridge counters in ``meshbus stats`` (:meth:`Bridge.statistics` and :func:`totals`
have the counters).
"""

from ._bridge import BRIDGE, Bridge, BridgeSettings, bridges, open_bridge, totals
from ._mapping import (
    EXCLUDED,
    NO_MATCH,
    TOO_SHORT,
    Mapped,
    TopicMapper,
    TopicMapping,
    directions,
)

__all__ = [
    "BRIDGE",
    "EXCLUDED",
    "NO_MATCH",
    "TOO_SHORT",
    "Bridge",
    "BridgeSettings",
    "Mapped",
    "TopicMapper",
    "TopicMapping",
    "bridges",
    "directions",
    "open_bridge",
    "totals",
]
