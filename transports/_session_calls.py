"""The calls an application makes on a :class:`~meshbus.transports.RemoteSession`.

:class:`SessionCalls` holds the session API (publishing, subscribing, receiving,
guaranteed sends and binds, service calls and statistics); :class:`RemoteSession`
inherits it and supplies the connection they go over: its state, the buffer of
publishes, and the requests awaiting the node's answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self, cast

import anyio
import attrs

from meshbus._egress import Egress
from meshbus._messages import Message
from meshbus._session import as_bytes, check_ttl
from meshbus._topics import parse_subscription, validate_topic
from meshbus.errors import (
    InvalidTopicError,
    LimitExceededError,
    MeshbusError,
    ProtocolError,
    StateError,
    TransportError,
)

from ._framing import FrameKind
from ._outgoing import check_publish, send_header, wire_options
from ._remote_flow import RemoteFlow, Request

if TYPE_CHECKING:
    from ._client import RemoteSession
    from ._codec import PublishEntry
    from ._connection import Connection
    from ._dialing import ConnectSettings
    from ._protocol import LinkProtocol

__all__ = ["RemoteSessionStatistics", "SessionCalls"]

K = FrameKind


@attrs.frozen
class RemoteSessionStatistics:
    """The counters of a :class:`~meshbus.transports.RemoteSession`, as the client
    keeps them (see :meth:`~meshbus.transports.RemoteSession.statistics`)."""

    published: int
    """Direct messages published while connected."""
    delivered: int
    """Direct messages handed to the application (``receive`` or ``on_message``)."""
    dropped: int
    """Direct messages published while disconnected (dropped: at most once)."""
    errors: int
    """Refusals the node reported for calls nobody awaited (publishes, subscriptions)."""
    handler_errors: int
    """Exceptions raised by the ``on_message`` handler."""
    discarded: int
    """Messages the session's own buffer discarded, its oldest first, when full."""
    buffered_messages: int
    """Messages waiting in the session's buffer for the application."""
    buffered_bytes: int
    """Their bytes."""
    subscriptions: int
    """Subscriptions held (restored after each reconnect)."""
    flows: int
    """Flows bound (bound again after each reconnect)."""
    connected: bool
    """Whether it is logged in now."""
    connects: int
    """Logins, the first one and each reconnect's."""
    connect_failures: int
    """Reconnect attempts that failed."""


class SessionCalls:
    """The session API of a remote session, over the connection its subclass keeps."""

    # What RemoteSession sets up and keeps (see its __init__).
    settings: ConnectSettings
    client_name: str | None
    closed: bool
    node_max_frame_size: int
    _publish_room: int
    _egress: Egress
    _handler: Any
    _async_handler: Any
    _subscriptions: dict[str, None]
    _admitted: dict[str, None]
    _pending: list[PublishEntry]
    _pending_bytes: int
    _acks: dict[int, list[int]]
    _flow_list: list[RemoteFlow]
    _connection: Connection | None
    _protocol: LinkProtocol | None
    _connected: bool
    _deferred: Any
    _kick: Any
    _written: Any
    published: int
    delivered: int
    dropped: int
    errors: int
    handler_errors: int
    connects: int
    connect_failures: int

    if TYPE_CHECKING:  # RemoteSession's, over its connection

        def _check_open(self) -> None: ...
        def _send_request(self, request: Request) -> int: ...
        def _encode_pending(self) -> None: ...
        async def _request(
            self, kind: FrameKind, header: dict[str, Any], payload: bytes = b""
        ) -> dict[str, Any]: ...
        async def _answer(
            self, kind: FrameKind, header: dict[str, Any], payload: bytes = b""
        ) -> tuple[dict[str, Any], bytes]: ...
        @property
        def url(self) -> str: ...

    @property
    def connected(self) -> bool:
        """Whether the session is logged in now (``False`` while reconnecting)."""
        return self._connected

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """The subscriptions this session holds (restored after each reconnect)."""
        return tuple(self._subscriptions)

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
        """Publish a direct message: buffered and written by a background task.

        The node's refusal (ACL) arrives later: it is counted in :attr:`errors`
        and raised by the next :meth:`confirm`.

        :raises InvalidTopicError: the topic is not valid.
        :raises PublishRejectedError: the headers are over :data:`meshbus.HEADER_LIMITS`,
            the ``ttl`` is not a finite number >= 0 (``"invalid-ttl"``), or the message
            is larger than the node reads (``"too-large"``).
        :raises TypeError: the headers are not JSON-serializable.
        :raises LimitExceededError: more than ``max_send_buffer`` bytes are waiting to
            be written (``await session.flush()`` and publish again).
        :raises StateError: the session is closed.
        """
        protocol = self._protocol
        if not self._connected or protocol is None:
            self._check_open()
            self.dropped += 1
            return
        if type(payload) is not bytes:
            payload = as_bytes(payload)
        if self._pending_bytes > self.settings.max_send_buffer:
            raise LimitExceededError(
                "the send buffer is full: await session.flush()", self.settings.max_send_buffer
            )
        if topic not in self._admitted:
            validate_topic(topic)  # raises with the reason
            if len(self._admitted) >= 4096:
                self._admitted.clear()
            self._admitted[topic] = None
        size = len(payload)
        if (
            headers is None
            and not eliding_eligible
            and reply_to is None
            and correlation_id is None
            and not retain
            and ttl is None
        ):
            if size > self._publish_room:  # near the node's frame limit: measure the frame
                check_publish(topic, payload, None, self.node_max_frame_size, self.url)
            self._pending.append((topic, payload, None))
        else:
            options, extra = wire_options(headers, eliding_eligible, reply_to, correlation_id)
            if retain:
                options["rt"] = True
                extra += 10
            if ttl is not None:
                check_ttl(ttl)
                if ttl:  # the time it has left: the node counts it from when it reads it
                    options["x"] = ttl
                    extra += 30
            size += extra
            if size > self._publish_room:
                check_publish(topic, payload, options, self.node_max_frame_size, self.url)
            self._pending.append((topic, payload, options))
        self._pending_bytes += size
        self.published += 1
        self._kick.set()

    async def flush(self) -> None:
        """Wait until everything buffered so far has been written to the connection."""
        self._check_open()
        protocol = self._protocol
        if (
            self._connected
            and protocol is not None
            and (protocol.out or self._pending or self._acks)
        ):
            written = self._written
            if written is None:
                written = self._written = anyio.Event()
            self._kick.set()
            await written.wait()

    async def confirm(self) -> None:
        """Round trip to the node; raise the first error it reported since the last call.

        Subscriptions, unsubscriptions and publishes are sent without waiting;
        after ``await session.confirm()`` all of them sent before it were applied.
        """
        await self._request(K.REQUEST, {"what": "sync"})
        if self._deferred:
            error = self._deferred.popleft()
            self._deferred.clear()
            raise error

    def subscribe(self, subscription: str) -> None:
        """Add a subscription (kept across reconnects). The node's answer comes later:
        a refusal is raised by :meth:`confirm`.

        :raises InvalidTopicError: the subscription is not valid (checked here first).
        """
        self._check_open()
        parse_subscription(subscription)
        if subscription in self._subscriptions:
            return
        self._subscriptions[subscription] = None
        request = Request((K.SUBSCRIBE, {"subscription": subscription}, b""))
        self._send_request(request)

    def subscribe_for(self, client_name: str, subscription: str) -> None:
        """As a subscription manager, add a subscription to another session of this
        VPN, named by its client name (see :meth:`meshbus.Session.subscribe_for`).

        The node applies it with this session's ACL profile, as for an in-process
        manager; the subscription then belongs to the target session (it is not
        restored by this one after a reconnect). Sent without waiting, as
        :meth:`subscribe` is: a refusal (:class:`~meshbus.errors.AccessDeniedError`,
        not a manager or denied by the ACL; :class:`~meshbus.errors.StateError`, no
        such session; :class:`~meshbus.errors.LimitExceededError`) is raised by the
        next :meth:`confirm`.

        :raises InvalidTopicError: the subscription is not valid (checked here first).
        :raises StateError: this session is closed.
        """
        self._check_open()
        parse_subscription(subscription)
        self._send_for("subscribe_for", client_name, subscription)

    def unsubscribe_for(self, client_name: str, subscription: str) -> None:
        """As a subscription manager, remove a subscription from another session;
        sent without waiting, a refusal is raised by the next :meth:`confirm`."""
        self._check_open()
        self._send_for("unsubscribe_for", client_name, subscription)

    def _send_for(self, what: str, client_name: str, subscription: str) -> None:
        if type(client_name) is not str:
            raise TypeError(f"client_name must be a str, not {type(client_name).__name__}")
        header = {"what": what, "client": client_name, "subscription": subscription}
        self._send_request(Request((K.REQUEST, header, b""), deferred=True))

    def unsubscribe(self, subscription: str) -> None:
        """Remove a subscription; removing one the session does not hold is a no-op
        (as for :meth:`meshbus.Session.unsubscribe`)."""
        self._check_open()
        if subscription not in self._subscriptions:
            return
        del self._subscriptions[subscription]
        request = Request((K.UNSUBSCRIBE, {"subscription": subscription}, b""))
        self._send_request(request)

    async def receive(self) -> Message:
        """Wait for the next message. :raises StateError: closed, or ``on_message`` is set."""
        if self._handler is not None or self._async_handler is not None:
            raise StateError("this session delivers to its on_message handler")
        message = self._egress.get_nowait()  # no await while messages are waiting
        if message is None:
            await self._write_before_waiting()
            message = await self._egress.get()
        self.delivered += 1
        return message

    async def _write_before_waiting(self) -> None:
        """About to wait: write what is buffered now rather than in the writer's turn.

        A request followed by a wait for its reply saves one scheduling pass this way,
        and a second one on streams that can be written without an await.
        """
        connection = self._connection
        if (
            self._connected
            and connection is not None
            and (self._pending or self._acks or connection.protocol.out)
        ):
            self._encode_pending()
            if connection.flush_nowait():  # no scheduling pass, where the stream allows
                return
            with contextlib.suppress(TransportError):  # the reader sees it too, and reconnects
                await connection.flush()

    def receive_nowait(self) -> Message | None:
        """The next waiting message, or ``None``."""
        message = self._egress.get_nowait()
        if message is not None:
            self.delivered += 1
        return message

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except StateError:
            if self.closed:
                raise StopAsyncIteration from None
            raise

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
        """Publish a guaranteed message; returns once the node holds it (SPEC 4).

        :raises PublishRejectedError: the node refused it, or it is larger than the
            node reads (refused here, ``"too-large"``), or its headers are over
            :data:`meshbus.HEADER_LIMITS`.
        """
        validate_topic(topic)
        header = send_header(persistent, headers, ttl, eliding_eligible, reply_to, correlation_id)
        header["topic"] = topic
        if retain:
            header["rt"] = True
        await self._request(K.SEND, header, as_bytes(payload))

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
        """Publish a guaranteed message to one queue by name."""
        header = send_header(persistent, headers, ttl, False, reply_to, correlation_id)
        header["queue"] = queue
        await self._request(K.SEND, header, as_bytes(payload))

    async def send_many(
        self,
        messages: Iterable[tuple[str, bytes | bytearray | memoryview | str]],
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
    ) -> list[Exception | None]:
        """Publish many guaranteed messages, pipelined; one result per message, in order."""
        self._check_open()
        base = send_header(persistent, headers, ttl, False, None, None)
        requests: list[Request | Exception] = []
        for topic, payload in messages:
            try:
                validate_topic(topic)
            except InvalidTopicError as exc:
                requests.append(exc)
                continue
            request = Request((K.SEND, {**base, "topic": topic}, as_bytes(payload)))
            self._send_request(request)
            requests.append(request)
        results: list[Exception | None] = []
        for sent in requests:
            if isinstance(sent, Exception):
                results.append(sent)
                continue
            await sent.done.wait()
            result = sent.result
            results.append(result if isinstance(result, MeshbusError) else None)
        return results

    async def bind(self, queue: str, *, window: int = 255) -> RemoteFlow:
        """Bind a flow to a queue on the node (re-bound after each reconnect)."""
        return await self._bind_flow({"queue": queue, "window": window}, window)

    async def bind_topic_endpoint(
        self, endpoint: str, subscription: str, *, window: int = 255
    ) -> RemoteFlow:
        """Bind a flow to a topic endpoint on the node, naming its subscription."""
        bind = {"endpoint": endpoint, "subscription": subscription, "window": window}
        return await self._bind_flow(bind, window)

    async def _bind_flow(self, bind: dict[str, Any], window: int) -> RemoteFlow:
        self._check_open()
        flow = RemoteFlow(cast("RemoteSession", self), bind, window)  # this mixin's host
        request = Request((K.BIND, bind, b""), flow)
        self._send_request(request)
        await request.done.wait()
        if isinstance(request.result, MeshbusError):
            raise request.result
        if not flow.number:
            raise ProtocolError("BIND answer has no flow number")
        self._flow_list.append(flow)
        return flow

    async def call(
        self, service: str, args: dict[str, Any] | None = None, body: bytes = b""
    ) -> tuple[dict[str, Any], bytes]:
        """Call a service a plugin on the node provides (:meth:`meshbus.Node.provide_service`)
        with ``args`` (a JSON object) and ``body``; the answer's fields and body.

        :raises MeshbusError: the error the service raised (``StateError``: no such service).
        """
        header = {"what": "call", "service": service, "args": args or {}}
        return await self._answer(K.REQUEST, header, body)

    def statistics(self) -> RemoteSessionStatistics:
        """A snapshot of this session's own counters, as the client counts them.

        These are the client's figures (what it published, took from its buffer,
        dropped while away, ...). The node's view of the session's VPN is
        ``await`` :meth:`node_statistics`.
        """
        egress = self._egress
        return RemoteSessionStatistics(
            published=self.published,
            delivered=self.delivered,
            dropped=self.dropped,
            errors=self.errors,
            handler_errors=self.handler_errors,
            discarded=egress.discarded,
            buffered_messages=len(egress),
            buffered_bytes=egress.bytes,
            subscriptions=len(self._subscriptions),
            flows=len(self._flow_list),
            connected=self._connected,
            connects=self.connects,
            connect_failures=self.connect_failures,
        )

    async def node_statistics(self) -> dict[str, Any]:
        """The node's statistics as ``meshbus stats`` prints them: this session's VPN,
        or, for a username with the management role, also the node's totals, every
        VPN and every listener."""
        result = await self._request(K.REQUEST, {"what": "stats"})
        stats = result.get("result")
        if not isinstance(stats, dict):
            raise ProtocolError("statistics answer is malformed")
        return stats
