"""What the side of a connection that serves requests shares: answers and served flows.

A node's connection for a remote session and either side of a link both answer the
peer's requests (every request gets exactly one OK or ERROR) and feed the flows the
peer bound to their queues (FLOW_DELIVER within the flow's window, acks, unbinds).
:class:`Answers` and :class:`ServedFlows` are those two jobs, written once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from meshbus._messages import Message
from meshbus.errors import ProtocolError, StateError

from . import _events as ev
from ._codec import encode_flow_deliver
from ._framing import FrameKind
from ._protocol import ConnectionState
from ._wire_errors import error_attributes, error_code

if TYPE_CHECKING:
    from meshbus.abc import Flow

    from ._connection import Connection

__all__ = ["Answers", "ServedFlows"]

_FEED_BATCH = 256  # a flow's messages written in one go, at most

log = logging.getLogger("meshbus.transports")

K = FrameKind


class Answers:
    """Writes OK and ERROR answers to the peer's requests on one connection."""

    __slots__ = ("errors_sent", "protocol")

    def __init__(self, connection: Connection) -> None:
        self.protocol = connection.protocol
        self.errors_sent = 0

    def ok(self, request: int, **result: Any) -> None:
        """Answer ``request`` with OK (and ``result``'s fields)."""
        if self.protocol.state is ConnectionState.OPEN:
            self.protocol.send(K.OK, {"id": request, **result})

    def ok_with_body(self, request: int, result: dict[str, Any], body: bytes) -> None:
        """Answer ``request`` with OK, ``result``'s fields and ``body`` as the payload."""
        if self.protocol.state is ConnectionState.OPEN:
            self.protocol.send(K.OK, {**result, "id": request}, body)

    def error(self, request: int | None, exc: BaseException, **extra: Any) -> None:
        """Answer ``request`` with the ERROR of ``exc`` (no request: an asynchronous
        error). A :class:`~meshbus.ProtocolError` is raised instead: it ends the
        connection."""
        if isinstance(exc, ProtocolError):
            raise exc
        if self.protocol.state is not ConnectionState.OPEN:
            return  # the peer said goodbye (or broke the protocol) in the same read
        self.errors_sent += 1
        header: dict[str, Any] = {"error": error_code(exc), "message": str(exc), **extra}
        if request is not None:
            header["id"] = request
        attributes = error_attributes(exc)
        if attributes:
            header["attrs"] = attributes
        self.protocol.send(K.ERROR, header)


class ServedFlows:
    """The flows the peer bound on this side of a connection, each fed by one task.

    :param connection: where FLOW_DELIVER and FLOW_CLOSED frames go.
    :param answers: how BIND and UNBIND are answered.
    """

    def __init__(
        self,
        connection: Connection,
        answers: Answers,
        outgoing: Callable[[Message], Message | None] | None = None,
        settled: Callable[[Message], None] | None = None,
    ) -> None:
        self.connection = connection
        #: What each message goes through before it is sent (a link's egress stages):
        #: the message to send, or ``None`` to let the queue go of it unsent.
        self.outgoing = outgoing
        #: Told of each message sent that the peer acknowledged or that went back to
        #: its queue (a link's :meth:`~meshbus.Link.settled`).
        self.settled = settled
        self.protocol = connection.protocol
        self.answers = answers
        self._flows: dict[int, tuple[Flow, _Feeder, dict[int, Message]]] = {}
        self._numbers = 0
        self._done: dict[int, anyio.Event] = {}

    def __len__(self) -> int:
        return len(self._flows)

    def bound(self, request: int, flow: Flow, task_group: anyio.abc.TaskGroup) -> None:
        """``flow`` was bound for the peer's BIND ``request``: number it, start feeding
        it in ``task_group`` and answer with its number."""
        self._numbers += 1
        number = self._numbers
        feeder = _Feeder()
        unacked: dict[int, Message] = {}
        self._flows[number] = (flow, feeder, unacked)
        self._done[number] = done = anyio.Event()
        task_group.start_soon(self._feed_flow, number, flow, feeder, unacked, done)
        self.answers.ok(request, flow=number)

    async def _feed_flow(
        self,
        number: int,
        flow: Flow,
        feeder: _Feeder,
        unacked: dict[int, Message],
        done: anyio.Event,
    ) -> None:
        try:
            await self._feed(number, flow, feeder, unacked)
        finally:
            done.set()
            self._done.pop(number, None)

    async def _feed(
        self, number: int, flow: Flow, feeder: _Feeder, unacked: dict[int, Message]
    ) -> None:
        protocol = self.protocol
        while not feeder.stopping:
            # Only the wait for a message may be cut short by an unbind: a flush it
            # interrupted would lose what it had taken from the protocol (other
            # requests' answers, other flows' messages).
            feeder.scope = scope = anyio.CancelScope()
            try:
                with scope:
                    message = await flow.receive()
            except StateError as exc:  # unbound from this side
                if number in self._flows and protocol.state is ConnectionState.OPEN:
                    del self._flows[number]
                    protocol.send(K.FLOW_CLOSED, {"flow": number, "reason": str(exc)})
                    await self.connection.flush()
                return
            finally:
                feeder.scope = None
            if scope.cancelled_caught:
                return
            # What the flow holds already goes in the same write (at most a window).
            now = self.connection.clock.time()
            outgoing = self.outgoing
            taken = 0
            while True:
                taken += 1
                message_id = message.message_id
                assert message_id is not None
                sent = message if outgoing is None else outgoing(message)
                if sent is None:
                    flow.ack(message)  # stopped on the way out (counted there): settled
                else:
                    unacked[message_id] = message
                    protocol.send_raw(encode_flow_deliver(number, message_id, sent, now))
                if taken == _FEED_BATCH:
                    break
                try:
                    more = flow.receive_nowait()
                except StateError:
                    break  # unbound meanwhile: the next receive() says so
                if more is None:
                    break
                message = more
            await self.connection.flush()

    async def unbind(self, event: ev.Unbind) -> None:
        """The peer's UNBIND: stop feeding, give back what it has not acked, answer."""
        number = event.flow
        entry = self._flows.pop(number, None) if type(number) is int else None
        if entry is None:
            raise StateError(f"no flow {number!r} on this connection")
        flow, feeder, unacked = entry
        done = self._done.get(number)
        feeder.stop()
        if done is not None:
            # Let the feeder finish first: cancelled inside an ack commit it gives the ids
            # back, and the unbind below must commit them.
            await done.wait()
        await flow.unbind()
        self._given_back(unacked)
        self.answers.ok(event.id)

    def ack(self, event: ev.Ack) -> None:
        """The peer's ACK of messages of one of its flows.

        :raises StateError: an id that is not unacknowledged on that flow.
        """
        number = event.flow
        entry = self._flows.get(number) if type(number) is int else None
        if entry is None:
            return  # acks racing an unbind: the messages were already given back
        flow, _, unacked = entry
        for message_id in event.ids:
            message = unacked.pop(message_id, None) if type(message_id) is int else None
            if message is None:
                raise StateError(f"message {message_id!r} is not unacknowledged on flow {number}")
            flow.ack(message)
            if self.settled is not None:
                self.settled(message)

    def close(self) -> None:
        """The connection ended: every flow's unacknowledged messages go back to its queue."""
        for flow, feeder, unacked in self._flows.values():
            feeder.stop()
            detach = getattr(flow, "detach", None)
            if detach is not None:
                detach()
            self._given_back(unacked)
        self._flows.clear()

    def _given_back(self, unacked: dict[int, Message]) -> None:
        if self.settled is not None:
            for message in unacked.values():
                self.settled(message)


class _Feeder:
    """How a flow's feeder task is stopped: at once while it waits for a message, else
    once the frame it is writing is written."""

    __slots__ = ("scope", "stopping")

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.stopping = False

    def stop(self) -> None:
        self.stopping = True
        if self.scope is not None:
            self.scope.cancel()
