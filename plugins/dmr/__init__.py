"""Plugin ``dmr``: dynamic message routing across clusters and gateways (SPEC 8).

Nodes of a cluster link to each other in a full mesh and tell each other what their
clients and endpoints want, summarized and refcounted (:class:`InterestTable`); a
gateway tells the clusters it links to what its whole cluster wants, and its cluster
what those clusters want, never one cluster's interest to a third. A message goes
once over each link whose far side wants it, straight from the publisher's node to
each consumer's node (through at most the two gateways between two clusters).
Guaranteed messages for a neighbour that cannot be reached wait in a queue for it
(``dmr.<neighbour>``); direct ones are counted as dropped. A starting node takes its
neighbours' interest before :func:`start_dmr` returns (``in-sync``), and replies to
a request are routed back to the requester's node at once.
"""

from ._dmr import DMR, NEIGHBOUR, ROUTING, Dmr, dmr_of, neighbour_of, routing_of, start_dmr
from ._interest import CLASSES, InterestTable
from ._neighbour import QUEUE_PREFIX, Neighbour, link_name, parse_link_name
from ._routing import Routing
from ._settings import DmrSettings, Peer

__all__ = [
    "CLASSES",
    "DMR",
    "NEIGHBOUR",
    "QUEUE_PREFIX",
    "ROUTING",
    "Dmr",
    "DmrSettings",
    "InterestTable",
    "Neighbour",
    "Peer",
    "Routing",
    "dmr_of",
    "link_name",
    "neighbour_of",
    "parse_link_name",
    "routing_of",
    "start_dmr",
]
