"""Plugin ``direct``: direct messaging (SPEC section 2).

Owns the plain (non-shared) subscriptions of each VPN in a
:class:`~meshbus.SubscriptionIndex` and contributes one router that, per
published message, looks up the matching sessions and hands each the message
once. Nothing here awaits, spawns a task or calls pluggy per message.
"""

from __future__ import annotations

from meshbus import (
    Envelope,
    Pipeline,
    Session,
    StashKey,
    Subscription,
    SubscriptionIndex,
    Vpn,
    hookimpl,
)

__all__ = ["DirectRouter"]


class DirectRouter:
    """Per-VPN state of the plugin: the index and each session's filter refcounts."""

    def __init__(self) -> None:
        self.index: SubscriptionIndex[Session] = SubscriptionIndex()
        self._cached = self.index.cached  # the cache probe, bound once for the hot path
        # Two subscriptions can share a filter ('a' and '#noexport/a'): count them.
        self.refcounts: dict[Session, dict[str, int]] = {}

    def add(self, session: Session, filter: str) -> None:
        counts = self.refcounts.setdefault(session, {})
        n = counts.get(filter, 0)
        counts[filter] = n + 1
        if n == 0:
            self.index.add(filter, session)

    def remove(self, session: Session, filter: str) -> None:
        counts = self.refcounts.get(session)
        if counts is None or filter not in counts:
            return
        n = counts[filter] - 1
        if n:
            counts[filter] = n
            return
        del counts[filter]
        if not counts:
            del self.refcounts[session]
        self.index.remove(filter, session)

    def route(self, envelope: Envelope) -> int:
        """Deliver to every matching session once; skip the publisher if it is no-local."""
        message = envelope.message
        origin = envelope.origin
        targets = self._cached(message.topic) or self.index.match(message.topic)
        skipped = 0
        for session in targets:
            if session is origin and session.no_local:
                skipped = 1
                continue
            session.deliver(message)
        return len(targets) - skipped


ROUTER: StashKey[DirectRouter] = StashKey()


@hookimpl
def meshbus_vpn_created(vpn: Vpn) -> None:
    vpn.stash[ROUTER] = DirectRouter()


@hookimpl
def meshbus_vpn_pipeline(vpn: Vpn, pipeline: Pipeline) -> None:
    pipeline.add_router("direct", vpn.stash[ROUTER].route)


@hookimpl
def meshbus_subscribe(session: Session, subscription: Subscription) -> bool | None:
    if subscription.is_shared:
        return None
    session.vpn.stash[ROUTER].add(session, subscription.filter)
    return True


@hookimpl
def meshbus_unsubscribe(session: Session, subscription: Subscription) -> bool | None:
    if subscription.is_shared:
        return None
    session.vpn.stash[ROUTER].remove(session, subscription.filter)
    return True
