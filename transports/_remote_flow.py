"""Requests awaiting the node's answer, and flows bound over a connection."""

from __future__ import annotations

import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio

from meshbus._messages import Message
from meshbus.abc import Flow
from meshbus.errors import MeshbusError, StateError, TransportError

from ._framing import FrameKind

if TYPE_CHECKING:
    from ._client import RemoteSession

__all__ = ["RemoteFlow", "Request"]

K = FrameKind


class Request:
    """A frame sent to the node and, once it answers, the answer."""

    __slots__ = ("body", "deferred", "done", "flow", "frame", "result", "sent")

    def __init__(
        self,
        frame: tuple[FrameKind, dict[str, Any], bytes],
        flow: RemoteFlow | None = None,
        *,
        deferred: bool = False,
    ) -> None:
        self.frame = frame
        #: Nobody awaits the answer: a refusal is raised by the session's next ``confirm()``.
        self.deferred = deferred
        #: For a BIND: the flow the answer's number is for (registered as the answer is read,
        #: so deliveries read in the same chunk find it).
        self.flow = flow
        self.done = anyio.Event()
        self.result: dict[str, Any] | MeshbusError | None = None
        #: The answer's payload (a service call's body).
        self.body = b""
        #: Given to a connection (which may have written it before it ended).
        self.sent = False


class RemoteFlow(Flow):
    """A flow bound over a connection; see :meth:`RemoteSession.bind`."""

    def __init__(self, session: RemoteSession, bind: dict[str, Any], window: int) -> None:
        self._session = session
        self._bind = bind
        self.window = window
        self.number = 0  # the node's number for it on the current connection
        self._messages: deque[Message] = deque()
        self._arrived = anyio.Event()
        self._delivered: set[int] = set()  # ids handed out on the current connection
        self._stale: set[int] = set()  # handed out before a reconnect: the node gave them back
        self.unbound = False

    def _push(self, message: Message) -> None:
        self._messages.append(message)
        self._arrived.set()

    def _rebound(self, number: int) -> None:
        # The node gave back what was unacknowledged on the old connection: it comes again.
        self.number = number
        self._messages.clear()
        self._stale |= self._delivered
        self._delivered.clear()

    async def receive(self) -> Message:
        while not self._messages:
            if self.unbound:
                raise StateError(f"flow on {self._bind.get('queue') or self._bind['endpoint']!r}")
            self._arrived = anyio.Event()
            await self._arrived.wait()
        return self._hand_out()

    def receive_nowait(self) -> Message | None:
        """The next message the node has sent this flow, or ``None`` (the node sends
        within the window by itself: nothing needs to be asked for)."""
        if not self._messages:
            if self.unbound:
                raise StateError(f"flow on {self._bind.get('queue') or self._bind['endpoint']!r}")
            return None
        return self._hand_out()

    def _hand_out(self) -> Message:
        message = self._messages.popleft()
        assert message.message_id is not None
        self._delivered.add(message.message_id)
        return message

    def ack(self, message: Message) -> None:
        message_id = message.message_id
        if message_id is None or message_id not in self._delivered:
            if message_id in self._stale:  # from before a reconnect: it comes again
                self._stale.discard(message_id)
                return
            raise StateError(f"message {message_id!r} is not unacknowledged on this flow")
        self._delivered.discard(message_id)
        self._session._ack(self.number, message_id)

    async def unbind(self) -> None:
        if self.unbound:
            return
        self.unbound = True
        self._arrived.set()
        session = self._session
        session._flows.pop(self.number, None)
        session._flow_list.remove(self)
        if session._connected:
            with contextlib.suppress(StateError, TransportError):  # the node dropped it already
                await session._request(K.UNBIND, {"flow": self.number})

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except StateError:
            if self.unbound:
                raise StopAsyncIteration from None
            raise
