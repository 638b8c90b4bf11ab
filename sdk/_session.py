"""Sessions: a client's login to one VPN, for publishing, subscribing and receiving."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._acl import AclChecker
from ._egress import Egress
from ._messages import _EMPTY_HEADERS as _NO_HEADERS
from ._messages import (
    DEFAULT_OPTIONS,
    ELIGIBLE_OPTIONS,
    HEADER_LIMITS,
    STRING_COST,
    DeliveryMode,
    Envelope,
    Message,
    MessageOptions,
    held_size,
    texts_size,
)
from ._stash import Stash
from ._stats import SessionStatistics
from ._topics import (
    Subscription,
    parse_endpoint_subscription,
    parse_subscription,
    validate_topic,
    wildcard_levels,
)
from .errors import (
    AccessDeniedError,
    InvalidTopicError,
    LimitExceededError,
    PublishRejectedError,
    StateError,
)

if TYPE_CHECKING:
    from ._node import Node
    from ._profiles import AclProfile, ClientProfile, ClientUsername
    from ._vpn import Vpn
    from .abc import Flow

__all__ = ["MessageHandler", "Session"]

log = logging.getLogger("meshbus.session")

MessageHandler = Callable[[Message], None] | Callable[[Message], Awaitable[None]]

_DIRECT = DeliveryMode.DIRECT
# A reply-to this long or shorter is within the header limits whatever its characters.
_SHORT_TEXT = (HEADER_LIMITS.max_bytes - 4) // 6
_new_message = object.__new__
_ADMITTED_CACHE = 4096  # topics remembered as valid and allowed, per session


class Session:
    """One client's login to a VPN. Open it with :meth:`meshbus.Node.connect`.

    Messages for the session are either handed to ``on_message`` (a plain
    function is called inline by the publishing code; an ``async`` function is
    awaited by one task per session) or buffered for :meth:`receive` and
    ``async for``. Direct delivery never blocks a publisher: a slow consumer's
    buffer drops its oldest message (SPEC 2).
    """

    def __init__(
        self,
        vpn: Vpn,
        client_name: str,
        user: ClientUsername,
        username: str,
        client_profile: ClientProfile,
        acl_profile: AclProfile,
        no_local: bool,
        on_message: MessageHandler | None,
        timestamps: bool = False,
    ) -> None:
        self.vpn = vpn
        self.client_name = client_name
        self.username = username
        self.user = user
        self.client_profile = client_profile
        self.acl_profile = acl_profile
        self.no_local = no_local
        #: Leaves endpoints out of this session's guaranteed messages:
        #: ``leaves_out(endpoint, topic)`` true means a message it sends on ``topic`` is
        #: not spooled to that endpoint, decided as it is sent (an MQTT listener's
        #: per-subscription no-local for the client's own queue); ``None``: none is.
        self.leaves_out: Callable[[str, str], bool] | None = None
        #: Whether this session's direct messages carry the node clock's time of publish
        #: (off by default: reading the clock is a good part of a publish's cost).
        self.timestamps = timestamps
        self.stash = Stash()
        self.closed = False
        self._acl = AclChecker(acl_profile, username, client_name)
        self._admitted: dict[str, None] = {}
        self._subscriptions: dict[str, Subscription] = {}
        self._wildcard_levels = 0  # levels of the wildcard subscriptions held, in all
        self._egress = Egress(client_profile.egress_max_messages, client_profile.egress_max_bytes)
        self._queue = self._egress._queue  # the buffer's deque, for the inlined take in __anext__
        slow_state = [float("-inf"), 0.0]  # when it was last named, its discards then
        self._egress.on_discard = lambda: vpn.node.slow_consumers.discarded(self, slow_state)
        self._time = vpn.node.clock.time
        self._envelope = Envelope(None, self)  # type: ignore[arg-type]  # reused per publish
        self.published = 0
        self.delivered = 0
        self.denied = 0
        self.handler_errors = 0
        self._handler: Callable[[Message], None] | None = None
        self._async_handler: Callable[[Message], Awaitable[None]] | None = None
        #: Where a message for this session ends up: its egress buffer, or its inline
        #: handler. Routers that must bypass delivery stages (shared subscriptions are
        #: never elided) call ``session.sink(message)``.
        self.sink: Callable[[Message], None]
        self._receivable = False  # messages are taken with receive(), not given to a handler
        if on_message is None:
            self.sink = self._egress.push
            self._receivable = True
        elif not callable(on_message):
            raise TypeError(f"on_message must be callable, got {on_message!r}")
        elif inspect.iscoroutinefunction(on_message) or inspect.iscoroutinefunction(
            type(on_message).__call__  # an object with ``async def __call__``
        ):
            self._async_handler = on_message  # type: ignore[assignment]
            self.sink = self._egress.push
        else:
            self._handler = on_message  # type: ignore[assignment]
            self.sink = self._call_handler
        self._deliver: Callable[[Message], None] = self.sink
        #: The egress buffer the direct router appends to itself, skipping the call to
        #: :attr:`deliver`; ``None`` unless :attr:`deliver` is that buffer's own push
        #: (no handler, no stage, not closed). Assigning :attr:`deliver` keeps it so.
        self.direct_egress: Egress | None = self._egress if self._handler is None else None

    @property
    def deliver(self) -> Callable[[Message], None]:
        """The entry point of direct deliveries: ``session.deliver(message)``.

        It is :attr:`sink` unless a plugin put a stage in front (eliding does, when
        the session opens); a stage ends by calling :attr:`sink`. A plugin puts its
        stage here by assigning this attribute, which also tells the direct router
        that it can no longer append to the egress buffer itself.
        """
        return self._deliver

    @deliver.setter
    def deliver(self, stage: Callable[[Message], None]) -> None:
        self._deliver = stage
        # Only the buffer's own push may be skipped: a plugin may have replaced the sink.
        plain = (
            stage is self.sink
            and stage == self._egress.push
            and self._handler is None
            and not self.closed
        )
        self.direct_egress = self._egress if plain else None

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (
            f"<Session {self.client_name!r} user={self.username!r} vpn={self.vpn.name!r} {state}>"
        )

    @property
    def node(self) -> Node:
        """The node the session's VPN belongs to."""
        return self.vpn.node

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """The subscriptions this session holds, as given."""
        return tuple(self._subscriptions)

    # --- publishing (per message: no await, no hook) ---------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str = b"",
        *,
        headers: Mapping[str, Any] | None = None,
        eliding_eligible: bool = False,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        retain: bool = False,
        ttl: float | None = None,
    ) -> None:
        """Publish a direct message. Returns at once; never blocks on slow consumers.

        :param retain: keep it as the topic's last value, for subscriptions made later
            (SPEC 12; needs the ``retained`` plugin); an empty payload clears the value.
        :param ttl: seconds it stays valid (``None`` or 0: no limit). A retained value
            is dropped once it expires, and a receiver is told the time it has left
            (an MQTT subscriber as the message expiry interval).

        :raises InvalidTopicError: the topic is not valid (SPEC 1).
        :raises AccessDeniedError: the ACL profile denies publishing to it.
        :raises PublishRejectedError: the headers, reply-to and correlation id are over
            the :data:`~meshbus.HEADER_LIMITS` (``"headers-too-large"``,
            ``"headers-too-deep"``), or the ``ttl`` is not a finite number >= 0
            (``"invalid-ttl"``).
        :raises StateError: the session is closed.
        """
        if topic not in self._admitted:
            self._admit(topic)
        if type(payload) is not bytes:
            payload = as_bytes(payload)
        if (
            headers is None
            and reply_to is None
            and correlation_id is None
            and not retain
            and ttl is None
        ):
            options = ELIGIBLE_OPTIONS if eliding_eligible else DEFAULT_OPTIONS
            size = len(payload)
        else:
            expires_at = None
            if ttl is not None:
                check_ttl(ttl)
                expires_at = self._time() + ttl if ttl else None
            # Only here, with settings to check: a plain publish pays nothing for limits.
            if headers is None:  # a request or a reply, most likely: strings only
                headers = _NO_HEADERS
                if correlation_id is None and type(reply_to) is str and len(reply_to) < _SHORT_TEXT:
                    size = STRING_COST + 4 * len(reply_to)  # texts_size() of a request, inlined
                else:
                    size = texts_size(reply_to, correlation_id, 0, HEADER_LIMITS)
            else:
                headers = dict(headers)
                size = held_size(headers, reply_to, correlation_id, HEADER_LIMITS)
            options = MessageOptions(
                _DIRECT,
                headers,
                eliding_eligible,
                reply_to,
                correlation_id,
                False,
                False,
                None,
                None,
                expires_at,
                retain,
                False,
                size,
            )
            size += len(payload)
        # make_message() inlined: eight slot stores, no extra frame. The fenced copies here
        # are compared with their sources by tests/test_inline_copies.py; ``size`` was
        # worked out above, with the header limits.
        # inline: meshbus._messages.make_message[build] begin
        # inline-with: _new -> _new_message
        # inline-with: sender -> self.client_name
        # inline-with: timestamp -> self._time() if self.timestamps else None
        # inline-with: len(payload) + options.size -> size
        # inline-with: origin -> None
        # inline-with: hop_count -> 0
        message = _new_message(Message)
        message.topic = topic  # type: ignore[misc]
        message.payload = payload  # type: ignore[misc]
        message.sender = self.client_name  # type: ignore[misc]
        message.timestamp = self._time() if self.timestamps else None  # type: ignore[misc]
        message.options = options  # type: ignore[misc]
        message.origin = None  # type: ignore[misc]
        message.hop_count = 0  # type: ignore[misc]
        message.size = size  # type: ignore[misc]
        # inline: meshbus._messages.make_message[build] end
        if retain:  # kept before it is routed: a refusal publishes nothing
            self.vpn.node.retained.keep(self.vpn, message)
        self.published += 1
        # Vpn.dispatch inlined: this is the per-message path. An envelope is made only
        # when the message must wait; otherwise the session's own is reused.
        vpn = self.vpn
        # inline: meshbus._vpn.Vpn.dispatch[defer] begin
        # inline-with: self -> vpn
        # inline-with: envelope.copy() -> Envelope(message, self)
        if vpn._busy:
            vpn._pending.append(Envelope(message, self))
            return
        # inline: meshbus._vpn.Vpn.dispatch[defer] end
        envelope = self._envelope
        envelope.message = message
        # inline: meshbus._vpn.Vpn.dispatch[route] begin
        # inline-with: self -> vpn
        # inline-with: not self._route(envelope) and count_unmatched -> not vpn._route(envelope)
        vpn._busy = True
        try:
            if not vpn._route(envelope):
                vpn.unmatched += 1
            if vpn._pending:
                vpn._drain()
        finally:
            vpn._busy = False
        # inline: meshbus._vpn.Vpn.dispatch[route] end

    # --- guaranteed messaging (delegated to the plugin that provides it) ------------

    async def send(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str = b"",
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
        eliding_eligible: bool = False,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        retain: bool = False,
    ) -> None:
        """Publish a guaranteed message to a topic (SPEC 4).

        Returns once every endpoint whose subscriptions match holds it (for a
        persistent message on a durable store: on disk). Matching client
        subscriptions get it as a direct message.

        :param ttl: seconds until it expires, for endpoints that respect TTL (a retained
            value expires with it).
        :param retain: also keep it as the topic's last value (SPEC 12); returns once the
            kept value is durable too, when the node has a data directory.
        :raises PublishRejectedError: an endpoint that rejects on discard could not
            take it, it is too large (its payload and headers count), or its headers
            are over the :data:`~meshbus.HEADER_LIMITS`; nothing was stored.
        :raises ConfigurationError: no plugin provides guaranteed messaging.
        """
        await self._send(
            topic,
            payload,
            _send_options(persistent, headers, ttl, eliding_eligible, reply_to, correlation_id),
            retain,
        )

    async def _send(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str,
        options: dict[str, Any],
        retain: bool,
    ) -> None:
        """:meth:`send` with its options made (a transport adds ``redelivered``: see
        :meth:`_send_again`)."""
        if topic not in self._admitted:
            self._admit(topic)
        body = as_bytes(payload)
        if not retain:
            await self.node.guaranteed.send(self, topic, body, options)
            return
        retained = self.node.retained
        retained.check(self.vpn, topic, len(body) + options["size"])  # before anything is held
        options["retain"] = True
        await self.node.guaranteed.send(self, topic, body, options)
        now = self._time()
        ttl = options["ttl"]
        message = Message(
            topic,
            body,
            DeliveryMode.PERSISTENT if options["persistent"] else DeliveryMode.NON_PERSISTENT,
            options["headers"],
            options["eliding_eligible"],
            options["reply_to"],
            options["correlation_id"],
            sender=self.client_name,
            timestamp=now,
            expires_at=now + ttl if ttl else None,
            retain=True,
        )
        retained.keep(self.vpn, message)
        await retained.flush()  # acknowledged only once the kept value is as durable

    async def send_many(
        self,
        messages: Iterable[tuple[str, bytes | bytearray | memoryview | str]],
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
    ) -> list[Exception | None]:
        """Publish many guaranteed messages, pipelined: one store commit for the batch.

        ``messages`` are ``(topic, payload)`` pairs. Returns one entry per message, in
        order: ``None`` once it is held (acked), or the exception that rejected it
        (:class:`PublishRejectedError`, :class:`InvalidTopicError`,
        :class:`AccessDeniedError`); a rejected message does not stop the others.

        :raises PublishRejectedError: the options all messages share are refused
            (headers over the :data:`~meshbus.HEADER_LIMITS`, an invalid ``ttl``);
            nothing was sent.
        """
        self._check_open()
        options = _send_options(persistent, headers, ttl, False, None, None)
        batch: list[tuple[str, bytes]] = []
        results: list[Exception | None] = []
        for topic, payload in messages:
            try:
                if topic not in self._admitted:
                    self._admit(topic)
            except (InvalidTopicError, AccessDeniedError) as exc:
                results.append(exc)
                continue
            results.append(None)
            batch.append((topic, as_bytes(payload)))
        sent = iter(await self.node.guaranteed.send_many(self, batch, options))
        return [next(sent) if r is None else r for r in results]

    async def send_to_queue(
        self,
        queue: str,
        payload: bytes | bytearray | memoryview | str = b"",
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
        reply_to: str | None = None,
        correlation_id: str | None = None,
    ) -> None:
        """Publish a guaranteed message to one queue by name (SPEC 4).

        :raises AccessDeniedError: the ACL profile denies publishing to the queue's
            topic, ``#P2P/QUE/<queue>``; nothing was stored.
        :raises PublishRejectedError: no such queue, ingress disabled, over quota, too
            large, or headers over the :data:`~meshbus.HEADER_LIMITS`; nothing was stored.
        """
        self._check_open()
        await self.node.guaranteed.send_to_queue(
            self,
            queue,
            as_bytes(payload),
            _send_options(persistent, headers, ttl, False, reply_to, correlation_id),
        )

    async def _send_again(
        self,
        topic: str | None,
        queue: str | None,
        payload: bytes,
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
        eliding_eligible: bool = False,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        retain: bool = False,
    ) -> None:
        """A send made again by a remote client that got no answer to it (its connection
        ended): :meth:`send` to ``topic``, or :meth:`send_to_queue` to ``queue``, stored
        flagged ``redelivered``, since the node may hold it already (SPEC 4: nothing is
        delivered twice without the flag)."""
        options = _send_options(
            persistent, headers, ttl, eliding_eligible, reply_to, correlation_id
        )
        options["redelivered"] = True
        if queue is None:
            assert topic is not None
            await self._send(topic, payload, options, retain)
        else:
            self._check_open()
            await self.node.guaranteed.send_to_queue(self, queue, payload, options)

    async def bind(self, queue: str, *, window: int = 255) -> Flow:
        """Bind a consumer flow to a queue; use it with ``async with`` / ``async for``.

        :param window: most messages delivered and not yet acknowledged.
        :raises AccessDeniedError: the client profile does not allow guaranteed receive.
        :raises StateError: no such queue, or its egress is disabled.
        """
        self._check_open()
        if not self.client_profile.allow_guaranteed_receive:
            raise AccessDeniedError(
                self.username, "bind", queue, "client profile does not allow guaranteed receive"
            )
        return await self.node.guaranteed.bind(self, queue, window)

    async def bind_topic_endpoint(
        self, endpoint: str, subscription: str, *, window: int = 255
    ) -> Flow:
        """Bind a consumer flow to a topic endpoint, naming the subscription it spools.

        The subscription stays with the endpoint after the flow unbinds (a durable
        subscription). Binding with a different one deletes what the endpoint holds
        and replaces it, which is refused while another flow is bound.

        :raises InvalidTopicError: the subscription is invalid or shared.
        :raises AccessDeniedError: the ACL profile denies subscribing to it, or the
            client profile does not allow guaranteed receive.
        :raises StateError: no such endpoint, or it is in use with another subscription.
        """
        self._check_open()
        if not self.client_profile.allow_guaranteed_receive:
            raise AccessDeniedError(
                self.username, "bind", endpoint, "client profile does not allow guaranteed receive"
            )
        filter = parse_endpoint_subscription(subscription, self.vpn.topic_limits).filter
        if not self._acl.may_subscribe(filter):
            self.denied += 1
            raise AccessDeniedError(self.username, "subscribe", subscription)
        return await self.node.guaranteed.bind_topic_endpoint(self, endpoint, filter, window)

    def check_publish_acl(self, topic: str) -> None:
        """Raise :class:`AccessDeniedError` (and count it in ``denied``) when the ACL
        profile denies publishing to ``topic``.

        The topic is not validated, so reserved topics can be judged too: plugins
        call this for what a session publishes to on their side, such as a queue
        addressed by name (``#P2P/QUE/<queue>``, SPEC 4).
        """
        if not self._acl.may_publish(topic):
            self.denied += 1
            raise AccessDeniedError(self.username, "publish", topic)

    def check_subscribe_acl(self, subscription: str) -> None:
        """Raise :class:`InvalidTopicError` for a subscription that is not valid, and
        :class:`AccessDeniedError` (counted in ``denied``) when the ACL profile denies
        it: plugins call this for what a session subscribes to on their side, such
        as the subscriptions of a queue it owns (an MQTT client's QoS 1 ones)."""
        sub = parse_subscription(subscription, self.vpn.topic_limits)
        if not self._acl.may_subscribe(sub.filter):
            self.denied += 1
            raise AccessDeniedError(self.username, "subscribe", subscription)

    def _admit(self, topic: str) -> None:
        """First publish to ``topic``: validate it and check the ACL, then remember it."""
        if self.closed:
            raise StateError(f"session {self.client_name!r} is closed")
        validate_topic(topic, self.vpn.topic_limits)
        self.check_publish_acl(topic)
        if len(self._admitted) >= _ADMITTED_CACHE:
            self._admitted.clear()
        self._admitted[topic] = None

    # --- subscriptions ------------------------------------------------------------

    def subscribe(self, subscription: str) -> None:
        """Add a subscription (a filter, ``#share/...`` or ``#noexport/...``).

        Subscribing twice to the same text is a no-op.

        :raises InvalidTopicError: the subscription is not valid (SPEC 1).
        :raises AccessDeniedError: the ACL profile denies it.
        :raises LimitExceededError: the client profile's ``max_subscriptions`` is reached,
            or a wildcard subscription would take the session over ``max_wildcard_levels``.
        """
        self._check_open()
        self._add_subscription(subscription, self)

    def unsubscribe(self, subscription: str) -> None:
        """Remove a subscription; removing one the session does not hold is a no-op."""
        self._check_open()
        sub = self._subscriptions.pop(subscription, None)
        if sub is not None:
            self._wildcard_levels -= wildcard_levels(sub.filter)  # in step with the pop
            self.vpn.node.plugins.unsubscribe(self, sub)

    def subscribe_for(self, client_name: str, subscription: str) -> None:
        """As a subscription manager, add a subscription to another session of this VPN.

        This session's ACL profile is checked, not the target's. The subscription
        then belongs to the target: it goes when the target closes, not when
        this session does.

        :raises AccessDeniedError: this session's username is not a subscription manager.
        :raises StateError: no open session has that client name.
        """
        self._check_open()
        target = self._manager_target(client_name, subscription)
        target._add_subscription(subscription, self)

    def unsubscribe_for(self, client_name: str, subscription: str) -> None:
        """As a subscription manager, remove a subscription from another session."""
        self._check_open()
        target = self._manager_target(client_name, subscription)
        target.unsubscribe(subscription)

    def _manager_target(self, client_name: str, subscription: str) -> Session:
        if not self.user.subscription_manager:
            self.denied += 1
            raise AccessDeniedError(
                self.username, "subscribe", subscription, "not a subscription manager"
            )
        target = self.vpn.sessions.get(client_name)
        if target is None:
            raise StateError(f"no open session named {client_name!r} in VPN {self.vpn.name!r}")
        return target

    def _add_subscription(self, text: str, checked_by: Session) -> None:
        if text in self._subscriptions:
            return
        sub = parse_subscription(text, self.vpn.topic_limits)
        if not checked_by._acl.may_subscribe(sub.filter):
            checked_by.denied += 1
            raise AccessDeniedError(checked_by.username, "subscribe", text)
        limit = self.client_profile.max_subscriptions
        if len(self._subscriptions) >= limit:
            raise LimitExceededError(
                f"session {self.client_name!r} already holds {limit} subscriptions", limit
            )
        # A publish may have to step through every level of a session's wildcard filters
        # (those that match a topic's first levels but not its last), so their levels in
        # all are what bounds the work one session adds to a publish; exact filters cost
        # one lookup however many there are.
        levels = wildcard_levels(sub.filter)
        budget = self.client_profile.max_wildcard_levels
        if levels and self._wildcard_levels + levels > budget:
            raise LimitExceededError(
                f"session {self.client_name!r} holds wildcard subscriptions of "
                f"{self._wildcard_levels} levels in all; {text!r} would add {levels}, over "
                f"client profile {self.client_profile.name!r}'s max_wildcard_levels of {budget}",
                budget,
            )
        self.vpn.node.plugins.subscribe(self, sub)
        self._subscriptions[text] = sub
        self._wildcard_levels += levels

    # --- receiving ------------------------------------------------------------------

    @property
    def egress(self) -> Egress:
        """The bounded buffer of messages waiting for this session's consumer."""
        return self._egress

    async def receive(self) -> Message:
        """Wait for the next message.

        :raises StateError: the session is closed, or it delivers to ``on_message``.
        """
        if not self._receivable:
            raise StateError("this session delivers to its on_message handler")
        message = await self._egress.get()
        self.delivered += 1
        return message

    def receive_nowait(self) -> Message | None:
        """The next waiting message, or ``None`` when there is none."""
        if not self._receivable:
            raise StateError("this session delivers to its on_message handler")
        message = self._egress.get_nowait()
        if message is not None:
            self.delivered += 1
        return message

    def __aiter__(self) -> Session:
        return self

    async def __anext__(self) -> Message:
        # Fast path, inlined from Egress.get_nowait: a waiting message is taken without
        # another frame or coroutine. The consumer waits only on an empty buffer, then
        # drains without checkpoints (see Egress). A pending discard indication takes
        # the slow path, so the copy leaves it out; tests/test_inline_copies.py compares
        # the fenced parts with their sources.
        queue = self._queue
        egress = self._egress
        if queue and self._receivable and not egress._discard_pending:
            # inline: meshbus._egress.Egress.get_nowait[take] begin
            # inline-with: self -> egress
            message = queue.popleft()
            egress._bytes -= message.size
            # inline: meshbus._egress.Egress.get_nowait[take] end
            # inline: meshbus._egress.Egress.get_nowait[drained] begin
            # inline-with: self -> egress
            if not queue and egress.on_drained is not None:
                egress.on_drained()
            # inline: meshbus._egress.Egress.get_nowait[drained] end
            self.delivered += 1
            return message
        try:
            return await self.receive()
        except StateError:
            if self.closed:
                raise StopAsyncIteration from None
            raise

    def _call_handler(self, message: Message) -> None:
        self.delivered += 1
        try:
            self._handler(message)  # type: ignore[misc]
        except Exception:
            self._handler_failed()

    def _handler_failed(self) -> None:
        self.handler_errors += 1
        if self.handler_errors == 1:  # log the first, count the rest: a loop must not flood logs
            log.exception(
                "message handler of session %r raised; further errors are only counted",
                self.client_name,
            )

    async def _pump(self) -> None:
        """Feed buffered messages to an async ``on_message``: one task per session."""
        handler = self._async_handler
        assert handler is not None
        egress = self._egress
        while True:
            try:
                message = await egress.get()
            except StateError:
                return
            self.delivered += 1
            try:
                await handler(message)
            except Exception:
                self._handler_failed()

    # --- lifecycle ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise StateError(f"session {self.client_name!r} is closed")

    def close(self) -> None:
        """Remove every subscription, drop buffered messages and log out. Idempotent."""
        if self.closed:
            return
        self.closed = True
        # A router may still hold this session in a match taken before the close
        # (an inline handler closed it mid-route): such deliveries go nowhere.
        self.deliver = self.sink = _drop
        plugins = self.vpn.node.plugins
        for sub in reversed(tuple(self._subscriptions.values())):
            plugins.unsubscribe(self, sub)
        self._subscriptions.clear()
        self._admitted.clear()
        self._egress.close()
        self.vpn._session_closed(self)

    async def aclose(self) -> None:
        """:meth:`close`, for code written for any session (see :class:`meshbus.abc.SessionAPI`)."""
        self.close()

    async def confirm(self) -> None:
        """Return at once: an in-process session applied every earlier call when it was
        made, and raised any refusal then (see :class:`meshbus.abc.SessionAPI`).

        :raises StateError: the session is closed.
        """
        self._check_open()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def statistics(self) -> SessionStatistics:
        """A snapshot of this session's counters."""
        return SessionStatistics(
            published=self.published,
            delivered=self.delivered,
            discarded=self._egress.discarded,
            denied=self.denied,
            handler_errors=self.handler_errors,
            egress_messages=len(self._egress),
            egress_bytes=self._egress.bytes,
            subscriptions=len(self._subscriptions),
        )


def _drop(message: Message) -> None:
    """``deliver`` of a closed session."""


def _send_options(
    persistent: bool,
    headers: Mapping[str, Any] | None,
    ttl: float | None,
    eliding_eligible: bool,
    reply_to: str | None,
    correlation_id: str | None,
) -> dict[str, Any]:
    check_ttl(ttl)
    copied = dict(headers) if headers else {}
    return {
        "persistent": persistent,
        "headers": copied,
        "ttl": ttl,
        "eliding_eligible": eliding_eligible,
        "reply_to": reply_to,
        "correlation_id": correlation_id,
        # What the headers and strings take in memory: part of the message's size.
        "size": held_size(copied, reply_to, correlation_id, HEADER_LIMITS),
    }


def check_ttl(ttl: object) -> None:
    """Refuse a TTL that is not a finite number >= 0 (``None`` is no TTL); used by
    remote sessions too, so both refuse the same values the same way."""
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 <= ttl < math.inf
    ):
        raise PublishRejectedError("invalid-ttl", f"ttl must be a finite number >= 0, not {ttl!r}")


def as_bytes(payload: object) -> bytes:
    """A payload as bytes: ``str`` is encoded as UTF-8 (remote sessions use it too)."""
    if isinstance(payload, str):
        return payload.encode("utf-8")
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    raise TypeError(f"payload must be bytes or str, not {type(payload).__name__}")
