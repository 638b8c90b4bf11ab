"""Guaranteed messages a :class:`~meshbus.transports.WireLink` takes from its peer:
those of the flows it bound to the peer's queues (spooled here, then acknowledged) and
the peer's SENDs (answered OK once spooled here, ERROR when refused)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from meshbus._links import Link
from meshbus._messages import Message
from meshbus._topics import validate_topic
from meshbus.errors import MeshbusError, ProtocolError

from ._framing import FrameKind
from ._link_sends import sent_message

if TYPE_CHECKING:
    from . import _events as ev
    from ._answering import Answers
    from ._connection import Connection
    from ._link import _Answer

K = FrameKind

__all__ = ["GuaranteedFromPeer", "Pull"]

log = logging.getLogger("meshbus.links")


class Pull:
    """A flow this side bound to a queue of the peer, and its messages not yet spooled."""

    __slots__ = ("arrived", "messages", "queue", "window")

    def __init__(self, queue: str, window: int) -> None:
        self.queue = queue
        self.window = window
        self.messages: deque[Message] = deque()
        self.arrived = anyio.Event()


class GuaranteedFromPeer(Link):
    """The guaranteed half of :class:`~meshbus.transports.WireLink` (a mixin: it uses the
    link's pulled flows, pending SENDs, VPN, requests and control frames)."""

    # What it uses of the WireLink (declared for the type checker; the link sets them).
    retry_interval: float
    pulled: int
    _pulled: dict[int, Pull]
    _sends: deque[tuple[ev.Send, bytes]]
    _sends_waiting: anyio.Event
    _sends_room: anyio.Event
    _send_bytes: int
    _wake: anyio.Event
    _answers: Answers | None
    _control_frame: Callable[..., None]
    _within_limits: Callable[[Message], bool]
    _request: Callable[..., _Answer]
    _start: Callable[..., None]
    _connection: Connection | None
    _pulls: dict[str, int]
    remote_window: int | None
    refusals: dict[str, str]

    # --- the flows this side binds to the peer's queues ------------------------------

    async def _bind(self, queue: str, window: int) -> None:
        await self._bind_answer(queue, window)()

    def _bind_answer(self, queue: str, window: int) -> Callable[[], Any]:
        answer = self._request(K.BIND, {"queue": queue, "window": self.remote_window or window})

        def bound(result: dict[str, Any]) -> None:
            # Now, as the OK is read: the flow's first messages may be next in the read.
            number = result.get("flow")
            if type(number) is not int:
                raise ProtocolError("a BIND answer must carry the flow's number")
            self.refusals.pop(queue, None)
            pull = self._pulled[number] = Pull(queue, window)
            self._start(self._spool_pulled, number, pull)

        answer.on_ok = bound

        async def wait() -> None:
            await answer.done.wait()
            if answer.error is not None and self._connection is not None:
                self.refusals[queue] = str(answer.error)
                log.warning("link %r: binding %s refused: %s", self.name, queue, answer.error)
                self._start(self._bind_later, queue, window)

        return wait

    async def _bind_later(self, queue: str, window: int) -> None:
        clock = self.vpn.node.clock
        await clock.sleep_until(clock.monotonic() + self.retry_interval)
        if queue in self._pulls:
            await self._bind(queue, window)

    def _flow_closed(self, event: ev.FlowClosed) -> None:
        pull = self._pulled.pop(event.flow, None) if type(event.flow) is int else None
        if pull is not None and pull.queue in self._pulls:
            log.warning(
                "link %r: the peer closed its flow of %s: %s", self.name, pull.queue, event.reason
            )
            self._start(self._bind_later, pull.queue, pull.window)

    # --- their messages -------------------------------------------------------------

    def _arrived(self, flow: int, message: Message) -> None:
        pull = self._pulled.get(flow)
        if pull is None:
            raise ProtocolError(f"FLOW_DELIVER on flow {flow}, which this side did not bind")
        if message.options.size and not self._within_limits(message):
            # It can never be taken here: let the peer's queue go of it, counted.
            self._control_frame(K.ACK, {"flow": flow, "ids": [message.message_id]})
            return
        pull.messages.append(message)
        pull.arrived.set()

    async def _spool_pulled(self, number: int, pull: Pull) -> None:
        """Spool the flow's messages here in order, those that arrived together in one
        commit, each acknowledged once held; one an endpoint refuses is tried again every
        ``retry_interval``, holding up this flow (and those behind it)."""
        clock = self.vpn.node.clock
        while self._pulled.get(number) is pull:
            if not pull.messages:
                pull.arrived = anyio.Event()
                await pull.arrived.wait()
                continue
            batch = list(pull.messages)  # more may arrive while this commits
            try:
                taken, refusal = await self.receive_guaranteed_many(batch)
            except MeshbusError as exc:
                log.debug("link %r: %d refused, tried again later: %s", self.name, len(batch), exc)
                await clock.sleep_until(clock.monotonic() + self.retry_interval)
                continue
            if taken:
                kept = set(taken)
                left = [m for i, m in enumerate(batch) if i not in kept]
                for _ in batch:
                    pull.messages.popleft()
                pull.messages.extendleft(reversed(left))
                self.pulled += len(taken)
                if self._pulled.get(number) is pull:
                    ids = [batch[i].message_id for i in taken]
                    self._control_frame(K.ACK, {"flow": number, "ids": ids})
            if refusal is not None:
                log.debug("link %r: a pulled message was refused: %s", self.name, refusal)
                await clock.sleep_until(clock.monotonic() + self.retry_interval)

    async def _sender(self) -> None:
        """The peer's SENDs, in order: OK once spooled here, ERROR when refused."""
        sends = self._sends
        while True:
            await self._sends_waiting.wait()
            self._sends_waiting = anyio.Event()
            while sends:
                send, payload = sends[0]
                answers = self._answers
                try:
                    message = sent_message(send, payload, self.vpn.node.clock.time())
                    validate_topic(message.topic, self.vpn.topic_limits)  # as a send's
                    await self.receive_guaranteed(message)
                except ProtocolError:
                    raise
                except (MeshbusError, TypeError, ValueError) as exc:
                    if answers is not None:
                        answers.error(send.id, exc)
                else:
                    if answers is not None:
                        answers.ok(send.id)
                if sends and sends[0][0] is send:
                    sends.popleft()
                    self._send_bytes -= len(payload)
                self._sends_room.set()
                self._wake.set()
