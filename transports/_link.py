"""Links over connections: a :class:`~meshbus.Link` whose peer is a VPN on another node.

A :class:`WireLink` runs over one connection in link mode (see
:mod:`meshbus.transports._protocol`). Either node may have opened it: the one that
dials (:func:`open_link`, with :class:`ConnectSettings`, reconnecting with backoff
on its node's clock) or the one whose listener accepted it (:func:`start_server`
does that by itself when a HELLO names a link). Once the connection is up the two
sides are alike:

* what this side **wants** from the peer (:meth:`WireLink.want`) goes out as
  SUBSCRIBE requests, told again after every reconnect; the peer's SUBSCRIBEs
  become the link's interest here (checked against the ACL of the user the peer
  logged in as), so the VPN's link router sends it what matches, as DELIVER frames
  that keep each message's sender, timestamp, origin and hop count;
* **guaranteed** messages cross in two ways: this side binds a flow to a queue of
  the peer (:meth:`WireLink.pull`) and acknowledges each message only once it is
  spooled to every matching endpoint here, retrying on a timer while an endpoint
  refuses it (that flow waits; the others and direct messages go on); or the peer
  SENDs one and gets OK once it is spooled here, or ERROR to send it again later;
* **ADVERTISE** frames (a plugin's routing interest) are checked for gaps and handed
  to :attr:`WireLink.on_advertise`.

The link's state follows its connection: ``connecting``, ``syncing`` until the peer
has answered what this side asked for, ``in-sync``, and ``backoff`` between attempts.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.lowlevel

from meshbus._crossing import with_mode
from meshbus._links import Link, LinkState
from meshbus._messages import HEADER_LIMITS, DeliveryMode, Envelope, Message
from meshbus._topics import parse_endpoint_subscription, parse_subscription
from meshbus.errors import (
    AccessDeniedError,
    MeshbusError,
    ProtocolError,
    PublishRejectedError,
    StateError,
    TransportError,
)

from . import _events as ev
from ._answering import Answers, ServedFlows
from ._codec import (
    FrameTooLarge,
    decode_deliver,
    decode_deliver_batch,
    decode_flow_deliver,
    encode_deliver_batch,
)
from ._connection import REST, STEP_MESSAGES, Connection, Frames, unwrap_errors
from ._dialing import ConnectSettings
from ._framing import FrameKind
from ._link_adverts import Advertising
from ._link_asks import Asking
from ._link_dialing import dial
from ._link_guaranteed import GuaranteedFromPeer, Pull
from ._link_sends import link_send_header
from ._protocol import ConnectionState
from ._serving import write_through_of
from ._wire_errors import error_from

if TYPE_CHECKING:
    from meshbus._acl import AclChecker
    from meshbus._profiles import ClientProfile
    from meshbus._session import Session
    from meshbus._vpn import Vpn
    from meshbus.abc import Flow

__all__ = ["WireLink", "open_link"]

_DIRECT = DeliveryMode.DIRECT
log = logging.getLogger("meshbus.links")

K = FrameKind
_DELIVER = int(K.DELIVER)
_DELIVER_BATCH = int(K.DELIVER_BATCH)
_FLOW_DELIVER = int(K.FLOW_DELIVER)
_MAX_PIPELINED_SENDS = 4096  # the peer's SENDs waiting for the spool before reading pauses
_MAX_PIPELINED_BYTES = 64 * 1024 * 1024  # and their payload bytes

AdvertiseHandler = Callable[["WireLink", ev.Advertise], None]
"""Called with each ADVERTISE the peer sent, once it is known to follow the last one."""


class _Answer:
    """An answer this side waits for, to one of its own requests."""

    __slots__ = ("done", "error", "on_ok", "result")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: dict[str, Any] = {}
        self.error: MeshbusError | None = None
        #: Called with an OK's result as it is read, before the frames after it are
        #: (a flow's messages may follow its BIND's OK in the same read).
        self.on_ok: Callable[[dict[str, Any]], None] | None = None


class WireLink(Asking, Advertising, GuaranteedFromPeer, Link):
    """A link to a VPN of another node, over one connection at a time.

    Make one with :func:`open_link` (this node dials) or let a listener accept one.

    :param settings: where the peer is and how to log in to it (the dialling side);
        ``None`` for a link a listener accepted.
    :param session: the session the peer logged in to (accepted links): its ACL
        checks the peer's interest and publishes, and it holds the flows the peer
        binds. A dialling link opens its own session the first time the peer binds.
    :param retry_interval: seconds between attempts to spool a pulled message that an
        endpoint refused.
    :param max_pending_bytes: bytes of messages queued for the peer before
        :meth:`send` refuses more (counted as forward failures).
    :param stable_period: seconds a connection must stay up before the delay
        between reconnects starts again from its shortest (SPEC 7).
    :param peer_login: what the peer said of itself in its HELLO (accepted links).
    :param fail_back: while connected to a target other than the first, try the
        better-ordered ones every this many seconds and move to the first that takes
        the login (``None``: stay until the connection ends).
    :param drain_timeout: seconds (on the node's clock) that a connection being closed
        on purpose (:meth:`stop`, the node or the listener stopping, a move to another
        connection) gets to write what the link had taken for the peer before it is
        cut; 0 cuts it at once.
    """

    def __init__(
        self,
        vpn: Vpn,
        name: str,
        *,
        kind: str = "bridge",
        settings: ConnectSettings | None = None,
        session: Session | None = None,
        acl: AclChecker | None = None,
        dedup: bool = True,
        endpoint: str | None = None,
        profile: ClientProfile | None = None,
        retry_interval: float = 1.0,
        max_pending_bytes: int = 16 * 1024 * 1024,
        stable_period: float = 30.0,
        fail_back: float | None = None,
        peer_login: ev.LinkLogin | None = None,
        drain_timeout: float = 5.0,
    ) -> None:
        super().__init__(vpn, name, kind, dedup=dedup, endpoint=endpoint, acl=acl, profile=profile)
        self.settings = settings
        self.session = session
        self.retry_interval = retry_interval
        self.stable_period = stable_period
        #: Seconds between attempts to reach a better-ordered target (``None``: stay).
        self.fail_back = fail_back
        self.max_pending_bytes = max_pending_bytes
        #: Seconds a connection closed on purpose gets to write what waits (see above).
        self.drain_timeout = drain_timeout
        #: Called with the peer's ADVERTISE frames (gaps already dealt with).
        self.on_advertise: AdvertiseHandler | None = None
        #: Why the peer refused what this side asked for, by filter or queue.
        self.refusals: dict[str, str] = {}
        self._wants: dict[str, None] = {}
        self._pulls: dict[str, int] = {}
        self._connection: Connection | None = None
        self._answers: Answers | None = None
        self._served: ServedFlows | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._pending: list[Message] = []
        self._hops: list[int] = []
        self._pending_bytes = 0
        self._wake = anyio.Event()
        self._woken = False  # send() set the event this writer round
        self._behind = False  # the last read left a destination's writes to its writer
        self._now = vpn.node.clock.time
        self._monotonic = vpn.node.clock.monotonic
        self._queued_at = 0.0  # when the first message waiting for the peer came
        self._write_through = write_through_of(vpn.node)
        self._writes_nowait = False
        #: In its node's write-through list already (see :class:`WriteThrough`).
        self.marked = False
        self._requests: dict[int, _Answer] = {}
        self._next_request = 0
        self._pulled: dict[int, Pull] = {}
        self._sends: deque[tuple[ev.Send, bytes]] = deque()
        self._sends_waiting = anyio.Event()
        self._sends_room = anyio.Event()
        self._advertised: tuple[int, int] | None = None  # the peer's epoch and last seq
        self._resync_asked = False
        self._my_epoch = vpn.node.next_origin_id()
        self._my_seq = 0
        self._scope: anyio.CancelScope | None = None
        self._serving: anyio.CancelScope | None = None
        # Set while a connection is closed on purpose: the writer writes what waits,
        # then sets the event (see _close_serving).
        self._closing = False
        self._drained = anyio.Event()
        self._serve_ended: anyio.Event | None = None  # set when serve() returns
        self._pause: anyio.CancelScope | None = None  # the dialling loop's wait
        self._stopped = False
        #: Set by :meth:`suspend` (another connection carries the link), until :meth:`resume`.
        self._suspended: anyio.Event | None = None
        #: What the peer said of itself when it opened this link (accepted links):
        #: its node, its name for the link and (when it says) its VPN.
        self.peer_login: ev.LinkLogin | None = peer_login
        #: Guaranteed messages spooled here from the peer's queues.
        self.pulled = 0
        #: The window the target it is connected to asks for (a
        #: :class:`~meshbus.transports.Remote`'s ``window``), which replaces each
        #: pull's own; ``None``: each pull's.
        self.remote_window: int | None = None
        #: What ended the last connection, when it failed (a ``ProtocolError``: the
        #: peer broke the protocol).
        self.error: MeshbusError | None = None
        self._send_bytes = 0
        self._bytes = [0, 0]  # sent and received over the connections that ended

    async def request(self, what: str) -> dict[str, Any]:
        """Send the peer a REQUEST (``"sync"``: answered once it read everything before)
        and return its answer.

        :raises StateError: the link is not connected.
        """
        answer = self._request(K.REQUEST, {"what": what})
        await answer.done.wait()
        if answer.error is not None:
            raise answer.error
        return answer.result

    async def send_guaranteed(self, message: Message) -> None:
        """SEND ``message`` (its delivery mode and options kept) to the peer, and return
        once the peer holds it.

        :raises MeshbusError: the peer refused it (send it again later), or the link
            went down before it answered.
        """
        header = link_send_header(message, self.vpn.node.clock.time())
        answer = self._request(K.SEND, header, message.payload)
        await answer.done.wait()
        if answer.error is not None:
            raise answer.error

    # --- messages to the peer -----------------------------------------------------------

    def send(self, envelope: Envelope) -> bool:
        if (
            self._connection is None
            or self._pending_bytes > self.max_pending_bytes
            or self._closing  # what it has is being written: nothing new
        ):
            return False
        message = envelope.message
        if envelope.mode is not _DIRECT:
            # The direct copy of a guaranteed message: it crosses marked with its real
            # mode, so the peer spools it nowhere (see Link.receive).
            message = with_mode(message, envelope.mode)
        if not self._pending:
            self._queued_at = self._monotonic()  # the forward latency of its batch
        self._pending.append(message)
        self._hops.append(envelope.hop_count)
        self._pending_bytes += message.size
        write_through = self._write_through
        if write_through.active and self._writes_nowait:
            # A reader is publishing what it read: it writes this at the end of its
            # read, in one write with the rest, without waking the writer task.
            if not self.marked:
                self.marked = True
                write_through.ready.append(self)
        elif not self._woken:
            # Once per writer round, not per message: setting the event costs more
            # than the rest of a send.
            self._woken = True
            self._wake.set()
        return True

    def write_ready(self) -> bool:
        """Write what waits for the peer now if the stream takes it without waiting,
        else leave it to the writer task (see :class:`WriteThrough`)."""
        connection = self._connection
        if connection is None or not self._pending:
            return True
        if not connection.can_flush_nowait():
            self._wake.set()
            return False
        messages, hops = self._pending, self._hops
        self._pending, self._hops, self._pending_bytes = [], [], 0
        self._encode(connection.protocol.peer_max_frame_size, messages, hops, self._now())
        connection.flush_nowait()
        self.forward_latency.record(self._monotonic() - self._queued_at, len(messages))
        return True

    @property
    def peer(self) -> str:
        """Who the link's writes are for, in logs."""
        connection = self._connection
        return f"link {self.name!r}" + (f" ({connection.peer})" if connection else "")

    def wake_writer(self) -> None:
        """Let the writer task write what waits."""
        self._wake.set()

    def _wake_writer(self) -> None:
        # Not a bound ``self._wake.set``: the writer makes a new event each round.
        self._wake.set()

    def _control_frame(self, kind: FrameKind, header: dict[str, Any], payload: bytes = b"") -> None:
        connection = self._connection
        if connection is None:
            raise StateError(f"link {self.name!r} is not connected")
        connection.protocol.send(kind, header, payload)
        self._wake.set()

    def _request(self, kind: FrameKind, header: dict[str, Any], payload: bytes = b"") -> _Answer:
        self._next_request += 1
        number = self._next_request
        self._control_frame(kind, {**header, "id": number}, payload)
        answer = self._requests[number] = _Answer()
        return answer

    def _start(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start a task of the connection, unless it is ending: a task started in its
        task group once that is cancelled might never be cancelled itself (so on asyncio),
        and the group would wait for it for ever."""
        tg, serving = self._tg, self._serving
        if (
            tg is not None
            and not tg.cancel_scope.cancel_called
            and serving is not None
            and not serving.cancel_called
        ):
            tg.start_soon(fn, *args)

    # --- running ------------------------------------------------------------------------

    async def run(self) -> None:
        """Dial the peer and keep the link up (reconnecting with backoff on the node's
        clock, moving back to a better-ordered target with :attr:`fail_back`) until
        :meth:`stop`. For links made with ``settings``."""
        await dial(self)

    @property
    def suspended(self) -> bool:
        """Whether the link lets another connection carry it (state ``reusing``)."""
        return self._suspended is not None

    def suspend(self, reason: str) -> None:
        """Stop dialling and close the link's connection for now: another connection
        carries what it would (its state is ``reusing``) until :meth:`resume`. For
        links made with ``settings``."""
        if self._stopped or self._suspended is not None:
            return
        self._suspended = anyio.Event()
        self.reason = reason
        if self._pause is not None:
            self._pause.cancel()
        self._close_serving()
        if self._connection is None and self.attached:
            self.set_state(LinkState.REUSING, reason)

    def resume(self) -> None:
        """Dial again (after :meth:`suspend`)."""
        event, self._suspended = self._suspended, None
        if event is not None:
            event.set()

    def retry_now(self) -> bool:
        """Cut short the wait before the next attempt to connect (a dialling link in
        ``backoff``): the peer is known to be back. Return whether it was waiting."""
        pause = self._pause
        if pause is None:
            return False
        pause.cancel()
        return True

    def stop(self, reason: str = "stopped") -> None:
        """Close the link for good: it leaves its VPN (state ``disabled``) and its
        connection closes once it has written what the link had taken for the peer
        (for at most :attr:`drain_timeout`)."""
        self._stopped = True
        self.reason = reason
        if self._serving is None:
            if self._scope is not None:  # connecting or waiting to: no more
                self._scope.cancel()
            self._end_flow_session()
        else:  # the dialling loop ends when the connection has closed
            self._close_serving()
        if self.attached:  # now, not when the tasks end: a replacement may take its name
            if self._connection is not None:
                self.closed(reason, LinkState.DISABLED)
            self.vpn.links.detach(self)

    async def aclose(self, reason: str = "stopped") -> None:
        """:meth:`stop` the link, and return once its connection has closed."""
        self.stop(reason)
        ended = self._serve_ended
        if ended is not None:
            await ended.wait()

    def _close_serving(self) -> None:
        """Close the connection being served once the writer has written what waits
        for the peer, or after :attr:`drain_timeout` (then cut)."""
        serving = self._serving
        if serving is None or self._closing:
            return
        self._closing = True
        self._drained = anyio.Event()
        self._wake.set()
        tg = self._tg
        if self.drain_timeout > 0 and tg is not None and not tg.cancel_scope.cancel_called:
            tg.start_soon(self._drain, serving)
        else:
            serving.cancel()

    async def _drain(self, serving: anyio.CancelScope) -> None:
        with self.vpn.node.clock.move_on_after(self.drain_timeout):
            await self._drained.wait()
        serving.cancel()

    async def serve(
        self,
        connection: Connection,
        peer_node: str | None,
        peer_cluster: str | None,
        *,
        keepalive: float,
        keepalive_timeout: float,
    ) -> str:
        """Carry the link over ``connection`` (logged in, in link mode) until it ends;
        return why it ended. Whoever made the connection closes it."""
        self._connection = connection
        self._writes_nowait = connection.writes_nowait
        self._answers = answers = Answers(connection)
        self._served = ServedFlows(connection, answers, self.outgoing, self.settled)
        self._wake.set()  # what the login queued (an accepting side's WELCOME) goes first
        self.opened(peer_node, peer_cluster)
        reason = "closed"
        self.error = None
        self._closing = False
        self._serve_ended = ended = anyio.Event()
        self._serving = serving = anyio.CancelScope()
        try:
            with serving, unwrap_errors():
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    try:
                        tg.start_soon(self._writer, connection)
                        tg.start_soon(
                            connection.keep_alive, keepalive, keepalive_timeout, self._wake_writer
                        )
                        tg.start_soon(self._sender)
                        tg.start_soon(self._sync)
                        await self._read(connection)
                    finally:
                        self._tg = None  # ending: nothing new starts in it (see _start)
                    tg.cancel_scope.cancel()
            reason = connection.protocol.close_reason or "the connection ended"
            if serving.cancelled_caught:
                reason = self.reason or "stopped"
        except (TransportError, ProtocolError) as exc:
            reason = str(exc)
            self.error = exc
        finally:
            self._serving = None
            with anyio.CancelScope(shield=True):
                self._disconnected(reason)
                await connection.send_close(f"link closed: {reason}")
            self._closing = False
            self._serve_ended = None
            ended.set()
        return reason

    @property
    def bytes_sent(self) -> int:
        """Bytes written to the peer over all of the link's connections (frames of
        every kind, after compression)."""
        connection = self._connection
        return self._bytes[0] + (connection.protocol.bytes_sent if connection else 0)

    @property
    def bytes_received(self) -> int:
        """Bytes read from the peer over all of the link's connections."""
        connection = self._connection
        return self._bytes[1] + (connection.protocol.bytes_received if connection else 0)

    def _disconnected(self, reason: str) -> None:
        connection = self._connection
        if connection is not None:
            self._bytes[0] += connection.protocol.bytes_sent
            self._bytes[1] += connection.protocol.bytes_received
        self._connection = None
        self._tg = None
        if self._served is not None:
            self._served.close()  # what the peer did not ack goes back to its queues
        self._served = self._answers = None
        lost = StateError(f"link {self.name!r} went down: {reason}")
        for answer in self._requests.values():
            answer.error = lost
            answer.done.set()
        self._requests.clear()
        self._pulled.clear()  # the peer gives back what it sent and we did not ack
        self._sends.clear()
        self._send_bytes = 0
        self._sends_room.set()
        self.forward_failures += len(self._pending)
        self._pending, self._hops, self._pending_bytes = [], [], 0
        self._advertised = None
        self._resync_asked = False
        if self._stopped:
            self._end_flow_session()
        if self.attached:
            state = LinkState.DISABLED if self._stopped else LinkState.BACKOFF
            self.closed(reason, state)

    # --- the connection's tasks ---------------------------------------------------------

    async def _writer(self, connection: Connection) -> None:
        protocol = connection.protocol
        now = self.vpn.node.clock.time
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            self._woken = False
            if self._pending:
                messages, hops = self._pending, self._hops
                self._pending, self._hops, self._pending_bytes = [], [], 0
                queued_at = self._queued_at
                encoded = self._encode(protocol.peer_max_frame_size, messages, hops, now())
                try:
                    await connection.flush()
                except BaseException:
                    # Cut short (the connection failed, or a stop's drain ran out of
                    # time): not known to have reached the peer, so not forwarded.
                    self.forwarded -= encoded
                    self.forward_failures += encoded
                    raise
                self.forward_latency.record(self._monotonic() - queued_at, len(messages))
            else:
                await connection.flush()
            if self._closing and not self._pending:
                self._drained.set()  # all it had is written: the connection may close

    def _encode(self, limit: int, messages: list[Message], hops: list[int], now: float) -> int:
        """Queue DELIVER_BATCH frames of ``messages``; how many (those too large for the
        peer are dropped, counted)."""
        protocol = self._connection.protocol  # type: ignore[union-attr]
        try:
            protocol.send_raw(encode_deliver_batch(messages, limit, hops=hops, now=now))
        except FrameTooLarge:  # some message on its own is too large for the peer
            encoded = 0
            for message, hop in zip(messages, hops, strict=True):
                try:
                    protocol.send_raw(encode_deliver_batch([message], limit, hops=[hop], now=now))
                    encoded += 1
                except FrameTooLarge:
                    self.forwarded -= 1
                    self.count_drop("too_large")
            return encoded
        return len(messages)

    async def _read(self, connection: Connection) -> None:
        protocol = connection.protocol
        # What came in the same read as the WELCOME (a dialling side) comes first.
        frames, connection.early = connection.early, []
        rest = self._received(frames) if frames else None
        while True:
            while rest:  # from a control frame that may await on, or past the budget
                kind, event, payload = rest[0]
                if kind == REST:  # the messages beyond one step's: after others' turns
                    await anyio.lowlevel.checkpoint()
                    rest = self._received(rest)
                    continue
                await self._control(event, payload)
                rest = self._received(rest[1:])
            if protocol.state is not ConnectionState.OPEN:
                return
            try:
                rest = await connection.receive_next(self._received, wait_turn=self._behind)
            except ProtocolError:
                raise
            except TransportError:
                if protocol.state is ConnectionState.OPEN:
                    raise
                return

    def _received(self, frames: Frames) -> Frames | None:
        """Act on the messages of one read, without awaiting, up to the first control
        frame; that one and the rest are returned for :meth:`_read`. Also returns
        (nothing) when a destination's writes were left to its writer task."""
        receive = self.receive
        now = self._now
        write_through = self._write_through
        # What the messages of one read make the node write (to sessions, to other
        # links) goes out in one write per connection at the end of it.
        write_through.active = True
        budget = STEP_MESSAGES
        try:
            for i, (kind, header, payload) in enumerate(frames):
                if kind in (_DELIVER_BATCH, REST):
                    messages = (
                        header if kind == REST else decode_deliver_batch(header, payload, now())
                    )
                    left = None
                    if len(messages) > budget:  # the rest is for the reader's next step
                        messages, left = messages[:budget], messages[budget:]
                    for message in messages:
                        if not message.options.size or self._within_limits(message):
                            receive(message)
                    if left is not None:
                        return [(REST, left, b""), *frames[i + 1 :]]
                    budget -= len(messages)
                elif kind == _DELIVER:
                    message = decode_deliver(header, payload, now())
                    if not message.options.size or self._within_limits(message):
                        receive(message)
                    budget -= 1
                elif kind == _FLOW_DELIVER:
                    self._arrived(*decode_flow_deliver(header, payload, now()))
                    budget -= 1
                else:
                    return frames[i:]
                if budget <= 0 and i + 1 < len(frames):
                    return [(REST, [], b""), *frames[i + 1 :]]
        finally:
            self._behind = not write_through.drain()
        if self._connection is not None and self._connection.protocol.out:
            self._wake.set()
        return [] if self._behind else None

    def _within_limits(self, message: Message) -> bool:
        """Whether ``message``'s headers are within :data:`~meshbus.HEADER_LIMITS`, as
        a session's publish must be (SPEC 10): what the node takes it must be able to
        write to every subscriber. One over them is dropped (``bad_headers``)."""
        try:
            HEADER_LIMITS.check(message.headers, message.reply_to, message.correlation_id)
        except PublishRejectedError as exc:
            self.count_drop("bad_headers")
            log.warning("link %r: dropped a message on %r: %s", self.name, message.topic, exc)
            return False
        return True

    async def _control(self, event: object, payload: bytes) -> None:
        answers = self._answers
        assert answers is not None
        if isinstance(event, ev.Ok | ev.ErrorAnswer):
            self._answered(event)
            return
        if isinstance(event, ev.Ack):
            try:
                self._served.ack(event)  # type: ignore[union-attr]
            except StateError as exc:
                answers.error(None, exc)
            return
        if isinstance(event, ev.Send):
            self._sends.append((event, payload))
            self._send_bytes += len(payload)
            self._sends_waiting.set()
            # Stop reading while the spool is behind, as a session's connection does.
            while self._sends and (
                len(self._sends) >= _MAX_PIPELINED_SENDS or self._send_bytes > _MAX_PIPELINED_BYTES
            ):
                self._sends_room = anyio.Event()
                await self._sends_room.wait()
            return
        if isinstance(event, ev.Advertise):
            self._advertise_received(event)
            return
        if isinstance(event, ev.FlowClosed):
            self._flow_closed(event)
            return
        request = getattr(event, "id", None)
        if request is None:
            return  # PING (the protocol answers it), PONG, CLOSE
        try:
            if isinstance(event, ev.Subscribe):
                parse_subscription(event.subscription)
                self.add_interest(event.subscription)
                answers.ok(request)
            elif isinstance(event, ev.Unsubscribe):
                self.remove_interest(event.subscription)
                answers.ok(request)
            elif isinstance(event, ev.Bind):
                flow = await self._bind_for_peer(event)
                if self.endpoint is None:
                    # Its messages go to the peer over this flow: their direct copies
                    # need not go too (see LinkRouter).
                    self.endpoint = (
                        f"{self.vpn.name}/{event.queue}"
                        if event.endpoint is None
                        else f"{self.vpn.name}/#te/{event.endpoint}"
                    )
                assert self._tg is not None
                assert self._served is not None
                self._served.bound(request, flow, self._tg)
            elif isinstance(event, ev.Unbind):
                await self._served.unbind(event)  # type: ignore[union-attr]
            elif isinstance(event, ev.Request):
                if event.what != "sync":
                    raise StateError(f"unknown request {event.what!r}")
                answers.ok(request)
            elif isinstance(event, ev.SubscribeFor):
                raise StateError("a link has no sessions to subscribe for")
        except (MeshbusError, TypeError, ValueError) as exc:
            answers.error(request, exc)

    def _answered(self, event: ev.Ok | ev.ErrorAnswer) -> None:
        answer = self._requests.pop(event.id, None) if type(event.id) is int else None
        if answer is None:
            if isinstance(event, ev.ErrorAnswer):
                log.warning("link %r: the peer reports %s", self.name, event.header.get("message"))
            return
        if isinstance(event, ev.Ok):
            answer.result = event.result
            if answer.on_ok is not None:
                answer.on_ok(event.result)
        else:
            answer.error = error_from(event.header)
        answer.done.set()

    async def _bind_for_peer(self, event: ev.Bind) -> Flow:
        """The flow the peer's BIND asks for, bound for the session the peer is (or, on a
        dialling link, this link's own session). Bound with the guaranteed service, not
        ``session.bind``: a plugin may change what a client session's flows deliver
        (``hopcount`` hides hop counts from clients), while a link carries messages as
        they are; the checks of ``session.bind`` are made here."""
        session = self._flow_session()
        if not session.client_profile.allow_guaranteed_receive:
            what = event.queue or event.endpoint or ""
            why = "client profile does not allow guaranteed receive"
            raise AccessDeniedError(session.username, "bind", what, why)
        guaranteed = self.vpn.node.guaranteed
        if event.endpoint is not None:
            assert event.subscription is not None
            limits = self.vpn.topic_limits
            topic_filter = parse_endpoint_subscription(event.subscription, limits).filter
            if not session._acl.may_subscribe(topic_filter):
                session.denied += 1
                raise AccessDeniedError(session.username, "subscribe", event.subscription)
            return await guaranteed.bind_topic_endpoint(
                session, event.endpoint, topic_filter, event.window
            )
        assert event.queue is not None
        return await guaranteed.bind(session, event.queue, event.window)

    def _end_flow_session(self) -> None:
        """A dialling link is done for good: close the session its peer's flows were
        bound in, so that the name is free for a link that replaces it (an accepted
        link's session is its login, which its listener closes)."""
        session = self.session
        if session is not None and self.settings is not None:
            self.session = None
            session.close()

    def _flow_session(self) -> Session:
        """The session that holds the flows the peer binds on this side."""
        if self.session is None:
            # A client name is one topic level: no '/' (a link's name may have some).
            # The node's own session: this side dialled, so no login of the peer's is
            # here to judge it, and the VPN's authentication is not for its own links.
            name = "link:" + self.name.replace("/", ":")
            self.session = self.vpn.open_internal_session(name)
        return self.session


def open_link(
    vpn: Vpn,
    name: str,
    settings: ConnectSettings,
    *,
    kind: str = "bridge",
    wants: Iterable[str] = (),
    pulls: Iterable[str] = (),
    **options: Any,
) -> WireLink:
    """Make a :class:`WireLink` from ``vpn`` to the VPN ``settings`` log in to, join it to
    ``vpn`` and start dialling in the node's task group (the node must be running).

    :param wants: filters to ask the peer for (:meth:`WireLink.want`).
    :param pulls: the peer's queues to pull guaranteed messages from (:meth:`WireLink.pull`).
    :param options: the other arguments of :class:`WireLink`.
    """
    link = WireLink(vpn, name, kind=kind, settings=settings, **options)
    for topic_filter in wants:
        link.want(topic_filter)
    for queue in pulls:
        link.pull(queue)
    vpn.links.attach(link)
    vpn.node.task_group.start_soon(link.run, name=f"meshbus link {name}")
    return link
