"""Remote sessions: the :class:`~meshbus.Session` API, served by a node in another process.

``async with connect("tcp://127.0.0.1:55555") as session:`` logs in and keeps
the session alive: when the connection drops it reconnects with exponential
backoff (1 s doubling to 2 min, jittered, without limit), logs in again and
restores its subscriptions and flows. While it is away, direct publishes are
dropped and counted (direct messaging is at most once); guaranteed sends wait
and are sent again once it is back (at least once).

A client checks what it sends as the node will: headers against
:data:`meshbus.HEADER_LIMITS`, and every frame against the largest frame the node
said at login that it reads. What would not pass is refused locally with
:class:`~meshbus.PublishRejectedError` (``"too-large"``), so the node never has to
drop the connection over it, and a send waiting across a reconnect is checked
again against the node it reaches.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, suppress
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import attrs

from meshbus._egress import Egress
from meshbus._messages import Message
from meshbus._session import MessageHandler
from meshbus.errors import (
    AccessDeniedError,
    MeshbusError,
    ProtocolError,
    StateError,
    TransportError,
)

from . import _events as ev
from ._backoff import Backoff
from ._codec import (
    BATCH_LIMIT,
    PublishEntry,
    decode_deliver,
    decode_deliver_batch,
    decode_flow_deliver,
)
from ._connection import Connection, unwrap_errors
from ._dialing import ConnectSettings, Dialer, Target
from ._framing import FrameKind
from ._outgoing import (
    PUBLISH_OVERHEAD,
    encode_publishes,
    send_refusal,
)
from ._protocol import LinkProtocol
from ._remote_flow import RemoteFlow, Request
from ._session_calls import SessionCalls
from ._settings import MAX_FRAME_SIZE
from ._wire_errors import error_from

__all__ = ["RemoteSession", "connect"]

log = logging.getLogger("meshbus.transports")

K = FrameKind
_DELIVER = int(K.DELIVER)
_DELIVER_BATCH = int(K.DELIVER_BATCH)
_FLOW_DELIVER = int(K.FLOW_DELIVER)
_OK = int(K.OK)
_ERROR = int(K.ERROR)


class RemoteSession(SessionCalls):
    """A session on a node reached over the network: the same calls as :class:`meshbus.Session`.

    Use it as ``async with connect(url, ...) as session:``; see :func:`connect`.
    """

    def __init__(
        self, settings: ConnectSettings, *, on_message: MessageHandler | None = None
    ) -> None:
        if not isinstance(settings, ConnectSettings):
            raise TypeError(f"expected ConnectSettings, got {settings!r}")
        #: How the session reaches and logs in to its node.
        self.settings = settings
        self._dialer = Dialer(settings)
        self.client_name: str | None = settings.client_name
        #: The largest frame the node reads, as it said at the last login.
        self.node_max_frame_size = MAX_FRAME_SIZE
        self._publish_room = MAX_FRAME_SIZE - PUBLISH_OVERHEAD  # payload + options, unchecked
        self._egress = Egress(settings.max_buffered_messages, settings.max_buffered_bytes)
        self._handler: Callable[[Message], None] | None = None
        self._async_handler: Callable[[Message], Awaitable[None]] | None = None
        if on_message is not None:
            if not callable(on_message):
                raise TypeError(f"on_message must be callable, got {on_message!r}")
            if inspect.iscoroutinefunction(on_message):
                self._async_handler = on_message
            else:
                self._handler = on_message  # type: ignore[assignment]
        self._subscriptions: dict[str, None] = {}
        self._admitted: dict[str, None] = {}  # topics already validated (bounded)
        self._pending: list[PublishEntry] = []  # publishes the writer has not encoded yet
        self._pending_bytes = 0
        # Acks the writer has not encoded yet, per flow number: one ACK frame per flow
        # and write instead of one per message.
        self._acks: dict[int, list[int]] = {}
        self._requests: dict[int, Request] = {}
        self._ids = itertools.count(1)
        self._flows: dict[int, RemoteFlow] = {}
        self._flow_list: list[RemoteFlow] = []
        self._connection: Connection | None = None
        self._protocol: LinkProtocol | None = None
        self._connected = False
        self._closing = False
        self.closed = False
        #: Why the session closed itself: the connection was lost and ``reconnect`` is off
        #: (a :class:`~meshbus.errors.TransportError` saying ``connection to URL lost: ...``,
        #: caused by what ended it). ``None`` while open and after the application closed it.
        self.lost: TransportError | None = None
        self._kick = anyio.Event()
        # Set after the writer's next write; made by flush() only when someone waits.
        self._written: anyio.Event | None = None
        self._stack: AsyncExitStack | None = None
        self._supervisor_scope = anyio.CancelScope()
        self._supervisor_done = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._deferred: deque[MeshbusError] = deque(maxlen=100)
        #: What the node said at the last login (client name, keepalive, compression).
        self.welcome: dict[str, Any] = {}
        self.published = 0
        self.delivered = 0
        self.dropped = 0  # direct publishes made while disconnected
        self.errors = 0  # errors the node reported for publishes and subscriptions
        self.connects = 0
        self.connect_failures = 0  # reconnect attempts that failed
        self.handler_errors = 0

    def __repr__(self) -> str:
        state = "closed" if self.closed else "connected" if self._connected else "reconnecting"
        return f"<RemoteSession {self.client_name!r} {self.url} vpn={self.vpn!r} {state}>"

    @property
    def url(self) -> str:
        """The node's target the session is (or was last) connected to."""
        return self._dialer.target

    @property
    def vpn(self) -> str:
        """The Message VPN the session logs in to."""
        return self.settings.vpn

    @property
    def username(self) -> str | None:
        """The client username it logs in with."""
        return self.settings.username

    @property
    def backoff(self) -> Backoff:
        """Its reconnect delays, with the attempts made since the last login."""
        return self._dialer.backoff

    # --- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> RemoteSession:
        if self._stack is not None:
            raise StateError("a RemoteSession can be entered only once")
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            await self._open_connection()
        except BaseException:
            self.closed = True
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
            await stack.aclose()
            raise
        self._stack = stack
        self._tg.start_soon(self._supervise)
        if self._async_handler is not None:
            self._tg.start_soon(self._pump)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
        if self._stack is not None:  # the task group is left where it was entered
            await self._stack.aclose()

    async def aclose(self) -> None:
        """Write what is buffered, log out and close. Idempotent; callable from any task."""
        if not self.closed:
            await self._shut_down(wait_for_tasks=True)

    async def _shut_down(self, *, wait_for_tasks: bool) -> None:
        self._closing = True
        connection = self._connection
        if connection is not None and self._connected:
            self._encode_pending()  # what the application published or acked just before
            with anyio.move_on_after(5), suppress(TransportError):
                await connection.flush()
            await connection.send_close("client closed the session")
        self.closed = True
        self._connected = False
        self._egress.close()
        for flow in self._flow_list:
            flow.unbound = True
            flow._arrived.set()
        self._fail_requests(StateError("the session is closed"))
        # Only the session's own tasks: the task that entered the session is not cancelled,
        # so aclose() works from any task and inside any cancel scope.
        self._supervisor_scope.cancel()
        if wait_for_tasks:
            # A reader must not see its stream closed under it (trio refuses that).
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._supervisor_done.wait()
        if connection is not None:
            await connection.aclose()

    async def _open_connection(self) -> None:
        """Connect, log in and restore state; raises on failure."""
        connection, welcome = await self._dialer.login(self.settings.hello(self.client_name))
        protocol = connection.protocol
        assert isinstance(welcome, ev.Welcome)
        self.client_name = welcome.client_name or self.client_name
        self.welcome = attrs.asdict(welcome)
        self._connection = connection
        self._protocol = protocol
        self._connected = True
        self.connects += 1
        self._dialer.backoff.reset()
        self.node_max_frame_size = protocol.peer_max_frame_size
        self._publish_room = protocol.peer_max_frame_size - PUBLISH_OVERHEAD
        self._restore()  # checks waiting sends against this node's limit
        for frame in connection.early:
            self._on_frame(*frame)
        await connection.flush()

    def _restore(self) -> None:
        """Queue what the node must know again after a (re)login."""
        pending = sorted(self._requests.items())
        self._requests = {}
        for subscription in self._subscriptions:
            self._send_request(Request((K.SUBSCRIBE, {"subscription": subscription}, b"")))
        self._flows.clear()
        for flow in self._flow_list:
            self._send_request(Request((K.BIND, dict(flow._bind), b""), flow))
        for _, request in pending:
            if request.frame[0] in (K.SUBSCRIBE, K.UNSUBSCRIBE, K.UNBIND):
                # What they changed was restored as a whole just above.
                request.result = {}
                request.done.set()
            else:  # guaranteed sends, binds and requests in flight: again, with new ids
                kind, header, payload = request.frame
                if kind == K.SEND and request.sent:
                    # The node may have stored it and its answer be what was lost: the
                    # copy it stores now is flagged (SPEC 4: never twice without the flag).
                    request.frame = (kind, {**header, "rd": True}, payload)
                self._send_request(request)

    # --- the connection's tasks ---------------------------------------------------------

    async def _supervise(self) -> None:
        try:
            with self._supervisor_scope:
                await self._keep_connected()
        finally:
            self._supervisor_done.set()

    async def _keep_connected(self) -> None:
        while not self.closed:
            why: MeshbusError = TransportError("the connection ended")
            try:
                with unwrap_errors():
                    async with anyio.create_task_group() as tg:
                        connection = self._connection
                        assert connection is not None  # _connect set it, or raised
                        tg.start_soon(self._writer)
                        tg.start_soon(self._keepalive, connection)
                        await self._reader()
                        tg.cancel_scope.cancel()
            except (TransportError, ProtocolError) as exc:
                if self._closing:
                    return
                log.warning("connection to %s lost: %s", self.url, exc)
                why = exc
            if self._closing:
                return
            await self._lost(why)

    async def _lost(self, why: MeshbusError) -> None:
        self._connected = False
        self._acks = {}  # for the old connection's flow numbers: the node gives them back
        for flow in self._flow_list:  # the node gives their messages back: they come again
            flow._rebound(0)
        if self._connection is not None:
            await self._connection.aclose()
        if not self.settings.reconnect:
            lost = TransportError(f"connection to {self.url} lost: {why}")
            lost.__cause__ = why
            self.lost = lost
            self._fail_requests(lost)
            await self._shut_down(wait_for_tasks=False)  # this task is the supervisor
            return
        while not self._closing:
            log.info("reconnecting to %s", self.url)
            await self._dialer.wait()
            try:
                await self._open_connection()
                log.info("reconnected to %s as %s", self.url, self.client_name)
                return
            except (TransportError, AccessDeniedError, ProtocolError) as exc:
                self.connect_failures += 1
                log.warning("reconnecting to %s failed: %s", self.url, exc)

    async def _reader(self) -> None:
        connection = self._connection
        assert connection is not None
        protocol = connection.protocol
        on_frame = self._on_frame
        egress_push = self._egress.push
        handler = self._handler

        def received(frames: list[tuple[int, Any, bytes]]) -> None:  # never gives back
            for kind, header, payload in frames:
                if kind == _DELIVER_BATCH:
                    messages = decode_deliver_batch(header, payload)
                elif kind == _DELIVER:
                    messages = [decode_deliver(header, payload)]
                else:
                    on_frame(kind, header, payload)
                    continue
                if handler is None:
                    for message in messages:
                        egress_push(message)
                else:
                    for message in messages:
                        self.delivered += 1
                        try:
                            handler(message)
                        except Exception:
                            self._handler_failed()
            if protocol.out:
                self._kick.set()

        await connection.receive_into(received)
        if not self._closing:
            raise TransportError(f"node closed the connection: {protocol.close_reason}")

    def _on_frame(self, kind: int, event: Any, payload: bytes) -> None:
        if kind == _DELIVER:
            self._egress.push(decode_deliver(event, payload))
        elif kind == _FLOW_DELIVER:
            number, message = decode_flow_deliver(event, payload, self._dialer.clock.time())
            flow = self._flows.get(number)
            if flow is not None:
                flow._push(message)
        elif isinstance(event, ev.ErrorAnswer):
            request = self._requests.pop(event.id, None) if type(event.id) is int else None
            error = error_from(event.header)
            if request is None:
                self._defer(error)
                return
            if request.frame[0] == K.SUBSCRIBE and not self.closed:
                # Refused: forget it (not restored) and report it at confirm().
                self._subscriptions.pop(request.frame[1]["subscription"], None)
                self._defer(error)
            elif request.deferred and not self.closed:
                self._defer(error)
            elif request.flow is not None and request.flow in self._flow_list:
                log.warning("could not bind %r again: %s", request.flow, error)
                self._flow_list.remove(request.flow)
                request.flow.unbound = True
                request.flow._arrived.set()
            request.result = error
            request.done.set()
        elif isinstance(event, ev.Ok):
            request = self._requests.pop(event.id, None) if type(event.id) is int else None
            if request is None:
                return
            flow = request.flow
            if flow is not None:
                bound = event.result.get("flow")
                if type(bound) is int:
                    flow._rebound(bound)
                    self._flows[bound] = flow
            request.result = event.result
            request.body = payload
            request.done.set()
        elif isinstance(event, ev.FlowClosed):
            flow = self._flows.pop(event.flow, None) if type(event.flow) is int else None
            if flow is not None:
                flow.unbound = True
                flow._arrived.set()
                if flow in self._flow_list:
                    self._flow_list.remove(flow)

    def _defer(self, error: MeshbusError) -> None:
        self.errors += 1
        if self.errors == 1:
            log.warning("node reported an error for session %r: %s", self.client_name, error)
        self._deferred.append(error)

    async def _writer(self) -> None:
        connection = self._connection
        assert connection is not None
        protocol = connection.protocol
        while True:
            await self._kick.wait()
            self._kick = anyio.Event()
            written, self._written = self._written, None  # those waiting for this write
            # A receive() that was about to wait has usually written what the publish
            # that kicked us buffered (_write_before_waiting): then there is nothing left.
            if self._pending or self._acks or protocol.out:
                self._encode_pending()
                await connection.flush()
            if written is not None:
                written.set()

    async def _keepalive(self, connection: Connection) -> None:
        interval = float(self.welcome["keepalive"])
        timeout = float(self.welcome["keepalive_timeout"])
        # self._kick is replaced by the writer at every wake: look it up at each ping.
        await connection.keep_alive(interval, timeout, lambda: self._kick.set())

    async def _pump(self) -> None:
        handler = self._async_handler
        assert handler is not None
        while True:
            try:
                message = await self._egress.get()
            except StateError:
                return
            self.delivered += 1
            try:
                await handler(message)
            except Exception:
                self._handler_failed()

    def _handler_failed(self) -> None:
        self.handler_errors += 1
        if self.handler_errors == 1:
            log.exception("message handler of %r raised; further errors are only counted", self)

    # --- requests -----------------------------------------------------------------------

    def _encode_pending(self) -> None:
        """Move buffered acks and publishes into the protocol's output, as one ACK frame
        per flow and batch frames."""
        protocol = self._protocol
        if protocol is None:
            return
        if self._acks:
            acks, self._acks = self._acks, {}
            for number, ids in acks.items():
                protocol.send(K.ACK, {"flow": number, "ids": ids})
        pending = self._pending
        if not pending:
            return
        out = protocol.out
        for start in range(0, len(pending), BATCH_LIMIT):
            chunk = pending[start : start + BATCH_LIMIT]
            # Published for a node that read more, before a reconnect, some may not fit:
            # they are dropped and reported like a refusal from the node.
            for refusal in encode_publishes(chunk, out, self.node_max_frame_size, self.url):
                self._defer(refusal)
        pending.clear()
        self._pending_bytes = 0

    def _ack(self, flow: int, message_id: int) -> None:
        """Buffer the ack of ``message_id`` on the flow numbered ``flow``: the writer sends
        the acks of a turn as one frame per flow."""
        if not self._connected or self._protocol is None:
            return  # as a frame would be: the node gives the message back
        if self._pending:
            self._encode_pending()  # keep the order the application made its calls in
        ids = self._acks.get(flow)
        if ids is None:
            self._acks[flow] = [message_id]
            self._kick.set()
        else:
            ids.append(message_id)

    def _send_frame(self, kind: FrameKind, header: dict[str, Any], payload: bytes = b"") -> None:
        if self._connected and self._protocol is not None:
            self._encode_pending()  # keep the order the application made its calls in
            self._protocol.send(kind, header, payload)
            self._kick.set()

    def _send_request(self, request: Request) -> int:
        """Send ``request`` now (or once connected); 0 when it is refused at once."""
        kind, header, payload = request.frame
        if kind == K.SEND:
            refusal = send_refusal(header, payload, self.node_max_frame_size, self.url)
            if refusal is not None:  # the node would close the connection over it
                request.result = refusal
                request.done.set()
                return 0
        request_id = next(self._ids)
        self._requests[request_id] = request
        if self._connected and self._protocol is not None:
            self._encode_pending()  # keep the order the application made its calls in
            self._protocol.send(kind, {**header, "id": request_id}, payload)
            request.sent = True
            self._kick.set()
        return request_id

    async def _request(
        self, kind: FrameKind, header: dict[str, Any], payload: bytes = b""
    ) -> dict[str, Any]:
        return (await self._answer(kind, header, payload))[0]

    async def _answer(
        self, kind: FrameKind, header: dict[str, Any], payload: bytes = b""
    ) -> tuple[dict[str, Any], bytes]:
        """Send a request; its answer's fields and payload, or its error raised."""
        self._check_open()
        request = Request((kind, header, payload))
        self._send_request(request)
        await request.done.wait()
        result = request.result
        if isinstance(result, MeshbusError):
            raise result
        assert result is not None
        return result, request.body

    def _fail_requests(self, error: MeshbusError) -> None:
        requests, self._requests = self._requests, {}
        for request in requests.values():
            request.result = error
            request.done.set()

    def _check_open(self) -> None:
        if self.closed or self._closing:
            raise StateError(f"remote session {self.client_name!r} is closed")


def connect(
    *targets: Target, on_message: MessageHandler | None = None, **settings: Any
) -> RemoteSession:
    """A session on the node at ``targets`` (tried in order); log in with ``async with``::

        async with connect("tcp://127.0.0.1:55555", username="alice", password="...") as s:
            s.subscribe("orders/>")
            async for message in s:
                ...

    :param targets: ``tcp://host:port`` or ``tls://host:port`` URLs, or anyio
        connectables (an in-memory network's, say); the first that answers serves.
    :param on_message: a handler called for each direct message instead of buffering
        it (see :meth:`meshbus.Node.connect`).
    :param settings: the fields of :class:`ConnectSettings` (``vpn``, ``username``,
        ``password``, ``client_name``, ``no_local``, ``timestamps``, ``tls``,
        ``compression``, ``reconnect``, ``backoff``, ``connect_timeout``, ...).
    :raises AuthenticationError: the node refused the login (on ``async with``).
    :raises TransportError: the node could not be reached (on ``async with``).
    :raises ConfigurationError: a setting is invalid.
    :raises TypeError: a setting :class:`ConnectSettings` does not have.
    """
    return RemoteSession(ConnectSettings(targets, **settings), on_message=on_message)
