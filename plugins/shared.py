"""Plugin ``shared``: shared subscriptions (SPEC section 3).

``#share/<ShareName>/<filter>`` makes the session a member of the group
(ShareName, filter) in its VPN. Each message matching the filter goes to exactly
one member of each group, picked at random per message with the node's seedable
:attr:`~meshbus.Node.random`, so n messages over m members give each about n/m.

Deliveries go to the member's :attr:`~meshbus.Session.sink`, underneath any
eliding stage (shared deliveries are never elided), and ignore the session's
no-local flag. Groups live in a :class:`~meshbus.SubscriptionIndex` keyed by the
filter, so routing a message costs one cached match plus one random pick per group.
"""

from __future__ import annotations

from meshbus import (
    AccessDeniedError,
    Envelope,
    Pipeline,
    Session,
    StashKey,
    Subscription,
    SubscriptionIndex,
    Vpn,
    hookimpl,
)

__all__ = ["ShareGroup", "SharedRouter"]


class ShareGroup:
    """The members of one (ShareName, filter) group in one VPN."""

    __slots__ = ("exported_by", "filter", "members", "refcounts", "share_name")

    def __init__(self, share_name: str, filter: str) -> None:
        self.share_name = share_name
        self.filter = filter
        #: Members in join order; a list so a random index picks one in O(1).
        self.members: list[Session] = []
        #: A session can join twice ('#share/g/a' and '#noexport/#share/g/a'); it is
        #: one member, counted here.
        self.refcounts: dict[Session, int] = {}
        #: Memberships not marked ``#noexport/``: the group is advertised to other
        #: nodes while this is above zero (for the routing plugins).
        self.exported_by = 0

    @property
    def exported(self) -> bool:
        """Whether routing plugins should advertise this group's filter to other nodes."""
        return self.exported_by > 0

    def __repr__(self) -> str:
        return f"<ShareGroup {self.share_name!r} {self.filter!r} members={len(self.members)}>"


class SharedRouter:
    """Per-VPN state of the plugin: the groups and the router over them."""

    def __init__(self, vpn: Vpn) -> None:
        self.vpn = vpn
        self.index: SubscriptionIndex[ShareGroup] = SubscriptionIndex()
        self.groups: dict[tuple[str, str], ShareGroup] = {}
        self._random = vpn.node.random.random
        self._cached = self.index.cached

    def join(self, session: Session, subscription: Subscription) -> None:
        assert subscription.share_name is not None
        key = (subscription.share_name, subscription.filter)
        group = self.groups.get(key)
        if group is None:
            if not self.groups:  # the first group: start routing (see meshbus_vpn_pipeline)
                self.vpn.enable_router("shared", True)
            group = self.groups[key] = ShareGroup(*key)
            self.index.add(subscription.filter, group)
        count = group.refcounts.get(session, 0)
        if count == 0:
            group.members.append(session)
        group.refcounts[session] = count + 1
        if not subscription.no_export:
            group.exported_by += 1

    def leave(self, session: Session, subscription: Subscription) -> None:
        assert subscription.share_name is not None
        group = self.groups.get((subscription.share_name, subscription.filter))
        if group is None or session not in group.refcounts:
            return
        if not subscription.no_export:
            group.exported_by -= 1
        count = group.refcounts[session] - 1
        if count:
            group.refcounts[session] = count
            return
        del group.refcounts[session]
        group.members.remove(session)
        if not group.members:  # an empty group disappears at once
            del self.groups[(group.share_name, group.filter)]
            self.index.remove(group.filter, group)
            if not self.groups:
                self.vpn.enable_router("shared", False)

    def route(self, envelope: Envelope) -> int:
        """Give the message to one random member of every matching group."""
        message = envelope.message
        groups = self._cached(message.topic) or self.index.match(message.topic)
        rand = self._random
        for group in groups:
            members = group.members
            members[int(rand() * len(members))].sink(message)
        return len(groups)


ROUTER: StashKey[SharedRouter] = StashKey()


@hookimpl
def meshbus_vpn_created(vpn: Vpn) -> None:
    vpn.stash[ROUTER] = SharedRouter(vpn)


@hookimpl
def meshbus_vpn_pipeline(vpn: Vpn, pipeline: Pipeline) -> None:
    # Off until the VPN has a group, so publishes in a VPN without shared
    # subscriptions never call it.
    pipeline.add_router("shared", vpn.stash[ROUTER].route, enabled=False)


@hookimpl
def meshbus_subscribe(session: Session, subscription: Subscription) -> bool | None:
    if not subscription.is_shared:
        return None
    if not session.client_profile.allow_shared_subscriptions:
        raise AccessDeniedError(
            session.username,
            "subscribe",
            subscription.text,
            f"client profile {session.client_profile.name!r} does not allow shared subscriptions",
        )
    session.vpn.stash[ROUTER].join(session, subscription)
    return True


@hookimpl
def meshbus_unsubscribe(session: Session, subscription: Subscription) -> bool | None:
    if not subscription.is_shared:
        return None
    session.vpn.stash[ROUTER].leave(session, subscription)
    return True
