"""A bridge: one VPN of this node joined to a VPN elsewhere, with topic mapping (SPEC 7).

:func:`open_bridge` makes one from :class:`BridgeSettings`. Its link is a
:class:`~meshbus.transports.WireLink` that dials the remotes in connect order, or,
without remotes, a :class:`~meshbus.LocalLink` pair to another VPN of the same node.
What crosses, and under what name:

* **SUB** (remote to local): the bridge's ``subscriptions`` and the filters of its
  ``SUB`` mappings are asked of the remote VPN; what comes in goes through the SUB
  mappings (the first that matches renames or excludes it; a plain subscription
  keeps the topic).
* **PUB** (local to remote): the filters of the ``PUB`` mappings attract local
  messages, which go out under their mapped names.

A message a mapping stops is counted on the link (``excluded``,
``topic_too_short``). The bridge's link counts hops (plugin ``hopcount``, with the
bridge's ``hop_count_limit``) and de-duplicates by origin unless told not to.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
import attrs

from meshbus import (
    ConfigurationError,
    Envelope,
    Link,
    LinkPipeline,
    LinkState,
    LinkStatistics,
    LocalLink,
    Node,
    StashKey,
    Vpn,
    make_message,
)
from meshbus.plugins.hopcount import SETTINGS as HOP_SETTINGS
from meshbus.plugins.hopcount import HopCountSettings
from meshbus.transports import (
    Backoff,
    ConnectSettings,
    TlsSettings,
    WireLink,
    validate_compression,
)

from ._local_pull import pull_local
from ._mapping import NO_MATCH, Mapped, TopicMapper, TopicMapping, directions, listed

__all__ = ["CARRIES", "Bridge", "BridgeSettings", "bridges", "open_bridge", "partner_of", "totals"]

log = logging.getLogger("meshbus.bridge")


def _name(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value or "/" in value:
        raise ValueError(f"a bridge needs a name without '/', got {value!r}")


def _remotes(value: Iterable[Any] | str) -> tuple[Any, ...]:
    # One URL alone is one remote, as ConnectSettings takes it.
    return (value,) if isinstance(value, str) else listed(value, "remotes")


def _filters(value: Iterable[str]) -> tuple[str, ...]:
    return listed(value, "subscriptions")


def _queues(value: Iterable[str]) -> tuple[str, ...]:
    return listed(value, "queues")


def _mappings(value: Iterable[TopicMapping]) -> tuple[TopicMapping, ...]:
    return listed(value, "topics")


def _variables(value: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError(f"variables must be a mapping of names to values, got {value!r}")
    return dict(value)


def _hop_limit(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be an int >= 1, got {value!r}")


def _window(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65_535:
        raise ValueError(f"must be an int from 1 to 65535, got {value!r}")


def _check_compression(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    validate_compression(value)


def _seconds(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"must be a positive number of seconds, got {value!r}")


@attrs.frozen
class BridgeSettings:
    """What a bridge joins and what crosses it (SPEC 7)."""

    name: str = attrs.field(validator=_name)
    """Unique among the VPN's bridges; also ``${bridge.name}`` in mappings."""
    remote_vpn: str = "default"
    """The VPN at the other end."""
    remotes: tuple[Any, ...] = attrs.field(default=(), converter=_remotes)
    """Where the remote node is, tried in connect order: URLs (``tcp://host:port``,
    ``tls://...``) or connectables (a :class:`~meshbus.transports.MemoryNetwork`'s),
    each alone or in a :class:`~meshbus.transports.Remote` with a username, password,
    TLS settings and compression of its own (one URL may be given alone); none:
    ``remote_vpn`` is a VPN of this node, joined in-process."""
    username: str | None = None
    """Who the bridge logs in as (its client profile must allow bridge connections)."""
    password: str | None = attrs.field(default=None, repr=False)
    """Its password (basic authentication)."""
    tls: TlsSettings | None = None
    """TLS settings for ``tls://`` remotes (a client certificate authenticates)."""
    compression: bool | str = attrs.field(default=False, validator=_check_compression)
    """Compress the connection: ``True`` (the best algorithm both ends have), or the
    name of one (``"lz4"``, ``"zlib"``)."""
    subscriptions: tuple[str, ...] = attrs.field(default=(), converter=_filters)
    """Filters asked of the remote VPN whose messages cross under their own topics."""
    queues: tuple[str, ...] = attrs.field(default=(), converter=_queues)
    """Queues of the remote VPN to bind a flow to: each message they deliver is spooled
    to every matching local endpoint in one commit before it is acknowledged there;
    one an endpoint refuses is tried again every second and holds up only its flow.
    Without ``remotes``, the queues of the other VPN of this node."""
    window: int = attrs.field(default=255, validator=_window)
    """Messages each of those flows may have unacknowledged."""
    topics: tuple[TopicMapping, ...] = attrs.field(default=(), converter=_mappings)
    """Topic mappings, both directions (each says its ``mode``)."""
    variables: Mapping[str, str] = attrs.field(factory=dict, converter=_variables)
    """Values for ``${name}`` in destination templates (``bridge.name`` is given)."""
    loop_prevention: bool = True
    """Count hops and drop a message above ``hop_count_limit`` (SPEC 9)."""
    hop_count_limit: int = attrs.field(default=1, validator=_hop_limit)
    """The most bridges a message may cross."""
    dedup: bool = True
    """Drop a message whose origin the VPN saw within the origin window (SPEC 7)."""
    backoff: Backoff | None = None
    """Delays between reconnects (default: 1 s doubling to 2 min, with jitter)."""
    fail_back: bool = True
    """While connected to a remote other than the first, move back to a better-ordered
    one once it takes the login again."""
    fail_back_interval: float = attrs.field(default=30.0, validator=_seconds)
    """Seconds between attempts to reach the better-ordered remotes."""
    drain_timeout: float = attrs.field(default=5.0, validator=_seconds)
    """Seconds the bridge's connection may take, as it closes (the bridge or its node
    stops, a reload reopens it), to write what it had taken for the remote; then it is
    cut. A slow link to a far remote may want more."""
    mqtt: Any = None
    """For ``mqtt://`` and ``mqtts://`` remotes (external MQTT brokers): a
    :class:`~meshbus.plugins.mqtt.MqttBridgeOptions` (a mapping of its fields is
    taken too); ``None``: its defaults."""


class Bridge:
    """A running bridge: its link, its mappings and their counters.

    Made by :func:`open_bridge`; read :attr:`state`, wait with :meth:`wait_for`,
    change the remote subscriptions while it runs, :meth:`stop` it.
    """

    def __init__(self, vpn: Vpn, settings: BridgeSettings) -> None:
        self.vpn = vpn
        self.settings = settings
        variables = {**settings.variables, "bridge.name": settings.name}
        self._variables = variables
        self._subscriptions: dict[str, None] = dict.fromkeys(settings.subscriptions)
        try:
            self.pub, self.sub = directions(
                settings.topics,
                variables,
                subscriptions=self._subscriptions,
                limits=vpn.topic_limits,
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"bridge {settings.name!r}: {exc}", exc.problems) from None
        #: Its link: a WireLink to the remote node, or this end of a LocalLink pair.
        self.link: Link
        self._far: LocalLink | None = None
        self._pulls: list[anyio.CancelScope] = []  # a same-node bridge's flows, one each
        self._stopped = False
        #: The connection of the other bridge of a pair that this one rides on (its own
        #: link is ``reusing`` meanwhile), if any.
        self.carrier: WireLink | None = None
        #: Why this bridge does not share a connection with the other of its pair
        #: (``""``: it does, or it has found none).
        self.pairing = ""
        self.hops = HopCountSettings(
            enabled=settings.loop_prevention, hop_count_limit=settings.hop_count_limit
        )

    def _sub_mapper(self) -> TopicMapper:
        return directions(
            self.settings.topics,
            self._variables,
            subscriptions=self._subscriptions,
            limits=self.vpn.topic_limits,
        )[1]

    # --- what the bridge asks of the remote ------------------------------------------

    @property
    def wants(self) -> tuple[str, ...]:
        """Every filter asked of the remote VPN: the SUB mappings' and the subscriptions."""
        return self.sub.filters

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """The remote subscriptions (topics kept), as changed while running."""
        return tuple(self._subscriptions)

    def add_subscription(self, topic_filter: str) -> None:
        """Ask the remote VPN for ``topic_filter`` too (topics kept)."""
        if topic_filter in self._subscriptions:
            return
        self._subscriptions[topic_filter] = None
        try:
            self.sub = self._sub_mapper()
        except ConfigurationError:
            del self._subscriptions[topic_filter]
            raise
        self._want(topic_filter)

    def remove_subscription(self, topic_filter: str) -> None:
        """Stop asking the remote VPN for ``topic_filter``."""
        if topic_filter not in self._subscriptions:
            return
        del self._subscriptions[topic_filter]
        self.sub = self._sub_mapper()
        if topic_filter not in self.sub.filters:
            self._unwant(topic_filter)

    def _want(self, topic_filter: str) -> None:
        if isinstance(self.link, WireLink) or hasattr(self.link, "want"):
            self.link.want(topic_filter)  # kept for when it dials again
            if self.carrier is not None:
                self.carrier.want(topic_filter)
        elif self._far is not None:
            self._far.add_interest(topic_filter)

    def _unwant(self, topic_filter: str) -> None:
        if isinstance(self.link, WireLink) or hasattr(self.link, "unwant"):
            self.link.unwant(topic_filter)
            if self.carrier is not None:
                self.carrier.unwant(topic_filter)
        elif self._far is not None:
            self._far.remove_interest(topic_filter)

    # --- a bi-directional pair on one connection (SPEC 7) -------------------------------

    @property
    def uses_tls(self) -> bool:
        """Whether the bridge's settings ask for TLS (a ``tls`` setting or ``tls://``)."""
        link = self.link
        return isinstance(link, WireLink) and link.settings is not None and link.settings.uses_tls

    def partner(self, link: Link) -> bool:
        """Whether ``link``, accepted from a peer node, is the other bridge of this one's
        pair: same bridge name, each VPN the other's remote VPN, the node this bridge
        dials (once known). A partner whose TLS setting differs is not: the reason is
        kept in :attr:`pairing` and logged."""
        login = getattr(link, "peer_login", None)
        if login is None or link.kind != "bridge" or not self.settings.remotes:
            return False
        if login.name != f"bridge/{self.settings.name}" or login.vpn != self.settings.remote_vpn:
            return False
        known = self.link.peer_node
        if known is not None and known != login.node:
            return False
        if login.tls is not None and login.tls != self.uses_tls:
            mine, theirs = ("uses", "does not") if self.uses_tls else ("does not use", "does")
            self.pairing = (
                f"two connections: this bridge {mine} TLS and the one of node {login.node} {theirs}"
            )
            log.info("bridge %r: %s", self.settings.name, self.pairing)
            return False
        return True

    def ride(self, carrier: WireLink) -> None:
        """Carry this bridge over ``carrier``, the connection the other bridge of the pair
        opened: ask for its subscriptions and queues there, send its PUB messages there,
        and close its own connection until ``carrier`` goes (state ``reusing``)."""
        own = self.link
        assert isinstance(own, WireLink)
        self.carrier = carrier
        self.pairing = ""
        for topic_filter in self.wants:
            carrier.want(topic_filter)
        for queue in self.settings.queues:
            carrier.pull(queue, window=self.settings.window)
        for topic_filter in self.pub.filters:
            carrier.add_interest(topic_filter)
        own.suspend(f"reusing the connection node {carrier.peer_node} opened")

    def dismount(self, carrier: WireLink) -> None:
        """``carrier`` went down: dial again."""
        if self.carrier is carrier:
            self.carrier = None
            own = self.link
            assert isinstance(own, WireLink)
            own.resume()

    # --- state ------------------------------------------------------------------------

    @property
    def state(self) -> LinkState:
        """The state of the bridge's link."""
        return self.link.state

    async def wait_for(self, *states: LinkState) -> LinkState:
        """Wait until the link is in one of ``states`` (see :meth:`Link.wait_for`)."""
        return await self.link.wait_for(*states)

    async def _pull_local(self, queue: str) -> None:
        """Same-node bridges: move ``queue``'s messages from the other VPN, until stopped."""
        assert isinstance(self.link, LocalLink)
        assert self._far is not None
        if self._stopped:
            return
        scope = anyio.CancelScope()
        self._pulls.append(scope)
        with scope:
            await pull_local(self.link, self._far, queue, self.settings.window)

    def stop(self, reason: str = "stopped") -> None:
        """Close the bridge for good. A connection the other bridge of its pair opened
        and this one rides is closed too: it carries this bridge's subscriptions and
        stages, and the other node dials again for a connection of its own (or for the
        bridge that replaces this one to ride)."""
        self._stopped = True
        for scope in self._pulls:
            scope.cancel()
        carrier, self.carrier = self.carrier, None
        if carrier is not None:
            carrier.stop(f"bridge {self.settings.name!r} that rode it stopped: {reason}")
        link = self.link
        if isinstance(link, (WireLink, LocalLink)) or hasattr(link, "stop"):
            link.stop(reason)

    async def aclose(self, reason: str = "stopped") -> None:
        """:meth:`stop` the bridge, and return once its connection has closed (what its
        link had taken for the remote written first, as a link's ``aclose`` does)."""
        self.stop(reason)
        await self.link.aclose(reason)

    def statistics(self) -> LinkStatistics:
        """The counters of the bridge's link (SPEC 7): connects, connect failures,
        disconnects, forwarded, forward failures, received, receive failures, drops by
        reason (``excluded``, ``topic_too_short``, ``hop_limit``, ``duplicate``,
        ``no_local``, ``no_eligible_destination``) and its state. For a same-node
        bridge, what comes in is counted on the other VPN's end, added here; for one
        riding the connection of the other bridge of its pair, that connection's
        counters are added (it carries both bridges)."""
        own = self.link.statistics()
        far = self._far if self._far is not None else self.carrier
        if far is None:
            return own
        other = far.statistics()
        dropped = dict(own.dropped)
        for reason, n in other.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + n
        if far is self._far:
            return attrs.evolve(
                own,
                forwarded=own.forwarded + other.forwarded,
                forward_failures=own.forward_failures + other.forward_failures,
                dropped=dropped,
            )
        latency = dict(own.forward_latency)
        for bucket, n in other.forward_latency.items():
            latency[bucket] = latency.get(bucket, 0) + n
        return attrs.evolve(
            own,
            forwarded=own.forwarded + other.forwarded,
            forward_failures=own.forward_failures + other.forward_failures,
            received=own.received + other.received,
            receive_failures=own.receive_failures + other.receive_failures,
            dropped=dropped,
            forward_latency=latency,
        )

    def __repr__(self) -> str:
        return f"<Bridge {self.settings.name!r} vpn={self.vpn.name!r} {self.state.value}>"

    # --- stages -------------------------------------------------------------------------

    def stages(self, pipeline: LinkPipeline, link: Link) -> None:
        """The mapping stages of ``link`` (the bridge's own, or the connection of the
        other bridge of its pair that it rides on), added when it is attached; a message
        they stop is counted on it as ``excluded`` or ``topic_too_short``. What no
        mapping of the direction takes crosses as it is: the other side asked for it
        (a two-way pair riding the same connection)."""
        apply = self._apply
        if self.pub:
            pipeline.add_egress("topic-mapping", lambda e: apply(self.pub, e, link), reason="")

        def sub(envelope: Envelope) -> bool:
            # The mapper changes with the remote subscriptions: read it each time. With
            # only plain subscriptions, only a retained message can change (it may lose
            # its flag), so the others, most of them, skip the lookup.
            mapper = self.sub
            if mapper.keeps_topics and not envelope.message.options.retain:
                return True
            return apply(mapper, envelope, link)

        pipeline.add_ingress("topic-mapping", sub, reason="")

    def _apply(self, mapper: TopicMapper, envelope: Envelope, link: Link) -> bool:
        message = envelope.message
        result = mapper.map(message.topic)
        if result is NO_MATCH:
            return True
        if type(result) is not Mapped:
            link.count_drop(result.reason)  # type: ignore[union-attr]
            return False
        if message.options.retain and not result.preserve_retained:
            # The other side gets it as a plain message: not kept there (SPEC 7, 12).
            envelope.message = message.evolve(topic=result.topic, retain=False)
        elif result.topic != message.topic:
            envelope.message = make_message(
                result.topic,
                message.payload,
                message.sender,
                message.timestamp,
                message.options,
                message.origin,
                message.hop_count,
            )
        return True


BRIDGE = StashKey[Bridge]()
"""The bridge a link belongs to, in ``link.stash``."""


def open_bridge(vpn: Vpn, settings: BridgeSettings) -> Bridge:
    """Start a bridge from ``vpn`` (the node must be running).

    :raises ConfigurationError: the mappings are wrong (every problem listed), the VPN
        has a link of that name, or a same-node remote VPN does not exist.
    """
    if vpn.node.plugins.get("bridge") is None:
        raise ConfigurationError(
            f"bridge {settings.name!r}: the node does not load plugin 'bridge', whose "
            "stages map the bridge's topics"
        )
    bridge = Bridge(vpn, settings)
    hops = bridge.hops
    name = f"bridge/{settings.name}"
    link: Link
    if settings.remotes and _to_mqtt(settings.remotes):
        from ._mqtt import open_mqtt_link

        link = open_mqtt_link(vpn, bridge, name)
    elif settings.remotes:
        connect = ConnectSettings(
            settings.remotes,
            vpn=settings.remote_vpn,
            username=settings.username,
            password=settings.password,
            tls=settings.tls,
            compression=settings.compression,
            backoff=settings.backoff,
            clock=vpn.node.clock,
        )
        wire = WireLink(
            vpn,
            name,
            kind="bridge",
            settings=connect,
            dedup=settings.dedup,
            fail_back=settings.fail_back_interval if settings.fail_back else None,
            drain_timeout=settings.drain_timeout,
        )
        for topic_filter in bridge.wants:
            wire.want(topic_filter)
        for queue in settings.queues:
            wire.pull(queue, window=settings.window)
        link = wire
    else:
        why = same_node_refusal(vpn, settings)
        if why:
            raise ConfigurationError(f"bridge {settings.name!r}: {why}")
        far_vpn = vpn.node.vpn(settings.remote_vpn)
        link, far = LocalLink.pair(
            vpn, far_vpn, name, far_name=f"bridge/{vpn.name}/{settings.name}", dedup=settings.dedup
        )
        far.stash[HOP_SETTINGS] = hops
        bridge._far = far
    link.stash[BRIDGE] = bridge
    link.stash[HOP_SETTINGS] = hops
    bridge.link = link
    vpn.links.attach(link)
    if isinstance(link, WireLink) or hasattr(link, "run"):
        vpn.node.task_group.start_soon(link.run, name=f"meshbus bridge {settings.name}")
    else:
        assert bridge._far is not None
        bridge._far.vpn.links.attach(bridge._far)
        for topic_filter in bridge.wants:
            bridge._far.add_interest(topic_filter)
        for queue in settings.queues:
            vpn.node.task_group.start_soon(bridge._pull_local, queue)
    return bridge


def same_node_refusal(vpn: Vpn, settings: BridgeSettings) -> str:
    """Why a bridge without remotes cannot join ``vpn`` to the other VPN its settings
    name (``""``: it can). It logs in there as ``username`` (``"default"`` unless
    set), as a remote bridge would, though without a password (both VPNs are this
    node's): the username must be enabled and its client profile must allow bridge
    connections (SPEC 7)."""
    far = vpn.node.vpns.get(settings.remote_vpn)
    if far is None or far is vpn:
        return (
            f"the node has no other VPN {settings.remote_vpn!r} (a bridge without remotes "
            "joins two VPNs of this node)"
        )
    name = settings.username or "default"
    user = far.users.get(name)
    if user is None and far.authentication == "none":
        user = far.users["default"]  # as a login with an unknown username there
    if user is None:
        return f"VPN {far.name!r} has no username {name!r} for the bridge to log in as"
    if not user.enabled:
        return f"username {name!r} of VPN {far.name!r} is disabled"
    profile = far.client_profiles.get(user.client_profile)
    if profile is None or not profile.allow_bridge_connections:
        return (
            f"VPN {far.name!r} refuses bridges: the client profile {user.client_profile!r} "
            f"of username {user.name!r} does not allow bridge connections"
        )
    return ""


def _to_mqtt(remotes: tuple[Any, ...]) -> bool:
    """Whether the remotes are MQTT brokers (all of them; a mix is refused)."""
    from meshbus.plugins.mqtt import is_mqtt_url

    kinds = {is_mqtt_url(r) for r in remotes}
    if len(kinds) > 1:
        raise ConfigurationError("a bridge's remotes are all MQTT brokers or all meshbus nodes")
    return kinds == {True}


CARRIES = StashKey[Bridge]()
"""The bridge whose pair partner's connection a link is (in the accepted link's stash)."""


def partner_of(link: Link) -> Bridge | None:
    """The bridge of ``link``'s VPN whose pair partner opened ``link``, if any."""
    if link.stash.get(BRIDGE, None) is not None:
        return None
    for bridge in bridges(link.vpn):
        if bridge.partner(link):
            return bridge
    return None


def _pub_interest(bridge: Bridge) -> None:
    """The PUB mappings' filters attract local messages (again after each reconnect:
    a link forgets its interest when its connection goes down)."""
    for topic_filter in bridge.pub.filters:
        bridge.link.add_interest(topic_filter)


def bridges(vpn: Vpn) -> list[Bridge]:
    """The VPN's bridges."""
    return [b for link in vpn.links if (b := link.stash.get(BRIDGE, None)) is not None]


def totals(node: Node) -> dict[str, int]:
    """The counters of all the node's bridges added up (drops as ``dropped.REASON``,
    the forward latency histogram as ``forward_latency.BUCKET``)."""
    total: dict[str, int] = {}
    for vpn in node.vpns.values():
        for bridge in bridges(vpn):
            stats = bridge.statistics()
            for key in (
                "connects",
                "connect_failures",
                "disconnects",
                "forwarded",
                "forward_failures",
                "received",
                "receive_failures",
            ):
                total[key] = total.get(key, 0) + getattr(stats, key)
            for reason, n in stats.dropped.items():
                key = f"dropped.{reason}"
                total[key] = total.get(key, 0) + n
            for bucket, n in stats.forward_latency.items():
                key = f"forward_latency.{bucket}"
                total[key] = total.get(key, 0) + n
    return total
