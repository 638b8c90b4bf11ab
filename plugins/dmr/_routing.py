"""Dynamic routing in one VPN: interest in, interest out, and where messages may go.

What a node tells its neighbours (SPEC 8), kept as two summaries
(:class:`~._interest.InterestTable`):

* **to the nodes of its cluster**: what its own clients and endpoints want, and -- on a
  gateway -- what the clusters it links to want (as *foreign* interest, which the
  receiving nodes use but never pass on);
* **to the gateways of other clusters**: the whole cluster's interest -- its own and
  what every node of the cluster told it -- and never what another cluster wants.

Receivers never advertise what they learned inside the cluster, so every node ends
with the cluster's whole interest, once, and a publish goes straight from the
publisher's node to each consumer's node. The same rules in the data plane are
egress stages on the links this node dialled: a message that came from a node of
this cluster goes to no other node of it, and one that came from another cluster
goes to no other cluster.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from meshbus import (
    QUEUE_TOPIC_PREFIX,
    Envelope,
    Link,
    LinkPipeline,
    MeshbusError,
    Vpn,
    parse_subscription,
    validate_queue_topic,
)
from meshbus.transports import WireLink

from ._interest import CLASSES, Change, InterestTable
from ._neighbour import QUEUE_PREFIX, Neighbour

if TYPE_CHECKING:
    from meshbus.transports import Advertise

    from ._dmr import Dmr

__all__ = ["Routing"]

log = logging.getLogger("meshbus.dmr")

_FOREIGN = {"d": "fd", "g": "fg"}


class Routing:
    """The routing state of one VPN of a node (made when the VPN is)."""

    def __init__(self, vpn: Vpn) -> None:
        self.vpn = vpn
        self.dmr: Dmr | None = None
        #: How many local sources want each ``(class, filter)``: kept from the start,
        #: so that routing started later advertises what was there before.
        self.local: dict[tuple[str, str], int] = {}
        self._endpoints: dict[str, tuple[str, ...]] = {}
        self.to_cluster = InterestTable()
        self.to_gateways = InterestTable()
        self.neighbours: dict[str, Neighbour] = {}
        #: The links messages come in over from each side (the egress rules ask).
        self.from_cluster: set[Link] = set()
        self.from_gateways: set[Link] = set()
        self._cluster_queues: set[str] = set()
        self._gateway_queues: set[str] = set()
        self._replies: OrderedDict[str, tuple[Neighbour, float]] = OrderedDict()
        #: Whether any neighbour is a gateway of another cluster (else the summary for
        #: gateways is not kept: nobody would be told it).
        self.gateway = False
        self.bad_adverts = 0
        #: Configuration conflicts found while running (two external links between the
        #: same two clusters), as said in the logs.
        self.conflicts: list[str] = []

    # --- local interest: clients and endpoints -----------------------------------------

    def local_changed(self, kind: str, topic_filter: str, delta: int) -> None:
        """A local source wants ``topic_filter`` as ``kind`` (``delta`` 1) or no longer
        (-1)."""
        key = (kind, topic_filter)
        n = self.local.get(key, 0) + delta
        if n > 0:
            self.local[key] = n
        else:
            self.local.pop(key, None)
        if self.dmr is None or n < 0:
            return
        if delta > 0:
            self._tell_cluster(self.to_cluster.add(kind, topic_filter))
            if self.gateway:
                self._tell_gateways(self.to_gateways.add(kind, topic_filter))
        else:
            self._tell_cluster(self.to_cluster.remove(kind, topic_filter))
            if self.gateway:
                self._tell_gateways(self.to_gateways.remove(kind, topic_filter))

    def endpoint_changed(self, endpoint: str, filters: tuple[str, ...]) -> None:
        """A local endpoint attracts ``filters`` now (its guaranteed interest)."""
        if endpoint.startswith(f"{self.vpn.name}/{QUEUE_PREFIX}"):
            return  # a waiting queue: its interest is a neighbour's, never passed on
        before = self._endpoints.get(endpoint, ())
        if filters:
            self._endpoints[endpoint] = filters
        else:
            self._endpoints.pop(endpoint, None)
        for topic_filter in before:
            if topic_filter not in filters:
                self.local_changed("g", topic_filter, -1)
        for topic_filter in filters:
            if topic_filter not in before:
                self.local_changed("g", topic_filter, 1)

    def start(self, dmr: Dmr) -> None:
        """Routing starts (its neighbours added): build the summaries from what is
        wanted already."""
        self.dmr = dmr
        for (kind, topic_filter), n in self.local.items():
            for _ in range(n):
                self.to_cluster.add(kind, topic_filter)
                if self.gateway:
                    self.to_gateways.add(kind, topic_filter)

    # --- telling neighbours ------------------------------------------------------------

    def _tell_cluster(self, change: Change) -> None:
        if change[0] or change[1]:
            for neighbour in self.neighbours.values():
                if neighbour.kind == "internal":
                    self._advertise(neighbour, change)

    def _tell_gateways(self, change: Change) -> None:
        if change[0] or change[1]:
            for neighbour in self.neighbours.values():
                if neighbour.kind == "external":
                    self._advertise(neighbour, change)

    def summary_for(self, neighbour: Neighbour) -> InterestTable:
        """What ``neighbour`` is told."""
        return self.to_cluster if neighbour.kind == "internal" else self.to_gateways

    def _advertise(self, neighbour: Neighbour, change: Change) -> None:
        link = neighbour.into
        if link is None:
            return  # told everything in a snapshot when it connects
        added, removed = change
        chunk = self.dmr.settings.chunk if self.dmr is not None else 1000
        for kind in CLASSES:
            plus = [f for c, f in added if c == kind]
            minus = [f for c, f in removed if c == kind]
            while plus or minus:
                take_minus = minus[:chunk]
                take_plus = plus[: chunk - len(take_minus)]
                minus = minus[len(take_minus) :]
                plus = plus[len(take_plus) :]
                self._send(neighbour, link, take_plus, take_minus, kind, False, False)

    def send_snapshot(self, neighbour: Neighbour) -> None:
        """Tell ``neighbour`` everything it should know, starting a new epoch."""
        link = neighbour.into
        if link is None:
            return
        chunk = self.dmr.settings.chunk if self.dmr is not None else 1000
        frames: list[tuple[str, list[str]]] = []
        by_class: dict[str, list[str]] = {c: [] for c in CLASSES}
        for kind, topic_filter in self.summary_for(neighbour).advertised():
            by_class[kind].append(topic_filter)
        for kind in CLASSES:
            filters = by_class[kind]
            for i in range(0, len(filters), chunk):
                frames.append((kind, filters[i : i + chunk]))
        if not frames:
            frames.append(("d", []))
        neighbour.snapshots_out += 1
        # The clusters this node links to, for the cluster's other gateways to check
        # that no two of them link to the same cluster.
        gateways = self.linked_clusters if neighbour.kind == "internal" else {}
        last = len(frames) - 1
        for i, (kind, filters) in enumerate(frames):
            extra = {"gw": gateways} if i == 0 and gateways else None
            self._send(neighbour, link, filters, [], kind, i == 0, i < last, extra)

    def _send(
        self,
        neighbour: Neighbour,
        link: WireLink,
        add: list[str],
        remove: list[str],
        kind: str,
        snapshot: bool,
        more: bool,
        extra: dict[str, Any] | None = None,
    ) -> None:
        data: dict[str, Any] = dict(extra or {})
        if kind != "d":
            data["c"] = kind
        if more:
            data["more"] = True
        if link.advertise(add, remove, snapshot=snapshot, data=data):
            neighbour.adverts_out += 1
            neighbour.filters_out += len(add) + len(remove)
            neighbour.bytes_out += len(orjson.dumps([add, remove, data])) + 40

    # --- what neighbours tell this node -----------------------------------------------

    def advertised(self, neighbour: Neighbour, link: WireLink, event: Advertise) -> None:
        """An ADVERTISE from ``neighbour`` over ``link`` (gaps already dealt with)."""
        if event.resync:  # it asks this node to start over
            if link is neighbour.into:
                neighbour.resyncs_asked += 1
                self.send_snapshot(neighbour)
            return
        if link is not neighbour.out:
            self.bad_adverts += 1  # interest comes over the link this node dialled
            return
        kind = event.data.get("c", "d")
        more = event.data.get("more", False)
        if kind not in CLASSES or not isinstance(more, bool):
            self.bad_adverts += 1
            log.warning("dmr: %s sent an advertisement of unknown class %r", neighbour.name, kind)
            return
        neighbour.adverts_in += 1
        neighbour.filters_in += len(event.add) + len(event.remove)
        neighbour.bytes_in += len(orjson.dumps([event.add, event.remove, event.data])) + 40
        if event.snapshot:
            neighbour.synced = False
            neighbour.receiving = {c: set() for c in CLASSES}
            if neighbour.kind == "internal":
                linked = event.data.get("gw", {})
                if isinstance(linked, dict) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in linked.items()
                ):
                    self._check_gateways(neighbour, linked)
        receiving = neighbour.receiving
        if receiving is not None:
            receiving[kind].update(event.add)
            receiving[kind].difference_update(event.remove)
            if not more:
                neighbour.receiving = None
                self._replace(neighbour, receiving)
                neighbour.synced = True
                if self.dmr is not None:
                    self.dmr.sync_changed()
            return
        self._learn(neighbour, kind, event.add, event.remove)

    def _replace(self, neighbour: Neighbour, wanted: dict[str, set[str]]) -> None:
        for kind in CLASSES:
            now = neighbour.learned[kind]
            self._learn(neighbour, kind, wanted[kind] - now, now - wanted[kind])

    def _learn(
        self, neighbour: Neighbour, kind: str, add: Iterable[str], remove: Iterable[str]
    ) -> None:
        learned = neighbour.learned[kind]
        removed = [f for f in remove if f in learned]
        learned.difference_update(removed)
        added = [f for f in add if f not in learned]
        learned.update(added)
        # Judged where they are used (the link's interest, the waiting queue's
        # subscriptions); what either refuses is forgotten, counted and logged.
        refused = self._apply_link_interest(neighbour, added, removed)
        if kind in ("g", "fg"):
            refused |= self._apply_queue(neighbour, added, removed)
        if refused:
            learned.difference_update(refused)
            added = [f for f in added if f not in refused]
        if kind in _FOREIGN:  # passed on: a node's own interest
            if neighbour.kind == "internal":
                if not self.gateway:
                    return
                # ... to the other clusters (its cluster's aggregate).
                self._tell_gateways(
                    _combine(
                        self.to_gateways.add_many((kind, f) for f in added),
                        self.to_gateways.remove_many((kind, f) for f in removed),
                    )
                )
            else:
                # ... into this cluster, as another cluster's interest.
                foreign = _FOREIGN[kind]
                self._tell_cluster(
                    _combine(
                        self.to_cluster.add_many((foreign, f) for f in added),
                        self.to_cluster.remove_many((foreign, f) for f in removed),
                    )
                )

    def _apply_link_interest(
        self, neighbour: Neighbour, added: Iterable[str], removed: Iterable[str]
    ) -> set[str]:
        """Add and remove filters of :attr:`Neighbour.out`'s interest; return those it
        refused."""
        refused: set[str] = set()
        out = neighbour.out
        if out is None:
            return refused
        add = out.add_interest
        for topic_filter in added:
            try:
                if topic_filter.startswith("#"):
                    # A queue's name: what is sent to it goes by the waiting queue.
                    validate_queue_topic(topic_filter)
                else:
                    add(topic_filter)
            except (MeshbusError, TypeError, AttributeError) as exc:
                refused.add(topic_filter)
                self.bad_adverts += 1
                log.warning("dmr: %s wants %r: %s", neighbour.name, topic_filter, exc)
        for topic_filter in removed:
            if not neighbour.wants(topic_filter) and not topic_filter.startswith("#"):
                out.remove_interest(topic_filter)
        return refused

    def _apply_queue(
        self, neighbour: Neighbour, added: Iterable[str], removed: Iterable[str]
    ) -> set[str]:
        """Follow the guaranteed interest with the waiting queue's subscriptions; return
        the filters it refused."""
        refused: set[str] = set()
        guaranteed = self.vpn.node.guaranteed
        if guaranteed is None:
            return refused
        for topic_filter in added:
            try:
                guaranteed.add_subscription(neighbour.queue, topic_filter, vpn=self.vpn.name)
            except MeshbusError as exc:
                refused.add(topic_filter)
                log.warning(
                    "dmr: queue for %s cannot take %r: %s", neighbour.name, topic_filter, exc
                )
        for topic_filter in removed:
            if not neighbour.wants_guaranteed(topic_filter):
                guaranteed.remove_subscription(neighbour.queue, topic_filter, vpn=self.vpn.name)
        return refused

    # --- at most one external link between two clusters ----------------------------------

    @property
    def linked_clusters(self) -> dict[str, str]:
        """The other clusters this node links to (its external links still in use), each
        with the gateway it links to there."""
        return {
            n.peer.cluster: n.name
            for n in self.neighbours.values()
            if n.peer.cluster is not None and not n.refused
        }

    def _check_gateways(self, neighbour: Neighbour, linked: dict[str, str]) -> None:
        """``neighbour``, a node of this cluster, links to the clusters of ``linked``
        (each through the gateway named there): if it links to one this node links to
        too, the two clusters are joined twice (SPEC 8 allows one link). Each link is
        named by its two gateways, sorted; the one whose name sorts last is given up,
        which the gateways of both clusters decide alike."""
        me = self.dmr.node_name if self.dmr is not None else ""
        mine = self.linked_clusters
        for cluster in sorted(linked.keys() & mine.keys()):
            ours = tuple(sorted((me, mine[cluster])))
            theirs = tuple(sorted((neighbour.name, linked[cluster])))
            if ours == theirs:
                continue
            kept = min(ours, theirs)
            why = (
                f"a second external link between clusters "
                f"{self.dmr.cluster if self.dmr else '?'!r} and {cluster!r}: "
                f"{ours[0]}-{ours[1]} and {theirs[0]}-{theirs[1]}; only "
                f"{kept[0]}-{kept[1]} is used"
            )
            log.error("dmr: %s", why)
            self.conflicts.append(why)
            if ours != kept:
                for gateway in [n for n in self.neighbours.values() if n.peer.cluster == cluster]:
                    self.refuse(gateway, why)

    def remove_neighbour(self, neighbour: Neighbour, why: str) -> list[WireLink]:
        """Stop routing with ``neighbour`` for good (a reload of the configuration no
        longer lists it): forget what it wanted and the replies routed to it, and
        return its links for the caller to close. Its waiting queue stays, with what it
        holds, for the neighbour's return; it attracts nothing more."""
        neighbour.refused = why
        self._replace(neighbour, {c: set() for c in CLASSES})
        for topic in [t for t, (owner, _) in self._replies.items() if owner is neighbour]:
            del self._replies[topic]
            self._forget_reply(topic, neighbour)
        del self.neighbours[neighbour.name]
        self._cluster_queues.discard(neighbour.endpoint)
        self._gateway_queues.discard(neighbour.endpoint)
        return [link for link in (neighbour.out, neighbour.into) if link is not None]

    def refuse(self, neighbour: Neighbour, why: str) -> None:
        """Stop routing with ``neighbour``: forget what it wanted, stop the link to it and
        refuse the one it dials from now on (``why`` says so to it and in the logs)."""
        neighbour.refused = why
        self._replace(neighbour, {c: set() for c in CLASSES})
        if neighbour.out is not None:
            neighbour.out.stop(why)
        if neighbour.into is not None:
            neighbour.into.stop(why)

    # --- neighbours' links ---------------------------------------------------------------

    def _become_gateway(self) -> None:
        """The first external neighbour: from now on a summary for the gateways of other
        clusters is kept. Once routing runs it starts from what is wanted already, here
        and by this cluster's nodes (before routing runs, :meth:`start` builds it)."""
        self.gateway = True
        if self.dmr is None:
            return
        for (kind, topic_filter), n in self.local.items():
            for _ in range(n):
                self.to_gateways.add(kind, topic_filter)
        for other in self.neighbours.values():
            if other.kind == "internal":
                for kind in _FOREIGN:
                    for topic_filter in other.learned[kind]:
                        self.to_gateways.add(kind, topic_filter)

    def add_neighbour(self, neighbour: Neighbour) -> None:
        self.neighbours[neighbour.name] = neighbour
        if neighbour.kind == "external" and not self.gateway:
            self._become_gateway()
        (self._cluster_queues if neighbour.kind == "internal" else self._gateway_queues).add(
            neighbour.endpoint
        )

    def link_pipeline(self, neighbour: Neighbour, link: Link, pipeline: LinkPipeline) -> None:
        """The stages of a link to or from ``neighbour``."""
        if link is neighbour.out:
            # Messages from a node of this cluster go no further inside it; messages
            # from another cluster go to no other cluster.
            came_from = self.from_cluster if neighbour.kind == "internal" else self.from_gateways
            pipeline.add_egress(
                "dmr.one_hop", lambda envelope: envelope.origin not in came_from, reason="transit"
            )
            reachable = neighbour

            def up(envelope: Envelope) -> bool:
                return reachable.reachable

            pipeline.add_egress("dmr.reachable", up, reason="unreachable")
        else:
            learn = self.learn_reply_route

            def replies(envelope: Envelope) -> bool:
                if envelope.message.reply_to is not None:
                    learn(neighbour, envelope.message.reply_to)
                return True

            pipeline.add_ingress("dmr.replies", replies)

    def into_opened(self, neighbour: Neighbour, link: WireLink) -> None:
        """``neighbour`` dialled this node: tell it everything, bind its waiting queue
        for this node, and dial it back now if this node's own link was waiting."""
        (self.from_cluster if neighbour.kind == "internal" else self.from_gateways).add(link)
        link.keeps_out = (
            self._cluster_queues.__contains__
            if neighbour.kind == "internal"
            else self._gateway_queues.__contains__
        )
        neighbour.into = link
        neighbour.node_id = link.peer_node
        self.send_snapshot(neighbour)
        if self.vpn.node.guaranteed is not None and self.dmr is not None:
            link.pull(QUEUE_PREFIX + self.dmr.node_name, window=self.dmr.settings.window)
        out = neighbour.out
        if out is not None:
            out.retry_now()

    def into_closed(self, neighbour: Neighbour, link: WireLink) -> None:
        self.from_cluster.discard(link)
        self.from_gateways.discard(link)
        if neighbour.into is link:
            neighbour.into = None

    def out_opened(self, neighbour: Neighbour) -> None:
        neighbour.synced = False
        neighbour.receiving = None

    # --- replies to the requester's node ---------------------------------------------

    def learn_reply_route(self, neighbour: Neighbour, topic: str) -> None:
        """A request from ``neighbour`` asks for replies on ``topic``: route that topic
        to it for a while, whether or not its subscription reached this node yet."""
        dmr = self.dmr
        if dmr is None:
            return
        routes = self._replies
        now = self.vpn.node.clock.monotonic()
        known = routes.get(topic)
        if known is not None and known[0] is neighbour:
            routes.move_to_end(topic)
            routes[topic] = (neighbour, now + dmr.settings.reply_ttl)
        else:
            if known is not None:
                self._forget_reply(topic, known[0])
            if not _valid(topic):
                return
            routes[topic] = (neighbour, now + dmr.settings.reply_ttl)
            neighbour.replies.add(topic)
            out = neighbour.out
            if out is not None:
                with contextlib.suppress(MeshbusError):  # counted as a bad filter: no route
                    out.add_interest(topic)
        while routes:
            first, (owner, until) = next(iter(routes.items()))
            if until > now and len(routes) <= dmr.settings.reply_routes:
                break
            del routes[first]
            self._forget_reply(first, owner)

    def _forget_reply(self, topic: str, neighbour: Neighbour) -> None:
        neighbour.replies.discard(topic)
        out = neighbour.out
        if out is not None and not neighbour.wants(topic):
            out.remove_interest(topic)

    # --- reporting -----------------------------------------------------------------------

    @property
    def in_sync(self) -> bool:
        """Whether every reachable neighbour's interest is here."""
        return all(n.settled for n in self.neighbours.values())

    def statistics(self) -> dict[str, Any]:
        """Interest table sizes and each neighbour's links and counters."""
        return {
            "in_sync": self.in_sync,
            "local_interest": len(self.local),
            "advertised_to_cluster": self.to_cluster.advertised_count,
            "advertised_to_gateways": self.to_gateways.advertised_count,
            "reply_routes": len(self._replies),
            "bad_advertisements": self.bad_adverts,
            "conflicts": list(self.conflicts),
            "neighbours": {n: nb.statistics() for n, nb in sorted(self.neighbours.items())},
        }


def _valid(topic_filter: object) -> bool:
    if not isinstance(topic_filter, str):
        return False
    try:
        if topic_filter.startswith(QUEUE_TOPIC_PREFIX):  # a queue's name, as interest
            validate_queue_topic(topic_filter)
        else:
            parse_subscription(topic_filter)
    except MeshbusError:
        return False
    return True


def _combine(first: Change, second: Change) -> Change:
    return first[0] + second[0], first[1] + second[1]
