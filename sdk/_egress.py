"""A session's bounded egress buffer for direct messages (SPEC 2).

Delivery appends without awaiting; when the buffer is over its message or
byte limit the **oldest** messages are discarded and the next message the
consumer takes carries ``discard_indication=True``. The consumer waits only
when the buffer is empty, and then drains without further checkpoints.

Bytes are whole sizes (:attr:`Message.size <meshbus.Message.size>`): the payload
and what its headers take in memory, so headers cannot fill a buffer unseen.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

import anyio

from ._messages import Message
from .errors import StateError

__all__ = ["Egress"]


class Egress:
    """Bounded FIFO of messages waiting for one consumer."""

    __slots__ = (
        "_bytes",
        "_closed",
        "_discard_pending",
        "_new_waiter",
        "_queue",
        "_waiter",
        "discarded",
        "max_bytes",
        "max_messages",
        "on_discard",
        "on_drained",
        "on_ready",
    )

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self._queue: deque[Message] = deque()
        self._bytes = 0
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.discarded = 0
        self._discard_pending = False
        self._waiter: _Waiter | None = None
        self._new_waiter: Callable[[], _Waiter] | None = None  # chosen at the first wait
        self._closed = False
        #: Called (by the consumer's take) when the buffer becomes empty; eliding's
        #: congestion mode releases what it held back then.
        self.on_drained: Callable[[], None] | None = None
        #: Called, instead of waking the waiting consumer, when a message arrives while
        #: it waits. The callee takes messages itself or calls :meth:`wake`. A node's
        #: connection uses it to write deliveries from the publisher's read.
        self.on_ready: Callable[[], None] | None = None
        #: Called after messages were discarded (:attr:`discarded` counts them); the
        #: session uses it to log a slow consumer.
        self.on_discard: Callable[[], None] | None = None

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def bytes(self) -> int:
        """Bytes waiting: the messages' whole sizes (payloads and headers)."""
        return self._bytes

    def push(self, message: Message) -> None:
        """Append ``message``, discarding the oldest if over the limits. Never blocks."""
        # The direct router inlines this body (plugins/direct.py), inside a fence that
        # tests/test_inline_copies.py compares with it.
        queue = self._queue
        queue.append(message)
        size = self._bytes + message.size
        self._bytes = size
        if size > self.max_bytes or len(queue) > self.max_messages:
            self._shed()
        if self._waiter is not None:
            if self.on_ready is None:
                self.wake()
            else:
                self.on_ready()

    @property
    def consumer_waiting(self) -> bool:
        """Whether the consumer is waiting in :meth:`get` (the buffer was empty)."""
        return self._waiter is not None

    def wake(self) -> None:
        """Wake the consumer waiting in :meth:`get`, if any."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set()

    def _shed(self) -> None:
        # Never the message just added: a message bigger than ``max_bytes`` waits alone
        # (so a consumer that keeps up still gets it) and is the next to go.
        queue = self._queue
        before = self.discarded
        while len(queue) > 1 and (len(queue) > self.max_messages or self._bytes > self.max_bytes):
            self._bytes -= queue.popleft().size
            self.discarded += 1
            self._discard_pending = True
        if self.discarded != before and self.on_discard is not None:
            self.on_discard()

    def get_nowait(self) -> Message | None:
        """The next message, or ``None`` when the buffer is empty."""
        if self._closed:
            raise StateError("session is closed")
        queue = self._queue
        if not queue:
            return None
        # Session.__anext__ inlines the two fenced parts (not the discard, which it
        # leaves to this method); tests/test_inline_copies.py compares them.
        # inline-source: take begin
        message = queue.popleft()
        self._bytes -= message.size
        # inline-source: take end
        if self._discard_pending:
            self._discard_pending = False
            message = message.evolve(discard_indication=True)
        # inline-source: drained begin
        if not queue and self.on_drained is not None:
            self.on_drained()
        # inline-source: drained end
        return message

    async def get(self) -> Message:
        """The next message, waiting while the buffer is empty.

        Raises :class:`StateError` once the session is closed.
        """
        while not self._queue:
            if self._closed:
                raise StateError("session is closed")
            waiter = self._waiter
            if waiter is None:
                new_waiter = self._new_waiter
                if new_waiter is None:
                    new_waiter = self._new_waiter = _waiter_factory()
                waiter = self._waiter = new_waiter()
            try:
                await waiter.wait()
            except BaseException:
                if self._waiter is waiter:
                    self._waiter = None  # cancelled: nobody waits on it any more
                raise
        message = self.get_nowait()
        assert message is not None
        return message

    def close(self) -> None:
        """Drop what is waiting and wake the consumer so it sees the close."""
        self._closed = True
        self._queue.clear()
        self._bytes = 0
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            waiter.set()


class _FutureWaiter:
    """On asyncio: a bare future of the loop, awaited directly. Cheaper to make and to
    wake than an event, and the consumer waits once per empty buffer."""

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self._future = future

    def set(self) -> None:
        future = self._future
        if not future.done():
            future.set_result(None)

    def wait(self) -> Awaitable[object]:
        return self._future


class _EventWaiter:
    """Any other backend (trio): an anyio event."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    def wait(self) -> Awaitable[object]:
        return self._event.wait()


_Waiter = _FutureWaiter | _EventWaiter
"""What the consumer waits on while the buffer is empty: ``set()`` wakes it."""


def _waiter_factory() -> Callable[[], _Waiter]:
    """How waiters are made on the running event loop (a buffer keeps its loop)."""
    try:
        import sniffio  # trio needs it, so it is there whenever trio runs
    except ImportError:
        on_asyncio = True  # anyio's own rule: without sniffio, a running loop is asyncio
    else:
        on_asyncio = sniffio.current_async_library() == "asyncio"
    if on_asyncio:
        create_future = asyncio.get_running_loop().create_future
        return lambda: _FutureWaiter(create_future())
    return _EventWaiter
