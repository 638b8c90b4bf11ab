"""Plugin ``eliding``: message eliding (SPEC section 5).

For sessions whose client profile has ``eliding_enabled``, an eliding stage is put
in front of the session's direct deliveries. It applies only to direct messages
flagged ``eliding_eligible``; everything else, and every shared-subscription
delivery (which goes to :attr:`~meshbus.Session.sink` underneath), passes untouched.

Per (session, concrete topic), with ``eliding_delay_ms`` > 0:

* a message goes out at once when nothing was sent on that topic within the delay;
* otherwise it is held, replacing any message already held for the topic;
* when the delay since the last send expires, the held (latest) message goes out.

So the last update of a burst always arrives, at most ``delay`` late, and a
subscriber sees at most one message per topic per delay.

With ``eliding_delay_ms == 0`` (congestion mode) every message is delivered while
the consumer keeps up; while its egress buffer is not empty, only the latest
message per topic waits, and the waiting ones are released when the buffer drains.

Timers never spawn tasks: one scheduler task per node (started in the plugin's
lifespan) keeps a heap of deadlines on the node's clock.

At most ``max_eliding_topics`` topics are tracked per session; beyond that the
least recently active topic is forgotten (its held message, if any, is sent first,
so no last update is lost) and eliding carries on as for a fresh topic.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
from anyio.abc import TaskStatus

from meshbus import DeliveryMode, Message, Node, Session, StashKey, hookimpl
from meshbus.abc import Clock

__all__ = ["CongestionElider", "DelayElider", "ElidingScheduler"]

log = logging.getLogger("meshbus.eliding")

_DIRECT = DeliveryMode.DIRECT
# Deadlines are sums of float seconds (0.4 + 0.2 > 0.6): a timer due within a
# nanosecond counts as due, so rounding never costs a whole extra tick.
_EPSILON = 1e-9


class _TopicState:
    """Eliding state of one topic for one session."""

    __slots__ = ("elider", "held", "last_sent", "scheduled")

    def __init__(self, elider: DelayElider, last_sent: float) -> None:
        self.elider = elider
        self.last_sent = last_sent
        self.held: Message | None = None
        self.scheduled = False


class ElidingScheduler:
    """The node's one timer task: fires held messages when their delay expires."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, _TopicState]] = []
        self._seq = itertools.count()
        self._wake: anyio.Event | None = None
        self._sleep_scope: anyio.CancelScope | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, deadline: float, state: _TopicState) -> None:
        heap = self._heap
        earliest = heap[0][0] if heap else None
        heapq.heappush(heap, (deadline, next(self._seq), state))
        if earliest is None or deadline < earliest:
            # The task sleeps until a later deadline, or waits for work: make it look again.
            if self._wake is not None:
                self._wake.set()
            if self._sleep_scope is not None:
                self._sleep_scope.cancel()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        heap = self._heap
        clock = self.clock
        while True:
            if not heap:
                self._wake = anyio.Event()
                await self._wake.wait()
                self._wake = None
                continue
            now = clock.monotonic()
            while heap and heap[0][0] <= now + _EPSILON:
                _, _, state = heapq.heappop(heap)
                state.elider.fire(state, now)
            if heap:
                with anyio.CancelScope() as scope:
                    self._sleep_scope = scope
                    await clock.sleep_until(heap[0][0] - _EPSILON)
                self._sleep_scope = None


class DelayElider:
    """The eliding stage of one session with ``eliding_delay_ms`` > 0."""

    def __init__(
        self, session: Session, scheduler: ElidingScheduler, delay: float, max_topics: int
    ) -> None:
        self.session = session
        self.sink = session.sink
        self.scheduler = scheduler
        self.delay = delay
        self.max_topics = max_topics
        self.topics: OrderedDict[str, _TopicState] = OrderedDict()
        self.closed = False
        self.aged_out = 0
        self._monotonic = scheduler.clock.monotonic

    def deliver(self, message: Message) -> None:
        if not message.eliding_eligible or message.delivery_mode is not _DIRECT:
            self.sink(message)
            return
        now = self._monotonic()
        topics = self.topics
        state = topics.get(message.topic)
        if state is None:
            if len(topics) >= self.max_topics:
                self._age_out()
            topics[message.topic] = _TopicState(self, now)
            self.sink(message)
            return
        topics.move_to_end(message.topic)
        if state.held is None and now - state.last_sent >= self.delay - _EPSILON:
            state.last_sent = now
            self.sink(message)
            return
        state.held = message  # replaces an older held message: that is the eliding
        if not state.scheduled:
            state.scheduled = True
            self.scheduler.schedule(state.last_sent + self.delay, state)

    def fire(self, state: _TopicState, now: float) -> None:
        """The delay of ``state`` expired: send what it holds."""
        state.scheduled = False
        message = state.held
        if message is None or self.closed:
            return
        state.held = None
        state.last_sent = now
        self.sink(message)

    def _age_out(self) -> None:
        _, oldest = self.topics.popitem(last=False)
        if oldest.held is not None:  # forget the topic, not its last update
            message, oldest.held = oldest.held, None
            self.sink(message)
        self.aged_out += 1
        if self.aged_out == 1:
            log.info(
                "session %r tracks more than %d eliding topics; ageing out the oldest",
                self.session.client_name,
                self.max_topics,
            )

    def close(self) -> None:
        self.closed = True
        self.topics.clear()


class CongestionElider:
    """The eliding stage of one session with ``eliding_delay_ms == 0``."""

    def __init__(self, session: Session, max_topics: int) -> None:
        self.session = session
        self.sink = session.sink
        self.egress = session.egress
        self.max_topics = max_topics
        self.held: dict[str, Message] = {}
        self.aged_out = 0
        self.egress.on_drained = self.release

    def deliver(self, message: Message) -> None:
        if not message.eliding_eligible or message.delivery_mode is not _DIRECT:
            self.sink(message)
            return
        if not len(self.egress) and not self.held:  # the consumer keeps up
            self.sink(message)
            return
        held = self.held
        if message.topic not in held and len(held) >= self.max_topics:
            oldest = next(iter(held))
            self.sink(held.pop(oldest))
            self.aged_out += 1
        held[message.topic] = message

    def release(self) -> None:
        """The consumer emptied its buffer: hand over the latest message of each topic."""
        held, self.held = self.held, {}
        for message in held.values():
            self.sink(message)

    def close(self) -> None:
        self.held.clear()
        self.egress.on_drained = None


SCHEDULER: StashKey[ElidingScheduler] = StashKey()
ELIDER: StashKey[DelayElider | CongestionElider] = StashKey()


@hookimpl
def meshbus_configure(node: Node) -> None:
    node.stash[SCHEDULER] = ElidingScheduler(node.clock)


@hookimpl
def meshbus_lifespan(node: Node) -> AbstractAsyncContextManager[None]:
    return _run_scheduler(node)


@asynccontextmanager
async def _run_scheduler(node: Node) -> AsyncIterator[None]:
    await node.task_group.start(node.stash[SCHEDULER].run, name="meshbus eliding scheduler")
    yield


@hookimpl
def meshbus_session_opened(session: Session) -> None:
    profile = session.client_profile
    if not profile.eliding_enabled:
        return
    elider: DelayElider | CongestionElider
    if profile.eliding_delay_ms > 0:
        scheduler = session.node.stash[SCHEDULER]
        elider = DelayElider(
            session, scheduler, profile.eliding_delay_ms / 1000, profile.max_eliding_topics
        )
    else:
        elider = CongestionElider(session, profile.max_eliding_topics)
    session.stash[ELIDER] = elider
    deliver: Callable[[Message], None] = elider.deliver
    session.deliver = deliver


@hookimpl
def meshbus_session_closed(session: Session) -> None:
    elider = session.stash.get(ELIDER, None)
    if elider is not None:
        elider.close()
