"""An MQTT connection's SUBSCRIBE and UNSUBSCRIBE: what each filter becomes (a
subscription of the connection's session, or of the client's queue at QoS 1), and
the retained values a new subscription is given, by its retain handling."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from meshbus import (
    AccessDeniedError,
    ConfigurationError,
    DeliveryMode,
    InvalidTopicError,
    LimitExceededError,
    MeshbusError,
    Message,
    PublishRejectedError,
    Session,
    from_mqtt_filter,
    parse_subscription,
    wildcard_levels,
)

from ._delivering import wild_first
from ._parts import Parts
from ._reasons import (
    NO_SUBSCRIPTION,
    NOT_AUTHORIZED,
    PROTOCOL_ERROR,
    QUOTA_EXCEEDED,
    TOPIC_FILTER_INVALID,
    UNSPECIFIED,
    Closed,
)
from ._sessions import MqttSession, Subscribed

if TYPE_CHECKING:
    from mqtt5 import SubscribePacket, UnsubscribePacket


log = logging.getLogger("meshbus.mqtt")
_PERSISTENT = DeliveryMode.PERSISTENT
_BATCH = 64  # direct messages written in one go, at most

__all__ = ["Subscribing"]


class Subscribing(Parts):
    """The subscription half of :class:`~meshbus.plugins.mqtt._connection.MqttConnection`."""

    # --- subscriptions -----------------------------------------------------------------

    async def _subscribe(self, packet: SubscribePacket) -> None:
        codec = self.codec
        state = self.state
        session = self.session
        assert codec is not None
        assert state is not None
        assert session is not None
        codes: list[int] = []
        fresh: list[tuple[Subscribed, bool]] = []
        identifier = getattr(packet, "subscription_id", None) if codec.v5 else None
        for wanted in packet.topic_filters:
            try:
                filters = from_mqtt_filter(wanted.pattern)
                sub = Subscribed(
                    wanted.pattern,
                    min(int(wanted.max_qos), 1),
                    filters,
                    bool(wanted.no_local),
                    bool(wanted.retain_as_published) and codec.v5,
                    identifier,
                )
                if sub.no_local and sub.shared:
                    raise Closed("no-local on a shared subscription", PROTOCOL_ERROR)
                existed = wanted.pattern in state.subscriptions
                limit = session.client_profile.max_subscriptions
                if not existed and len(state.subscriptions) >= limit:
                    # Each counts, whatever it becomes (a subscription of the session,
                    # of the client's queue, a share group's queue): one client may not
                    # make the node hold without bound.
                    raise LimitExceededError(
                        f"MQTT client {self.client_id!r} already holds {limit} subscriptions",
                        limit,
                    )
                self._check_wildcard_levels(state, session, sub)
                sub = await self._apply(state, session, sub)
            except InvalidTopicError:
                codes.append(TOPIC_FILTER_INVALID)
                continue
            except AccessDeniedError:
                codes.append(NOT_AUTHORIZED)
                continue
            except (LimitExceededError, PublishRejectedError):
                codes.append(QUOTA_EXCEEDED)
                continue
            except MeshbusError as exc:
                log.warning(
                    "MQTT client %r: subscription %r failed: %s",
                    self.client_id,
                    wanted.pattern,
                    exc,
                )
                codes.append(UNSPECIFIED)
                continue
            codes.append(sub.qos)
            handling = int(wanted.retain_handling) if codec.v5 else 0
            if handling == 0 or (handling == 1 and not existed):
                fresh.append((sub, True))
        self._special = state.special
        self.listener.registry.save(state)
        await self._write(codec.suback(packet.packet_id, codes))
        for sub, _ in fresh:
            if not sub.shared:
                await self._send_retained(sub)

    def _check_wildcard_levels(self, state: MqttSession, session: Session, sub: Subscribed) -> None:
        """Refuse ``sub`` if the wildcard levels of the client's subscriptions would go
        over its profile's ``max_wildcard_levels``: the session counts only those that are
        its own, so those of the client's queue and of its share groups count here."""
        levels = _wildcard_levels(sub)
        if not levels:
            return
        budget = session.client_profile.max_wildcard_levels
        held = sum(
            _wildcard_levels(each)
            for name, each in state.subscriptions.items()
            if name != sub.mqtt_filter
        )
        if held + levels > budget:
            raise LimitExceededError(
                f"MQTT client {self.client_id!r} holds wildcard subscriptions of {held} "
                f"levels in all; {sub.mqtt_filter!r} would add {levels}, over client profile "
                f"{session.client_profile.name!r}'s max_wildcard_levels of {budget}",
                budget,
            )

    async def _apply(self, state: MqttSession, session: Session, sub: Subscribed) -> Subscribed:
        """Make ``sub`` a subscription of the session; return it as granted."""
        old = state.subscriptions.get(sub.mqtt_filter)
        if sub.shared:
            sub = await self._apply_shared(state, session, sub, old)
        elif sub.queued:
            registry = self.listener.registry
            queue = await registry.ensure_queue(state, self.settings.max_queued_messages)
            service: Any = self.node.guaranteed
            for each in sub.filters:
                session.check_subscribe_acl(each)
                service.add_subscription(queue, each, vpn=state.vpn)
            if self.flow is None and self._tg is not None:
                await self._bind(self._tg)
        else:
            for each in sub.filters:
                session.subscribe(each)
        if old is not None and old.queued != sub.queued:
            await self._remove(state, session, old)
        state.subscriptions[sub.mqtt_filter] = sub
        return sub

    async def _apply_shared(
        self, state: MqttSession, session: Session, sub: Subscribed, old: Subscribed | None
    ) -> Subscribed:
        """Make the session a member of the group of ``sub``, in the form the group has:
        a queue at QoS 1 (this connection binds a flow to it), or direct messages at QoS
        0 (MQTT-3.8.4-8: a subscription gets no more than its group delivers)."""
        if not session.client_profile.allow_shared_subscriptions:
            raise AccessDeniedError(
                session.username,
                "subscribe",
                sub.mqtt_filter,
                f"client profile {session.client_profile.name!r} does not allow shared "
                "subscriptions",
            )
        for each in sub.filters:
            session.check_subscribe_acl(each)
        registry = self.listener.registry
        joined = old is None  # the same filter again: the session is a member already
        if joined:
            group = await registry.join_share(state, sub, self.settings.max_queued_messages)
            queue, limit = group.queue, group.limit
        else:
            assert old is not None
            queue, limit = old.share_queue, old.share_limit
        try:
            if queue is None:
                sub = attrs.evolve(sub, qos=0)
                for each in sub.filters:
                    session.subscribe(each)
            else:
                sub = attrs.evolve(sub, share_queue=queue, share_limit=limit)
                if queue not in self._shares and self._tg is not None:
                    await self._bind_share(self._tg, queue)
        except BaseException:
            if joined:
                with anyio.CancelScope(shield=True):
                    await registry.leave_share(state, sub)
            raise
        return sub

    async def _remove(self, state: MqttSession, session: Session, sub: Subscribed) -> None:
        """Take back the meshbus subscriptions of ``sub`` that no other subscription of
        the session needs: ``t/a/#`` is ``t/a`` and ``t/a/>``, and ``t/a`` may be
        subscribed on its own too. A shared one leaves its group (and this connection
        unbinds from the group's queue)."""
        if sub.shared:
            if sub.share_queue is not None:
                await self._unbind_share(sub.share_queue)
            else:
                for each in sub.filters:
                    session.unsubscribe(each)
            await self.listener.registry.leave_share(state, sub)
            return
        needed = {
            each
            for other in state.subscriptions.values()
            if other is not sub and other.queued == sub.queued and not other.shared
            for each in other.filters
        }
        filters = [each for each in sub.filters if each not in needed]
        if sub.queued:
            if state.queue is not None:
                service: Any = self.node.guaranteed
                for each in filters:
                    service.remove_subscription(state.queue, each, vpn=state.vpn)
        else:
            for each in filters:
                session.unsubscribe(each)

    async def _unsubscribe(self, packet: UnsubscribePacket) -> None:
        codec = self.codec
        state = self.state
        session = self.session
        assert codec is not None
        assert state is not None
        assert session is not None
        codes = []
        for pattern in packet.patterns:
            sub = state.subscriptions.pop(pattern, None)
            if sub is None:
                codes.append(NO_SUBSCRIPTION)
                continue
            await self._remove(state, session, sub)
            codes.append(0)
        self.listener.registry.save(state)
        await self._write(codec.unsuback(packet.packet_id, codes))

    async def _send_retained(self, sub: Subscribed) -> None:
        try:
            from meshbus.plugins.retained import retained_store

            store = retained_store(self.session.vpn)  # type: ignore[union-attr]
        except (ConfigurationError, ImportError):
            return  # the node keeps no retained values
        seen: set[str] = set()
        found: list[Message] = []
        for each in sub.filters:
            for message in store.matching(each):
                if message.topic[0] == "$" and wild_first(each):
                    continue  # MQTT-4.7.2-1: a filter that starts with a wildcard
                if message.topic not in seen:
                    seen.add(message.topic)
                    found.append(message)
        codec = self.codec
        assert codec is not None
        state = self.state
        queued: set[int] = set()
        for message in found:
            if sub.no_local and message.sender == self.client_id:
                continue
            store.delivered += 1
            # At the lower of the published and the granted QoS (MQTT-3.8.4-8): a QoS 1
            # one through the session's queue, as the session's other QoS 1 messages,
            # so it is sent again until acknowledged.
            if (
                sub.queued
                and message.delivery_mode is _PERSISTENT
                and state is not None
                and state.queue is not None
            ):
                try:
                    service: Any = self.node.guaranteed
                    queued.add(await service.put_in_queue(state.vpn, state.queue, message))
                    continue
                except PublishRejectedError as exc:  # its queue is full: at QoS 0 then
                    log.info("MQTT %s: a retained value goes at QoS 0: %s", self.client_id, exc)
            await self._write(self._encode(message, 0, None, True, ids=_ids(sub)))
        if queued:
            await self._until_written(queued)

    async def _until_written(self, spool_ids: set[int]) -> None:
        """Wait until the queue's flow has written the messages of ``spool_ids``, so that
        they come before whatever this connection answers next, as retained values
        should; only when nothing else waits in the queue before them and the flow's
        window has room for them (the client's acks of what fills it would come
        through this very reader), and for a second at most. Behind a backlog they
        come after it, in the queue's order."""
        flow, state = self.flow, self.state
        window = min(self.settings.max_inflight, self.client_receive_max)
        if flow is None or state is None or state.queue is None:
            return
        if len(self._inflight) + len(spool_ids) > window:
            return
        service: Any = self.node.guaranteed
        held = service.queue(state.queue, vpn=state.vpn).usage()[0]
        if held > len(spool_ids) + len(self._inflight):
            return
        done = anyio.Event()
        self._retained_due = (spool_ids, done)
        try:
            with anyio.move_on_after(1.0):
                await done.wait()
        finally:
            self._retained_due = None


def _ids(sub: Subscribed) -> list[int] | None:
    """What a retained value sent for ``sub`` carries: its identifier alone."""
    return None if sub.identifier is None else [sub.identifier]


def _wildcard_levels(sub: Subscribed) -> int:
    """What ``sub`` counts against ``max_wildcard_levels``, as a session counts its
    meshbus subscriptions (a shared one's without the group)."""
    return sum(wildcard_levels(parse_subscription(each).filter) for each in sub.filters)
