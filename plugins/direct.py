"""Plugin ``direct``: direct messaging (SPEC section 2).

Owns the plain (non-shared) subscriptions of each VPN in a
:class:`~meshbus.SubscriptionIndex` and contributes one router that, per
published message, looks up the matching sessions and hands each the message
once. Nothing here awaits, spawns a task or calls pluggy per message.
"""

from __future__ import annotations

from collections.abc import Callable

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

    def __init__(self, on_active: Callable[[bool], None] | None = None) -> None:
        #: Told ``True`` when the first subscription arrives and ``False`` when the
        #: last goes, so the VPN can skip this router while it has nothing to do.
        self.on_active = on_active
        self.index: SubscriptionIndex[Session] = SubscriptionIndex()
        #: The router: ``route(envelope) -> deliveries``, called for every publish.
        self.route = self._make_route()
        # Two subscriptions can share a filter ('a' and '#noexport/a'): count them.
        self.refcounts: dict[Session, dict[str, int]] = {}

    def add(self, session: Session, filter: str) -> None:
        counts = self.refcounts.setdefault(session, {})
        n = counts.get(filter, 0)
        counts[filter] = n + 1
        if n == 0:
            self.index.add(filter, session)
            if len(self.index) == 1 and self.on_active is not None:
                self.on_active(True)

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
        if not len(self.index) and self.on_active is not None:
            self.on_active(False)

    def _make_route(self) -> Callable[[Envelope], int]:
        # A closure over locals: no attribute lookups on self per message.
        cached = self.index.cached
        match = self.index.match

        def route(envelope: Envelope) -> int:
            """Deliver to every matching session once; skip the publisher if it is no-local."""
            message = envelope.message
            origin = envelope.origin
            targets = cached(message.topic)
            if targets is None:
                targets = match(message.topic)
            skipped = 0
            for session in targets:
                if session is origin and session.no_local:
                    skipped = 1
                    continue
                egress = session.direct_egress
                if egress is None:  # a handler, a stage (eliding) or a closed session
                    session._deliver(message)  # what the ``deliver`` property returns
                    continue
                # Egress.push inlined, the common case without a call; the fenced copy
                # is compared with its source by tests/test_inline_copies.py.
                # inline: meshbus._egress.Egress.push begin
                # inline-with: self -> egress
                queue = egress._queue
                queue.append(message)
                size = egress._bytes + message.size
                egress._bytes = size
                if size > egress.max_bytes or len(queue) > egress.max_messages:
                    egress._shed()
                if egress._waiter is not None:
                    if egress.on_ready is None:
                        egress.wake()
                    else:
                        egress.on_ready()
                # inline: meshbus._egress.Egress.push end
            return len(targets) - skipped

        return route


ROUTER: StashKey[DirectRouter] = StashKey()


@hookimpl
def meshbus_vpn_created(vpn: Vpn) -> None:
    vpn.stash[ROUTER] = DirectRouter(lambda active: vpn.enable_router("direct", active))


@hookimpl
def meshbus_vpn_pipeline(vpn: Vpn, pipeline: Pipeline) -> None:
    # Off while the VPN has no subscription: publishes then skip it entirely.
    pipeline.add_router("direct", vpn.stash[ROUTER].route, enabled=False)


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
