"""MQTT sessions: what a client's subscriptions and queue are, across its connections.

A session lives in the node as long as its client is connected and, once it is
not, for the session expiry interval the client asked for (capped by the
listener): a persistent MQTT 3.1.1 session (clean session 0) until the client
cleans it. Its QoS 0 subscriptions are subscriptions of the meshbus session each
connection opens; its QoS 1 ones are subscriptions of a queue of its own
(``mqtt/<client id>``), so messages published while it is away wait there and
reach it when it comes back. On a node with a data directory a persistent session is
kept on disk too (:mod:`._saved_sessions`), and comes back when the node restarts.

A shared subscription (``$share/<name>/<filter>``) makes the session a member of a
group, which the node keeps as long as one session, connected or not, is a member
(:class:`ShareGroup`). The group's first member decides what it is: at QoS 0, a
meshbus shared subscription (each message to one member's session, at most once);
at QoS 1, a non-exclusive queue of its own (:func:`share_queue_name`) to which each
connected member binds a flow, so that each message reaches one member at least
once, waits while no member is connected, and goes to another member when the one
it was sent to goes away without acknowledging it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from meshbus import ConfigurationError, MeshbusError, Node, StateError

from ._saved_sessions import SavedSession, SessionFiles
from ._wills import PendingWill, publish_will

if TYPE_CHECKING:
    from ._connection import MqttConnection

__all__ = [
    "MqttSession",
    "SessionRegistry",
    "ShareGroup",
    "Subscribed",
    "queue_name",
    "share_queue_name",
]

log = logging.getLogger("meshbus.mqtt")

NEVER = 0xFFFFFFFF
"""A session expiry interval that never ends."""


@attrs.frozen
class Subscribed:
    """One MQTT subscription of a session, and what it is in meshbus."""

    mqtt_filter: str
    """As the client gave it."""
    qos: int
    """The QoS granted (0 or 1)."""
    filters: tuple[str, ...]
    """The meshbus subscriptions it is (``#share/...`` for a shared one)."""
    no_local: bool = False
    """MQTT 5: never send the client what it published itself."""
    retain_as_published: bool = False
    """MQTT 5: keep the retain flag of live messages as published."""
    identifier: int | None = None
    """MQTT 5: the subscription identifier the client gave, sent back with each message
    it matches."""
    share_queue: str | None = None
    """A shared subscription whose group is a queue (QoS 1): the queue's name."""
    share_limit: int | None = None
    """And the most messages that queue holds (made again so after a restart)."""

    @property
    def queued(self) -> bool:
        """Whether it is a subscription of the session's queue (QoS 1, not shared)."""
        return self.qos > 0 and not self.filters[0].startswith("#share/")

    @property
    def shared(self) -> bool:
        """Whether it is a shared subscription (``$share/...``)."""
        return self.filters[0].startswith("#share/")

    @property
    def direct(self) -> bool:
        """Whether it is a subscription of the connection's meshbus session: QoS 0, or
        shared in a group that takes direct messages."""
        return not self.queued and self.share_queue is None


def queue_name(client_id: str) -> str:
    """The queue of a client's QoS 1 subscriptions: ``mqtt/<client id>``, or a digest
    of the id when it holds what a queue name may not."""
    if client_id and len(client_id) <= 160 and not any(c in client_id for c in "*>\x00#"):
        return f"mqtt/{client_id}"
    return "mqtt/~" + hashlib.sha256(client_id.encode("utf-8", "surrogatepass")).hexdigest()


def share_queue_name(mqtt_filter: str) -> str:
    """The queue of a QoS 1 share group, ``$share/<name>/<filter>``:
    ``mqtt-share/<name>/<filter>``, or a digest when that is too long for a queue name
    (an MQTT filter holds no ``*`` or ``>``)."""
    name = "mqtt-share/" + mqtt_filter[len("$share/") :]
    if len(name) <= 200 and "\x00" not in name:
        return name
    return "mqtt-share/~" + hashlib.sha256(mqtt_filter.encode("utf-8", "surrogatepass")).hexdigest()


@attrs.define
class ShareGroup:
    """One ``$share/<name>/<filter>`` of a VPN, and the sessions that are its members."""

    queue: str | None
    """Its queue (a group that started at QoS 1), or ``None``: a meshbus shared
    subscription of each member's session."""
    limit: int | None = None
    """The most messages its queue holds: the ``max_queued_messages`` of the listener
    of its first member."""
    members: set[str] = attrs.Factory(set)
    """The client ids of the sessions that have it, connected or not."""


class MqttSession:
    """The state of one client id in one VPN."""

    def __init__(self, vpn: str, client_id: str, expiry: int) -> None:
        self.vpn = vpn
        self.client_id = client_id
        self.expiry = expiry
        self.subscriptions: dict[str, Subscribed] = {}
        self.queue: str | None = None
        self.queue_limit: int | None = None  # the queue's max_messages, when it was made
        #: When its last connection ended (the node clock's wall time), ``None`` while
        #: it has one.
        self.offline_since: float | None = None
        self.connection: MqttConnection | None = None
        self.generation = 0  # bumped at each connection: timers of an older one stand down
        #: The packet id each queued message was sent with and is not acknowledged yet
        #: (by spool id): sent again on a later connection, it keeps it (MQTT-4.4.0-1).
        self.packet_ids: dict[int, int] = {}
        self.reserved_ids: set[int] = set()  # the values of packet_ids
        #: The packet ids of QoS 2 publishes the node took from the client and has not
        #: seen released (PUBREL) yet: a PUBLISH sent again with one of them, on this
        #: connection or a later one, is answered and not published again.
        self.received: set[int] = set()
        self.saved_once = False  # whether it has a file (SessionRegistry.save)
        #: The will of its last connection: set at CONNECT, gone at a normal
        #: DISCONNECT; once the connection is lost, it waits here for its delay.
        self.will: PendingWill | None = None

    @property
    def special(self) -> bool:
        """Whether a subscription needs each message looked at as it is delivered
        (no-local, retain-as-published, a subscription identifier)."""
        return any(
            s.no_local or s.retain_as_published or s.identifier is not None
            for s in self.subscriptions.values()
        )

    def keep_id(self, spool_id: int, packet_id: int) -> None:
        """``spool_id`` went out as ``packet_id``: until it is acknowledged, it keeps it."""
        old = self.packet_ids.get(spool_id)
        if old is not None:
            self.reserved_ids.discard(old)
        self.packet_ids[spool_id] = packet_id
        self.reserved_ids.add(packet_id)

    def release_id(self, spool_id: int) -> None:
        """``spool_id`` is settled: its packet id is free again."""
        packet_id = self.packet_ids.pop(spool_id, None)
        if packet_id is not None:
            self.reserved_ids.discard(packet_id)

    def saved(self) -> SavedSession:
        """What its file keeps."""
        subscriptions = [
            (
                s.mqtt_filter,
                s.qos,
                s.filters,
                s.no_local,
                s.retain_as_published,
                s.identifier,
                s.share_queue,
                s.share_limit,
            )
            for s in self.subscriptions.values()
        ]
        return SavedSession(
            self.vpn,
            self.client_id,
            self.expiry,
            self.queue,
            self.queue_limit,
            self.offline_since,
            subscriptions,
            dict(self.packet_ids) if self.connection is None else None,
            self.will,
            sorted(self.received),
        )

    def __repr__(self) -> str:
        return f"<MqttSession {self.client_id!r} vpn={self.vpn!r}>"


class SessionRegistry:
    """Every MQTT session of a node, by VPN and client id."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.sessions: dict[tuple[str, str], MqttSession] = {}
        self.expired = 0
        data_dir = node.data_dir
        self.files = SessionFiles(data_dir / "mqtt-sessions") if data_dir is not None else None
        #: The share groups, by (VPN, ``$share/<name>/<filter>``).
        self.shares: dict[tuple[str, str], ShareGroup] = {}
        self.restored = 0  # sessions a restart brought back
        self.delayed_wills = 0  # wills published after their connection was gone
        #: Wills a restart brought back, held until the first listener opens (see
        #: :meth:`release_wills`): (its session, or (VPN, client id) if it ended, will).
        self._restored_wills: list[tuple[MqttSession | tuple[str, str], PendingWill]] = []

    def save(self, session: MqttSession) -> None:
        """Keep ``session`` on disk (a node with a data directory), or forget its file
        when it would not outlive its connection."""
        files = self.files
        if files is None or self.sessions.get((session.vpn, session.client_id)) is not session:
            return  # ended already (its VPN was removed, a clean start took over)
        if session.expiry == 0:
            if session.saved_once:
                files.remove(session.vpn, session.client_id)
                session.saved_once = False
            return
        files.write(session.saved())
        session.saved_once = True

    async def restore(self) -> None:
        """At node start: the persistent sessions the node had when it stopped (or
        crashed), with their queues; those whose expiry ran out meanwhile end now."""
        files = self.files
        if files is None:
            return
        now = self.node.clock.time()
        for saved in files.read_all():
            try:
                self.node.vpn(saved.vpn)
            except StateError as exc:  # the configuration has no such VPN any more
                log.warning("MQTT session of client %r not restored: %s", saved.client_id, exc)
                continue
            session = MqttSession(saved.vpn, saved.client_id, saved.expiry)
            session.saved_once = True
            session.queue_limit = saved.queue_limit
            session.offline_since = now if saved.offline_since is None else saved.offline_since
            session.will = saved.will
            for fields in saved.subscriptions:
                session.subscriptions[fields[0]] = Subscribed(*fields)
            for spool_id, packet_id in saved.packet_ids.items():
                session.keep_id(spool_id, packet_id)
            session.received = set(saved.received)
            self.sessions[(saved.vpn, saved.client_id)] = session
            try:
                await self._restore_queue(session, saved.queue)
                await self._restore_shares(session)
            except MeshbusError as exc:
                log.warning(
                    "MQTT session of client %r not restored: queue %r: %s",
                    saved.client_id,
                    saved.queue,
                    exc,
                )
                await self.discard(session)
                continue
            away = max(0.0, now - session.offline_since)
            left = None
            if session.expiry < NEVER:
                left = session.expiry - away
                if left <= 0:  # it ended while the node was down (its will is due)
                    self.expired += 1
                    if session.will is not None:
                        owner = (session.vpn, session.client_id)
                        self._restored_wills.append((owner, session.will))
                        session.will = None
                        # Its file stays until the will went (_publish_ended): a node
                        # that stops or crashes before that still has it.
                        session.saved_once = False
                    await self.discard(session)
                    continue
            self.restored += 1
            self.expire_later(session, left)
            if session.will is not None:  # its connection ended, by a crash if not before
                self._restored_wills.append((session, session.will))
        if self.restored:
            log.info("%d MQTT session(s) restored", self.restored)

    async def _restore_queue(self, session: MqttSession, name: str | None) -> None:
        """Make the session's queue again (its stored messages come back with it) with
        the subscriptions of its QoS 1 subscriptions."""
        if name is None:
            return
        service: Any = self.node.guaranteed
        limit = {} if session.queue_limit is None else {"max_messages": session.queue_limit}
        try:
            service.create_queue(name, vpn=session.vpn, respect_ttl=True, **limit)
        except StateError:  # the configuration has one of that name
            service.queue(name, vpn=session.vpn)
        session.queue = name
        for sub in session.subscriptions.values():
            if sub.queued:
                for each in sub.filters:
                    service.add_subscription(name, each, vpn=session.vpn)

    async def _restore_shares(self, session: MqttSession) -> None:
        """Make the session a member of its share groups again; a QoS 1 group's queue
        is made again by its first member to come back, with what it held."""
        for sub in session.subscriptions.values():
            if sub.shared:
                group = self.shares.get((session.vpn, sub.mqtt_filter))
                if group is None:
                    group = ShareGroup(sub.share_queue, sub.share_limit)
                    if group.queue is not None:
                        self._make_share_queue(session.vpn, sub.filters, group)
                    self.shares[(session.vpn, sub.mqtt_filter)] = group
                group.members.add(session.client_id)

    def share_group(self, vpn: str, mqtt_filter: str) -> ShareGroup | None:
        return self.shares.get((vpn, mqtt_filter))

    async def join_share(
        self, session: MqttSession, sub: Subscribed, max_messages: int
    ) -> ShareGroup:
        """Make ``session`` a member of the group of the shared subscription ``sub``
        (made now, a queue if ``sub`` asks for QoS 1, when it is the first member);
        return the group."""
        key = (session.vpn, sub.mqtt_filter)
        group = self.shares.get(key)
        if group is not None:
            group.members.add(session.client_id)
            return group
        if sub.qos == 0:
            group = self.shares[key] = ShareGroup(None, None, {session.client_id})
            return group
        group = ShareGroup(share_queue_name(sub.mqtt_filter), max_messages, {session.client_id})
        queue = self._make_share_queue(session.vpn, sub.filters, group)
        self.shares[key] = group
        if queue.usage()[0]:
            # Left by a group that ended when the node stopped before it could delete
            # its queue: published while the group had no member, it is not for this one.
            service: Any = self.node.guaranteed
            await service.purge_queue(group.queue, vpn=session.vpn)
        return group

    async def leave_share(self, session: MqttSession, sub: Subscribed) -> None:
        """``session`` no longer has ``sub``: the group, with its queue and what waits
        in it, ends when it was the last member."""
        key = (session.vpn, sub.mqtt_filter)
        group = self.shares.get(key)
        if group is None:
            return
        group.members.discard(session.client_id)
        if group.members:
            return
        del self.shares[key]
        if group.queue is not None:
            await self._delete_queue(session, group.queue)

    def _make_share_queue(self, vpn: str, filters: tuple[str, ...], group: ShareGroup) -> Any:
        """The group's queue (what the store holds for it comes back with it),
        subscribed to the filters of ``#share/<name>/<filter>``."""
        service: Any = self.node.guaranteed
        limit = {} if group.limit is None else {"max_messages": group.limit}
        try:
            queue = service.create_queue(
                group.queue, vpn=vpn, access_type="non-exclusive", respect_ttl=True, **limit
            )
        except StateError:  # a queue of that name with other settings: the configuration's
            queue = service.queue(group.queue, vpn=vpn)
        for each in filters:
            service.add_subscription(group.queue, each.split("/", 2)[2], vpn=vpn)
        return queue

    def get(self, vpn: str, client_id: str) -> MqttSession | None:
        return self.sessions.get((vpn, client_id))

    def create(self, vpn: str, client_id: str, expiry: int) -> MqttSession:
        session = MqttSession(vpn, client_id, expiry)
        self.sessions[(vpn, client_id)] = session
        return session

    async def discard(self, session: MqttSession) -> None:
        """End ``session``: publish its will if one waits (MQTT 5: a will goes when its
        session ends, if not before), forget it and delete its queue (and what waits
        in it)."""
        session.generation += 1  # its timers stand down
        if session.will is not None and session.connection is None:
            with anyio.CancelScope(shield=True):
                await self.publish_will(session)
        if self.sessions.get((session.vpn, session.client_id)) is session:
            del self.sessions[(session.vpn, session.client_id)]
            if session.saved_once and self.files is not None:
                self.files.remove(session.vpn, session.client_id)
                session.saved_once = False
        queue, session.queue = session.queue, None
        if queue is not None:
            await self._delete_queue(session, queue)
        for sub in session.subscriptions.values():
            if sub.shared:
                await self.leave_share(session, sub)

    async def _delete_queue(self, session: MqttSession, queue: str) -> None:
        try:
            await self.node.guaranteed.delete_queue(queue, vpn=session.vpn)
        except StateError:  # gone already: its VPN was removed, or the node stops
            pass
        except (MeshbusError, KeyError) as exc:
            log.warning("queue %r of MQTT client %r not deleted: %s", queue, session.client_id, exc)

    async def ensure_queue(self, session: MqttSession, max_messages: int) -> str:
        """The session's queue, made when its first QoS 1 subscription comes."""
        if session.queue is None:
            name = queue_name(session.client_id)
            service: Any = self.node.guaranteed
            try:
                # Messages past their expiry interval are not sent (MQTT-3.3.2-5).
                queue = service.create_queue(
                    name, vpn=session.vpn, max_messages=max_messages, respect_ttl=True
                )
            except StateError:  # one this node made before, with other settings
                queue = service.queue(name, vpn=session.vpn)
            session.queue = name
            session.queue_limit = max_messages
            if queue.usage()[0]:
                # Left by a session this node no longer has (it restarted, or stopped
                # before it could delete it; CONNACK said no session was present):
                # nothing in it is for this one.
                await service.purge_queue(name, vpn=session.vpn)
        return session.queue

    def expire_later(self, session: MqttSession, after: float | None = None) -> None:
        """Discard ``session`` once its expiry interval (or ``after`` seconds) has passed
        with no connection."""
        if session.expiry >= NEVER:
            return
        generation = session.generation
        wait = session.expiry if after is None else after

        async def expire() -> None:
            clock = self.node.clock
            await clock.sleep_until(clock.monotonic() + wait)
            if session.generation == generation and session.connection is None:
                self.expired += 1
                with anyio.CancelScope(shield=True):
                    await self.discard(session)

        name = f"meshbus mqtt expiry {session.client_id}"
        with contextlib.suppress(StateError):  # the node is stopping: nothing outlives it
            self.node.task_group.start_soon(expire, name=name)

    def release_wills(self) -> None:
        """Start the clocks of the wills a restart brought back, once the node serves
        MQTT again (its first listener is open): by then its configured queues exist,
        as do the sessions it restored, so the wills reach whoever subscribed to them,
        and their clients can come back and cancel them."""
        restored, self._restored_wills = self._restored_wills, []
        now = self.node.clock.time()
        for owner, will in restored:
            if isinstance(owner, MqttSession):
                if owner.will is will and owner.connection is None:
                    since = owner.offline_since if owner.offline_since is not None else now
                    self.will_later(owner, max(0.0, since + will.delay - now))
                continue
            with contextlib.suppress(StateError):  # its session ended: the will goes now
                self.node.task_group.start_soon(self._publish_ended, *owner, will)

    async def _publish_ended(self, vpn: str, client_id: str, will: PendingWill) -> None:
        """Publish the will of a session that ended while the node was down, then remove
        the session's file, unless a new session of the client has one by now."""
        self.delayed_wills += await self._publish(vpn, client_id, will)
        current = self.sessions.get((vpn, client_id))
        if self.files is not None and (current is None or not current.saved_once):
            self.files.remove(vpn, client_id)

    def will_later(self, session: MqttSession, after: float) -> None:
        """Publish the session's waiting will in ``after`` seconds, unless its client
        connects again first or the session ends before (:meth:`discard` publishes it
        then). A node that stops meanwhile keeps it in the session's file."""
        generation = session.generation

        async def publish() -> None:
            clock = self.node.clock
            await clock.sleep_until(clock.monotonic() + after)
            if session.generation == generation and session.connection is None:
                with anyio.CancelScope(shield=True):
                    await self.publish_will(session)

        name = f"meshbus mqtt will {session.client_id}"
        with contextlib.suppress(StateError):  # the node is stopping: the file keeps it
            self.node.task_group.start_soon(publish, name=name)

    async def publish_will(self, session: MqttSession) -> bool:
        """Publish the session's waiting will now, as its client's username, and forget
        it; whether the node took it (a refusal is logged)."""
        will, session.will = session.will, None
        if will is None:
            return False
        try:
            published = await self._publish(session.vpn, session.client_id, will)
        finally:
            # Only now: a crash before this publishes it again after the restart (a
            # will may come twice, never not at all).
            self.save(session)
        self.delayed_wills += published
        return published

    async def _publish(self, vpn_name: str, client_id: str, will: PendingWill) -> bool:
        try:
            vpn = self.node.vpn(vpn_name)
            try:
                client = vpn.open_session_for(will.username, client_id, user=will.user)
            except StateError:  # its client id is in use by a meshbus session meanwhile
                client = vpn.open_session_for(will.username, user=will.user)
        except MeshbusError as exc:
            log.warning("will of MQTT client %r not published: %s", client_id, exc)
            return False
        try:
            return await publish_will(client, will, client_id)
        finally:
            client.close()

    def vpn_removed(self, vpn: str) -> None:
        """``vpn`` is gone, with its queues: its sessions end, and their files go."""
        for key in [key for key in self.shares if key[0] == vpn]:
            del self.shares[key]
        for key, session in list(self.sessions.items()):
            if key[0] == vpn:
                del self.sessions[key]
                session.generation += 1  # its expiry timer stands down
                session.queue = None
                if session.saved_once and self.files is not None:
                    self.files.remove(session.vpn, session.client_id)
                    session.saved_once = False

    async def close(self) -> None:
        """At node stop: sessions that would not outlive their connection go."""
        for session in list(self.sessions.values()):
            if session.expiry == 0:
                with contextlib.suppress(ConfigurationError):
                    await self.discard(session)
