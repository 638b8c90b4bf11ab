"""Plugin ``shared``: shared subscriptions (SPEC section 3).

``#share/<ShareName>/<filter>`` makes the session a member of the group
(ShareName, filter) in its VPN. Each message matching the filter goes to exactly
one member of each group, picked at random per message with the node's seedable
:attr:`~meshbus.Node.random`, so n messages over m members give each about n/m.
(Members are drawn a batch at a time, independently and exactly uniformly, which
is the same distribution as one draw per message at a fraction of the cost.)

Deliveries go to the member's :attr:`~meshbus.Session.sink`, underneath any
eliding stage (shared deliveries are never elided), and ignore the session's
no-local flag. Groups live in a :class:`~meshbus.SubscriptionIndex` keyed by the
filter, so routing a message costs one cached match plus one random pick per group.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

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


@functools.cache
def _index_tables(n: int) -> tuple[bytes, bytes]:
    """For ``n`` members: a byte -> index table and the byte values to reject.

    Values at or above the largest multiple of ``n`` that fits in a byte are
    rejected, so ``value % n`` is exactly uniform over the members.
    """
    limit = 256 - 256 % n
    return bytes(v % n if v < limit else 0 for v in range(256)), bytes(range(limit, 256))


class ShareGroup:
    """The members of one (ShareName, filter) group in one VPN."""

    __slots__ = (
        "_choices",
        "_randbytes",
        "exported_by",
        "filter",
        "members",
        "next_pick",
        "refcounts",
        "share_name",
    )

    #: Random bytes drawn per refill: picking from a pre-drawn batch costs a publish
    #: one C-level iterator step instead of a random() call, a multiply and an int().
    BATCH = 256

    def __init__(
        self,
        share_name: str,
        filter: str,
        choices: Callable[..., list[Session]],
        randbytes: Callable[[int], bytes],
    ) -> None:
        self.share_name = share_name
        self.filter = filter
        #: Members in join order.
        self.members: list[Session] = []
        self._choices = choices
        self._randbytes = randbytes
        #: Returns the next randomly drawn member; raises StopIteration when the
        #: batch is used up (then :meth:`refill`). Reset on every membership change.
        self.next_pick: Callable[[], Session] = iter(()).__next__
        #: A session can join twice ('#share/g/a' and '#noexport/#share/g/a'); it is
        #: one member, counted here.
        self.refcounts: dict[Session, int] = {}
        #: Memberships not marked ``#noexport/``: the group is advertised to other
        #: nodes while this is above zero (for the routing plugins).
        self.exported_by = 0

    def refill(self) -> Session:
        """Draw the next batch of members (uniformly, with the node's random) and pick one."""
        members = self.members
        while True:
            if len(members) <= 256:
                # In C: random bytes, rejection of the values that would bias the
                # modulo, then a table maps each byte to a member index.
                table, rejected = _index_tables(len(members))
                indexes = self._randbytes(self.BATCH).translate(table, rejected)
                self.next_pick = map(members.__getitem__, indexes).__next__
            else:
                self.next_pick = iter(self._choices(members, k=self.BATCH)).__next__
            try:
                return self.next_pick()
            except StopIteration:  # every byte rejected: vanishingly rare, draw again
                continue

    def membership_changed(self) -> None:
        """Forget the drawn batch: it may name a member that left or miss one that joined."""
        self.next_pick = iter(()).__next__

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
        self._choices = vpn.node.random.choices
        self._randbytes = vpn.node.random.randbytes
        #: The router: ``route(envelope) -> deliveries``, called for every publish.
        self.route = self._make_route()

    def join(self, session: Session, subscription: Subscription) -> None:
        assert subscription.share_name is not None
        key = (subscription.share_name, subscription.filter)
        group = self.groups.get(key)
        if group is None:
            if not self.groups:  # the first group: start routing (see meshbus_vpn_pipeline)
                self.vpn.enable_router("shared", True)
            group = self.groups[key] = ShareGroup(*key, self._choices, self._randbytes)
            self.index.add(subscription.filter, group)
        count = group.refcounts.get(session, 0)
        if count == 0:
            group.members.append(session)
            group.membership_changed()
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
        group.membership_changed()
        if not group.members:  # an empty group disappears at once
            del self.groups[(group.share_name, group.filter)]
            self.index.remove(group.filter, group)
            if not self.groups:
                self.vpn.enable_router("shared", False)

    def _make_route(self) -> Callable[[Envelope], int]:
        # A closure over locals: no attribute lookups on self per message.
        cached = self.index.cached
        match = self.index.match

        def route(envelope: Envelope) -> int:
            """Give the message to one random member of every matching group."""
            message = envelope.message
            groups = cached(message.topic)
            if groups is None:
                groups = match(message.topic)
            for group in groups:
                try:
                    member = group.next_pick()
                except StopIteration:
                    member = group.refill()
                member.sink(message)
            return len(groups)

        return route


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
