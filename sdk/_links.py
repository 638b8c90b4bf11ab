"""Links: paths for messages between a VPN of this node and a VPN elsewhere (SPEC 7-9).

A :class:`Link` is one such path, whatever carries it: a connection in link mode to
another node, a bridge between two VPNs of one node, an MQTT bridge. Plugins decide
*which* links exist and *what* they carry (bridges, dynamic message routing); the core
owns what every link shares, so it is written once:

* the **link router** of each VPN (:class:`LinkRouter`) holds the interest of every link
  (the filters its peer wants) in one :class:`~meshbus.SubscriptionIndex` and sends each
  published message once over each link with matching interest, never back over the
  link it came in on;
* **stages** (plain functions of an :class:`~meshbus.Envelope`, contributed through
  :func:`~meshbus.hookspecs.meshbus_link_pipeline`) filter and change what goes out over
  a link and what comes in from it; a stage that drops a message counts it under its
  reason;
* **origin de-duplication** (:class:`OriginFilter`): every message that crosses a link
  carries its origin, and a VPN drops one whose origin it has seen within a window, so
  any graph of links delivers a publish at most once per subscriber;
* a link's **state** (:class:`LinkState`), readable and awaitable, and its statistics.

Nothing here awaits or calls a hook per message.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import anyio
import attrs

from ._crossing import as_direct, restamped, with_origin
from ._index import SubscriptionIndex
from ._messages import DeliveryMode, Envelope, Message
from ._origins import COPY_SEEN, NEW, SEEN, OriginFilter
from ._stash import Stash
from ._stats import LatencyHistogram
from ._topics import (
    QUEUE_TOPIC_PREFIX,
    parse_subscription,
    validate_queue_topic,
    validate_topic,
    wildcard_levels,
)
from .errors import (
    AccessDeniedError,
    ConfigurationError,
    InvalidTopicError,
    LimitExceededError,
    PluginError,
    PublishRejectedError,
    StateError,
)

if TYPE_CHECKING:
    from ._acl import AclChecker
    from ._profiles import ClientProfile
    from ._vpn import Vpn

__all__ = [
    "Link",
    "LinkPipeline",
    "LinkRouter",
    "LinkState",
    "LinkStatistics",
    "OriginFilter",
    "Stage",
]

Stage = Callable[[Envelope], bool]
"""A link stage: ``stage(envelope) -> bool``; ``False`` drops the message (counted)."""


class LinkState(enum.Enum):
    """Where a link is in its life (SPEC 7)."""

    CONNECTING = "connecting"
    """Opening its connection (or waiting for the peer to)."""
    SYNCING = "syncing"
    """Connected; telling the peer what it wants (subscriptions, interest)."""
    IN_SYNC = "in-sync"
    """Connected, and the peer knows everything it should: messages flow."""
    REUSING = "reusing"
    """Riding another link's connection (the two sides of a bi-directional pair)."""
    BACKOFF = "backoff"
    """The connection failed; waiting before the next attempt."""
    DISABLED = "disabled"
    """Stopped for good (removed, or its node is stopping)."""


@attrs.frozen
class LinkStatistics:
    """Counters of one link since it was made."""

    name: str
    """The link's name."""
    kind: str
    """What kind of link it is (``"bridge"``, ...)."""
    state: LinkState
    """Its state now."""
    peer_node: str | None
    """The node id of its peer, once it is known."""
    connects: int
    """Times its connection came up."""
    connect_failures: int
    """Attempts to connect that failed."""
    disconnects: int
    """Times its connection went down."""
    forwarded: int
    """Messages sent over it."""
    forward_failures: int
    """Messages that should have gone over it and could not (down, or its buffer full)."""
    received: int
    """Messages that came in over it and were taken."""
    receive_failures: int
    """Messages that came in over it and were refused (retransmitted by the peer)."""
    dropped: Mapping[str, int]
    """Messages dropped by reason: ``no_local``, ``duplicate``, and the reasons of the
    stages plugins add (``hop_limit``, ``excluded``, ``no_eligible_destination`` ...)."""
    interest: int
    """Filters the peer wants from this side."""
    forward_latency: Mapping[str, int] = attrs.field(factory=dict)
    """How long forwarded messages waited in the link before they were written to its
    connection, by bucket (see :class:`~meshbus.LatencyHistogram`); empty for a link
    that hands messages over at once (a :class:`~meshbus.LocalLink`)."""


class LinkPipeline:
    """Collects a link's stages during :func:`~meshbus.hookspecs.meshbus_link_pipeline`.

    Egress stages see each message about to go out over the link, ingress stages each
    message that came in over it, in the order they were added. A stage may change the
    envelope (replace ``envelope.message`` with a new message, set
    ``envelope.hop_count``) and returns whether the message goes on; a message a stage
    stops is counted in the link's statistics under the stage's ``reason``.
    """

    def __init__(self) -> None:
        self._egress: dict[str, tuple[Stage, str]] = {}
        self._ingress: dict[str, tuple[Stage, str]] = {}

    def add_egress(self, name: str, stage: Stage, *, reason: str | None = None) -> None:
        """Add a stage for messages going out over the link.

        :param name: unique among the link's egress stages (a plugin's name is a good choice).
        :param reason: what a drop is counted as (default: ``name``); ``""``: the stage
            counts its own drops, under reasons of its choosing (:meth:`Link.count_drop`).
        """
        self._add(self._egress, name, stage, reason)

    def add_ingress(self, name: str, stage: Stage, *, reason: str | None = None) -> None:
        """Add a stage for messages coming in over the link (see :meth:`add_egress`)."""
        self._add(self._ingress, name, stage, reason)

    @staticmethod
    def _add(
        stages: dict[str, tuple[Stage, str]], name: str, stage: Stage, reason: str | None
    ) -> None:
        if name in stages:
            raise PluginError(f"a link stage named {name!r} is already in the pipeline", name)
        if not callable(stage):
            raise PluginError(f"link stage {name!r} is not callable: {stage!r}", name)
        stages[name] = (stage, name if reason is None else reason)

    @property
    def egress(self) -> tuple[str, ...]:
        """Egress stage names, in call order."""
        return tuple(self._egress)

    @property
    def ingress(self) -> tuple[str, ...]:
        """Ingress stage names, in call order."""
        return tuple(self._ingress)


_LINK_TYPES: set[type] = set()  # every subclass of Link, for a quick "is it a link?"
_DIRECT = DeliveryMode.DIRECT


class Link(ABC):
    """One path for messages between a VPN of this node and a VPN elsewhere.

    Subclasses carry messages (:meth:`send`, and whatever brings messages in, which
    calls :meth:`receive` or :meth:`receive_guaranteed`); the base class does what
    every link shares: stages, interest, de-duplication, state and counters. A link
    is made by whatever owns it (a transport, a plugin) and joins its VPN with
    ``vpn.links.attach(link)``.

    :param vpn: the local VPN.
    :param name: unique among the VPN's links.
    :param kind: what kind of link it is (``"bridge"``, ``"internal"``, ``"external"``,
        ``"mqtt"`` or a plugin's own).
    :param dedup: drop messages whose origin the VPN saw recently (SPEC 7).
    :param endpoint: the local endpoint (queue) whose messages this link carries as
        guaranteed messages, if any: the link router does not send a guaranteed
        message as a direct copy over a link whose endpoint already holds it.
    :param acl: the publish and subscribe rules of the identity the peer logged in as,
        for links a peer opened to this node; ``None`` trusts the peer (links this node
        opened, by its own configuration).
    :param profile: the client profile of that identity, whose ``max_subscriptions``
        and ``max_wildcard_levels`` bound the peer's interest as they bound a session's
        subscriptions; ``None``: no bound.
    """

    def __init__(
        self,
        vpn: Vpn,
        name: str,
        kind: str,
        *,
        dedup: bool = True,
        endpoint: str | None = None,
        acl: AclChecker | None = None,
        profile: ClientProfile | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a link needs a non-empty name, got {name!r}")
        self.vpn = vpn
        self.name = name
        self.kind = kind
        self.dedup = dedup
        self.endpoint = endpoint
        self.acl = acl
        #: Keep the peer's interest when the connection goes down (until the peer tells
        #: it again), so that what it would have been sent is counted as not sent
        #: instead of matching nothing. Routing plugins whose peers re-advertise
        #: everything when they return set it.
        self.keeps_interest = False
        #: Local endpoints that guaranteed messages coming in over this link are never
        #: spooled to, besides its own ``endpoint`` (a routing plugin keeping a message
        #: from travelling on); ``None``: only its own.
        self.keeps_out: Callable[[str], bool] | None = None
        #: Whose limits the peer's interest is held to (``max_subscriptions``,
        #: ``max_wildcard_levels``): the profile of the user the peer logged in as.
        self.profile = profile
        self._wildcard_levels = 0
        #: The peer's node id and cluster, known once the link's connection is up.
        self.peer_node: str | None = None
        self.peer_cluster: str | None = None
        #: Why the link is in its state (the last failure, a refusal), for people.
        self.reason = ""
        self._state = LinkState.CONNECTING
        self._state_changed: anyio.Event | None = None
        self._interest: dict[str, None] = {}
        self._egress: tuple[tuple[Stage, str], ...] = ()
        self._ingress: tuple[tuple[Stage, str], ...] = ()
        self._admitted: dict[str, None] = {}  # topics the peer may publish (acl)
        self._seen = vpn.links.origins.check  # bound once: it runs for every message
        self.attached = False
        self.connects = 0
        self.connect_failures = 0
        self.disconnects = 0
        self.forwarded = 0
        self.forward_failures = 0
        self.received = 0
        self.receive_failures = 0
        self.dropped: dict[str, int] = {}
        #: How long forwarded messages waited before they went out (a link that queues
        #: them fills it).
        self.forward_latency = LatencyHistogram()
        # Plugins' settings and state for this link (documented in the API reference).
        self.stash = Stash()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        _LINK_TYPES.add(cls)

    def __repr__(self) -> str:
        kind = type(self).__name__
        return f"<{kind} {self.name!r} {self.kind} vpn={self.vpn.name!r} {self._state.value}>"

    # --- what subclasses provide -----------------------------------------------------

    @abstractmethod
    def send(self, envelope: Envelope) -> bool:
        """Queue ``envelope.message`` for the peer, with ``envelope.hop_count``; never
        block. Return ``False`` when it cannot be sent (down, or the buffer is full).

        The envelope is reused after the call: keep what is needed, not the envelope.
        """

    def attached_to_vpn(self) -> None:  # noqa: B027 (a hook: doing nothing is the default)
        """Called once the link joined its VPN (a subclass may come up here)."""

    async def aclose(self, reason: str = "stopped") -> None:
        """Close the link for good and return once it is closed. Its node calls this for
        each of its links as it stops, before it ends their tasks, so a link over a
        connection overrides it to write what it had taken for the peer first (within
        a bound of its own). The default leaves the VPN at once."""
        self.reason = reason
        self.vpn.links.detach(self)

    # --- state --------------------------------------------------------------------------

    @property
    def state(self) -> LinkState:
        """The link's state now."""
        return self._state

    def set_state(self, state: LinkState, reason: str = "") -> None:
        """Move to ``state`` (the link's owner and plugins call this) and wake waiters."""
        if not isinstance(state, LinkState):
            raise TypeError(f"expected a LinkState, got {state!r}")
        if reason:
            self.reason = reason
        if state is self._state:
            return
        self._state = state
        event, self._state_changed = self._state_changed, None
        if event is not None:
            event.set()

    async def wait_for(self, *states: LinkState) -> LinkState:
        """Wait until the link is in one of ``states``; return the one it is in.

        :raises StateError: it became :attr:`LinkState.DISABLED` first (unless that
            is one of ``states``).
        """
        while self._state not in states:
            if self._state is LinkState.DISABLED:
                raise StateError(f"link {self.name!r} is disabled: {self.reason or 'stopped'}")
            if self._state_changed is None:
                self._state_changed = anyio.Event()
            await self._state_changed.wait()
        return self._state

    # --- lifecycle, called by the link's owner ----------------------------------------

    def opened(self, peer_node: str | None, peer_cluster: str | None = None) -> None:
        """The link's connection is up and the peer is who it says: tell the plugins
        (:func:`~meshbus.hookspecs.meshbus_link_opened`). The state becomes ``syncing``;
        whoever tells the peer what this side wants sets ``in-sync`` when done."""
        self._check_attached()
        self.peer_node = peer_node
        self.peer_cluster = peer_cluster
        self.connects += 1
        self.set_state(LinkState.SYNCING)
        self.vpn.node.plugins.link_opened(self)

    def closed(self, reason: str, state: LinkState = LinkState.BACKOFF) -> None:
        """The link's connection went down: forget the peer's interest (it tells it again
        when it comes back; unless :attr:`keeps_interest`) and tell the plugins
        (:func:`~meshbus.hookspecs.meshbus_link_closed`)."""
        self._check_attached()
        self.disconnects += 1
        if not self.keeps_interest:
            self.clear_interest()
        self.set_state(state, reason)
        self.vpn.node.plugins.link_closed(self, reason)

    def _check_attached(self) -> None:
        if not self.attached:
            raise StateError(f"link {self.name!r} is not attached to its VPN")

    # --- interest: what the peer wants from this VPN ------------------------------------

    @property
    def interest(self) -> tuple[str, ...]:
        """The filters the peer wants from this side."""
        return tuple(self._interest)

    def add_interest(self, topic_filter: str) -> bool:
        """The peer wants messages matching ``topic_filter``; return ``False`` if it
        already did. The filter must be valid (SPEC 1); reserved ones (``#P2P/...``)
        are allowed here.

        :raises AccessDeniedError: the peer's subscribe rules refuse it.
        """
        if topic_filter in self._interest:
            return False
        parse_subscription(topic_filter, self.vpn.topic_limits)
        if self.acl is not None and not self.acl.may_subscribe(topic_filter):
            raise AccessDeniedError(self.name, "subscribe", topic_filter, "link ACL")
        levels = wildcard_levels(topic_filter)
        profile = self.profile
        if profile is not None:
            if len(self._interest) >= profile.max_subscriptions:
                raise LimitExceededError(
                    f"link {self.name!r} already has {profile.max_subscriptions} filters "
                    f"of interest (client profile {profile.name!r})",
                    profile.max_subscriptions,
                )
            if levels and self._wildcard_levels + levels > profile.max_wildcard_levels:
                raise LimitExceededError(
                    f"link {self.name!r} has wildcard interest of {self._wildcard_levels} "
                    f"levels in all; {topic_filter!r} would add {levels}, over client "
                    f"profile {profile.name!r}'s max_wildcard_levels of "
                    f"{profile.max_wildcard_levels}",
                    profile.max_wildcard_levels,
                )
        self._wildcard_levels += levels
        self._interest[topic_filter] = None
        if self.attached:
            self.vpn.links._add(topic_filter, self)
        return True

    def remove_interest(self, topic_filter: str) -> bool:
        """The peer no longer wants ``topic_filter``; return ``False`` if it did not."""
        if topic_filter not in self._interest:
            return False
        del self._interest[topic_filter]
        self._wildcard_levels -= wildcard_levels(topic_filter)
        if self.attached:
            self.vpn.links._remove(topic_filter, self)
        return True

    def clear_interest(self) -> None:
        """Forget every filter the peer wanted."""
        for topic_filter in list(self._interest):
            self.remove_interest(topic_filter)

    # --- messages -----------------------------------------------------------------------

    def spools_to(self, endpoint: str) -> bool:
        """Whether a guaranteed message that came in over this link may be spooled to the
        local ``endpoint``: not to the link's own endpoint (never back where it came
        from), nor to one :attr:`keeps_out` names."""
        if endpoint == self.endpoint:
            return False
        keeps_out = self.keeps_out
        return keeps_out is None or not keeps_out(endpoint)

    def count_drop(self, reason: str) -> None:
        """Count a message dropped for ``reason`` (stages' drops are counted for them)."""
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def forward(self, envelope: Envelope) -> bool:
        """Run the egress stages, then :meth:`send`; return whether it was sent."""
        for stage, reason in self._egress:
            if not stage(envelope):
                if reason:
                    self.dropped[reason] = self.dropped.get(reason, 0) + 1
                return False
        if self.send(envelope):
            self.forwarded += 1
            return True
        self.forward_failures += 1
        return False

    def outgoing(self, message: Message) -> Message | None:
        """Run the egress stages on a message the link sends other than through its VPN's
        router: a guaranteed message of a flow the peer bound to a queue here. Return
        the message as it leaves (its hop count, a mapped topic), or ``None`` when a
        stage stopped it (counted; the queue should let go of it)."""
        envelope = Envelope(message, self, mode=message.delivery_mode)
        for stage, reason in self._egress:
            if not stage(envelope):
                if reason:
                    self.dropped[reason] = self.dropped.get(reason, 0) + 1
                return None
        self.forwarded += 1
        out = envelope.message
        if out.origin is not None and self.dedup:
            # It leaves this VPN, maybe long after it came: should a loop of links bring
            # it, or its direct copy, back while the peer holds it, or for a window
            # after the peer took it, it is a duplicate here (see settled()).
            self.vpn.links.origins.hold(out.origin)
        if envelope.hop_count != out.hop_count:
            out = restamped(out, out.origin, envelope.hop_count)
        return out

    def settled(self, message: Message) -> None:
        """The peer took ``message``, which :meth:`outgoing` let out (or it went back to
        its queue): its origin is remembered from now, for a window. The peer may have
        held it for long before it took it (a full queue there), and its direct copy,
        delivered there now, may come back."""
        if message.origin is not None and self.dedup:
            self.vpn.links.origins.release(message.origin)

    def _admit(self, envelope: Envelope) -> bool:
        """The ingress path of a direct message (or the direct copy of a guaranteed one):
        :meth:`_passes`, then de-duplication. Return whether the message goes on."""
        if not self._passes(envelope):
            return False
        # Last: a copy dropped above (one that came the long way round, over the hop
        # limit, or over a link whose peer may not publish it) must not be remembered,
        # or the copy that comes the short way would be taken for a duplicate.
        if self.dedup:
            origin = envelope.message.origin
            if origin is not None and (
                self._seen(origin)
                if envelope.mode is _DIRECT
                else self.vpn.links.origins.check_copy(origin)
            ):
                self.dropped["duplicate"] = self.dropped.get("duplicate", 0) + 1
                return False
        return True

    def _admit_guaranteed(self, envelope: Envelope) -> int | None:
        """The ingress path of a guaranteed message: :meth:`_passes`, then
        de-duplication. Return ``None`` when it does not go on, else what the VPN's
        origin filter knew of it: ``NEW``, or ``COPY_SEEN`` when only its direct copy
        was here before (client subscriptions had it: it is spooled, and that is all)."""
        if not self._passes(envelope):
            return None
        origin = envelope.message.origin
        if not self.dedup or origin is None:
            return NEW
        seen = self.vpn.links.origins.check_guaranteed(origin)
        if seen == SEEN:
            self.dropped["duplicate"] = self.dropped.get("duplicate", 0) + 1
            return None
        return seen

    def _passes(self, envelope: Envelope) -> bool:
        """The ingress stages, then the peer's publish rules: whether the message may
        come in (counted by reason when not)."""
        for stage, reason in self._ingress:
            if not stage(envelope):
                if reason:
                    self.dropped[reason] = self.dropped.get(reason, 0) + 1
                return False
        topic = envelope.message.topic
        if topic not in self._admitted:
            # First message on this topic: what a session's publish would check (SPEC 1).
            try:
                if topic.startswith(QUEUE_TOPIC_PREFIX):  # sent to a queue by name
                    validate_queue_topic(topic)
                else:
                    validate_topic(topic, self.vpn.topic_limits)
            except InvalidTopicError:
                self.count_drop("bad_topic")
                return False
            acl = self.acl
            if acl is not None and not acl.may_publish(topic):
                self.count_drop("denied")
                return False
            if len(self._admitted) >= 4096:
                self._admitted.clear()
            self._admitted[topic] = None
        return True

    def receive(self, message: Message, mode: DeliveryMode | None = None) -> bool:
        """A direct message came in over the link: route it in the local VPN (never back
        over this link). Return whether it was taken (not dropped by a stage).

        :param mode: what it really is: a guaranteed mode for the direct copy of a
            guaranteed message (SPEC 4), which client subscriptions get but endpoints
            do not (they get the message itself, over a flow). By default its own
            delivery mode, which a wire link carries so (:func:`as_direct` makes it
            the direct message routed here).
        """
        if mode is None:
            mode = message.delivery_mode
            if mode is not _DIRECT:
                message = as_direct(message)
        envelope = Envelope(message, self, mode=mode)
        if not self._admit(envelope):
            return False
        self.received += 1
        self.vpn.dispatch(envelope)
        return True

    async def receive_guaranteed(self, message: Message) -> bool:
        """A guaranteed message came in over the link: spool it to every matching local
        endpoint in one commit (SPEC 7), then deliver it to matching client
        subscriptions as a direct message. Return once it is held, so the link can
        acknowledge it to the peer: ``True`` when it was taken, ``False`` when a stage
        dropped it (acknowledge it too: it is not wanted here).

        :raises PublishRejectedError: an endpoint that matches cannot take it now;
            nothing was kept, and the peer must send it again later.
        """
        envelope = Envelope(message, self, mode=message.delivery_mode)
        seen = self._admit_guaranteed(envelope)
        if seen is None:
            return False
        message = envelope.message
        try:
            await self.vpn.node.guaranteed.spool_from_link(
                self, message, delivered=seen == COPY_SEEN
            )
        except BaseException:
            self.receive_failures += 1
            self._forget(((message, seen),))
            raise
        self.received += 1
        return True

    async def receive_guaranteed_many(
        self, messages: Sequence[Message]
    ) -> tuple[list[int], PublishRejectedError | None]:
        """Guaranteed messages came in over the link, in order: take them as
        :meth:`receive_guaranteed` takes one, spooling them in one commit, up to the
        first one that an endpoint refuses. Return once they are held: the positions
        (in ``messages``) of those taken, which the link acknowledges to the peer (the
        ones spooled and the ones a stage dropped), and the refusal that stopped the
        rest (``None`` when none was refused); the peer offers those again later."""
        taken: list[int] = []
        admitted: list[tuple[int, Message, int]] = []
        for position, message in enumerate(messages):
            envelope = Envelope(message, self, mode=message.delivery_mode)
            seen = self._admit_guaranteed(envelope)
            if seen is not None:
                admitted.append((position, envelope.message, seen))
            else:
                taken.append(position)
        if not admitted:
            return taken, None
        guaranteed = self.vpn.node.guaranteed
        try:
            spooled, refusal = await guaranteed.spool_many_from_link(
                self,
                [message for _, message, _ in admitted],
                delivered=[seen == COPY_SEEN for _, _, seen in admitted],
            )
        except BaseException:
            self.receive_failures += 1
            self._forget((message, seen) for _, message, seen in admitted)
            raise
        self.received += len(spooled)
        taken.extend(position for position, _, _ in admitted[: len(spooled)])
        if refusal is not None:
            self.receive_failures += 1
            self._forget((message, seen) for _, message, seen in admitted[len(spooled) :])
        taken.sort()
        return taken, refusal

    def _forget(self, messages: Iterable[tuple[Message, int]]) -> None:
        """Nothing was kept of ``messages`` (each with what the origin filter knew of
        it): the copies the peer sends again are no duplicates."""
        if self.dedup:
            forget = self.vpn.links.origins.forget
            for message, seen in messages:
                origin = message.origin
                if origin is not None:
                    forget(origin, copy_seen=seen == COPY_SEEN)

    def statistics(self) -> LinkStatistics:
        """A snapshot of the link's counters."""
        return LinkStatistics(
            name=self.name,
            kind=self.kind,
            state=self._state,
            peer_node=self.peer_node,
            connects=self.connects,
            connect_failures=self.connect_failures,
            disconnects=self.disconnects,
            forwarded=self.forwarded,
            forward_failures=self.forward_failures,
            received=self.received,
            receive_failures=self.receive_failures,
            dropped=dict(self.dropped),
            interest=len(self._interest),
            forward_latency=self.forward_latency.snapshot() if self.forward_latency.total else {},
        )


class LinkRouter:
    """The links of one VPN and the router that sends messages over them.

    Reach it as ``vpn.links``. Its router is part of the VPN's pipeline (named
    ``"links"``, after the plugins' routers) and is switched on only while some link
    has interest, so a VPN without links pays nothing per publish.
    """

    ROUTER = "links"

    def __init__(self, vpn: Vpn) -> None:
        self.vpn = vpn
        self._links: dict[str, Link] = {}
        self.index: SubscriptionIndex[Link] = SubscriptionIndex()
        #: The origins this VPN saw come in over links (see :class:`OriginFilter`).
        self.origins = OriginFilter(vpn.node.clock.monotonic)
        self.route = self._make_route()

    def __len__(self) -> int:
        return len(self._links)

    def __iter__(self) -> Iterator[Link]:
        return iter(tuple(self._links.values()))

    def get(self, name: str) -> Link | None:
        """The link called ``name``, or ``None``."""
        return self._links.get(name)

    @property
    def links(self) -> Mapping[str, Link]:
        """The VPN's links by name."""
        return dict(self._links)

    def attach(self, link: Link) -> None:
        """Join ``link`` to the VPN: its stages are asked for
        (:func:`~meshbus.hookspecs.meshbus_link_pipeline`) and its interest starts to
        attract messages.

        :raises ConfigurationError: a link of that name is already attached.
        """
        if link.vpn is not self.vpn:
            raise ConfigurationError(f"link {link.name!r} belongs to VPN {link.vpn.name!r}")
        if link.name in self._links:
            raise ConfigurationError(f"VPN {self.vpn.name!r} already has a link {link.name!r}")
        pipeline = LinkPipeline()
        self.vpn.node.plugins.link_pipeline(link, pipeline)
        link._egress = tuple(pipeline._egress.values())
        link._ingress = tuple(pipeline._ingress.values())
        self._links[link.name] = link
        link.attached = True
        for topic_filter in link._interest:
            self._add(topic_filter, link)
        link.attached_to_vpn()

    def detach(self, link: Link) -> None:
        """Remove ``link`` from the VPN for good (its state becomes ``disabled``)."""
        if self._links.get(link.name) is not link:
            return
        for topic_filter in link._interest:
            self._remove(topic_filter, link)
        del self._links[link.name]
        link.attached = False
        link.set_state(LinkState.DISABLED, link.reason or "removed")

    def _add(self, topic_filter: str, link: Link) -> None:
        self.index.add(topic_filter, link)
        if len(self.index) == 1:
            self.vpn.enable_router(self.ROUTER, True)

    def _remove(self, topic_filter: str, link: Link) -> None:
        self.index.remove(topic_filter, link)
        if not len(self.index):
            self.vpn.enable_router(self.ROUTER, False)

    def _make_route(self) -> Callable[[Envelope], int]:
        cached = self.index.cached
        match = self.index.match
        node = self.vpn.node
        node_id = node.node_id
        next_id = node.next_origin_id
        remember = self.origins.check
        link_types = _LINK_TYPES

        def route(envelope: Envelope) -> int:
            """Send the message once over each link that wants it, except where it came from."""
            message = envelope.message
            links = cached(message.topic)
            if links is None:
                links = match(message.topic)
            source = envelope.origin
            endpoints = envelope.endpoints
            out: Envelope | None = None
            sent = 0
            for link in links:
                if link is source:
                    link.dropped["no_local"] = link.dropped.get("no_local", 0) + 1
                    continue
                if endpoints and link.endpoint in endpoints:
                    continue  # its queue holds the guaranteed message: that copy goes
                if out is None:
                    origin = message.origin
                    if origin is None:
                        origin = (node_id, next_id())
                        message = with_origin(message, origin)
                    if source.__class__ not in link_types:  # an ABC's isinstance is slow
                        # It leaves this VPN for the first time: should a loop of links
                        # bring it back, it is a duplicate here like anywhere else.
                        remember(origin)
                    out = Envelope(message, source, endpoints, envelope.mode)
                else:
                    out.message = message  # a stage may have replaced it for the last link
                out.hop_count = message.hop_count
                if link.forward(out):
                    sent += 1
            return sent

        return route

    def vpn_removed(self) -> None:
        for link in list(self._links.values()):
            link.reason = f"VPN {self.vpn.name!r} was removed"
            self.detach(link)
