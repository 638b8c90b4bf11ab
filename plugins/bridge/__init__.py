"""Plugin ``bridge``: Message VPN bridges (SPEC 7).

Bridges opened from Python (:func:`open_bridge`) or from the configuration file
(``[[vpns.NAME.bridges]]``) that carry direct messages between a VPN of this node
and a VPN of another node (over a :class:`~meshbus.transports.WireLink`) or of this
node (over a
:class:`~meshbus.LocalLink`), with remote subscriptions changeable while running,
topic mapping in both directions (:class:`TopicMapper`), hop counting and origin
de-duplication, and guaranteed flows bound to the queues of the VPN at the other end
(each message spooled to all matching local endpoints before its ack, those that
arrive together in one commit), failover in connect order and fail-back, one
connection for the two bridges of a pair, counters per bridge with a forward
latency histogram (also in ``meshbus stats``).
"""

from ._bridge import (
    BRIDGE,
    CARRIES,
    Bridge,
    BridgeSettings,
    bridges,
    open_bridge,
    partner_of,
    same_node_refusal,
    totals,
)
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
    "CARRIES",
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
    "partner_of",
    "same_node_refusal",
    "totals",
]
