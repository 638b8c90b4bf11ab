"""Clock implementations: the system clock and a manual one for tests."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import anyio
import anyio.lowlevel

from .abc import Clock

__all__ = ["ManualClock", "SystemClock"]


class SystemClock(Clock):
    """Real time: :func:`time.monotonic`, :func:`time.time` and :func:`anyio.sleep`."""

    # The builtins themselves, so reading the clock on the publish path costs no Python frame.
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep(max(0.0, deadline - time.monotonic()))

    def move_on_after(self, seconds: float) -> AbstractContextManager[anyio.CancelScope]:
        return anyio.move_on_after(seconds)


class _Timer:
    """One deadline on a :class:`ManualClock`: wakes a sleeper or cancels a scope."""

    __slots__ = ("action", "live")

    def __init__(self, action: Callable[[], object]) -> None:
        self.action = action
        self.live = True


class ManualClock(Clock):
    """A clock that only moves when told to; sleepers wake when time passes them.

    ``time()`` is ``epoch + monotonic()``, so timestamps move with it. Besides
    :meth:`advance`, which moves time at once, tests can let time pass the way a
    scenario would (:meth:`run`, :meth:`wait_for`): every task runs until it waits
    (:meth:`settle`), then time jumps to the next deadline, and so on. A test of a
    backoff over ten minutes then runs in milliseconds and gives the same result
    every time.
    """

    def __init__(self, start: float = 0.0, epoch: float = 1_700_000_000.0) -> None:
        self._now = start
        self._epoch = epoch
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._epoch + self._now

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        timer = self._add(deadline, event.set)
        try:
            await event.wait()
        finally:
            timer.live = False

    @contextmanager
    def move_on_after(self, seconds: float) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            timer = self._add(self._now + seconds, scope.cancel)
            try:
                yield scope
            finally:
                timer.live = False  # no cancel for a scope that is gone

    def _add(self, deadline: float, action: Callable[[], object]) -> _Timer:
        timer = _Timer(action)
        heapq.heappush(self._timers, (deadline, next(self._seq), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward and fire every deadline it passes, in deadline order."""
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        self.advance_to(self._now + seconds)

    def advance_to(self, when: float) -> None:
        """Move time forward to ``when`` exactly (no sum of small steps drifting), firing
        every deadline it passes, in deadline order."""
        if when < self._now:
            raise ValueError("a clock cannot go back")
        self._now = when
        timers = self._timers
        while timers and timers[0][0] <= self._now:
            timer = heapq.heappop(timers)[2]
            if timer.live:
                timer.live = False
                timer.action()

    @property
    def sleepers(self) -> int:
        """How many deadlines are pending (tasks sleeping, scopes with a deadline)."""
        return sum(1 for _, _, timer in self._timers if timer.live)

    @property
    def next_deadline(self) -> float | None:
        """The earliest pending deadline, or ``None``."""
        timers = self._timers
        while timers and not timers[0][2].live:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    async def settle(self) -> None:
        """Return once every other task is waiting (for time or for an event); time
        does not move. What tasks do in response to each other (a message crossing
        an in-memory link and its acknowledgement) happens before this returns."""
        await wait_all_blocked()

    async def run(self, seconds: float) -> None:
        """Let ``seconds`` pass the way they would in real time: settle, jump to the
        next deadline, settle again, until ``seconds`` have passed."""
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        end = self._now + seconds
        while True:
            await self.settle()
            deadline = self.next_deadline
            if deadline is None or deadline > end:
                break
            self.advance_to(max(deadline, self._now))
        self.advance_to(end)
        await self.settle()

    async def wait_for(self, condition: Callable[[], bool], within: float = 60.0) -> float:
        """Let time pass (as :meth:`run` does) until ``condition()`` holds; return the
        seconds that passed.

        :raises TimeoutError: it did not hold after ``within`` seconds.
        """
        start = self._now
        end = start + within
        while True:
            await self.settle()
            if condition():
                return self._now - start
            deadline = self.next_deadline
            if deadline is None or deadline > end:
                raise TimeoutError(
                    f"condition still false after {self._now - start:g} s of clock time"
                    + ("" if deadline is not None else " (nothing left to wait for)")
                )
            self.advance_to(max(deadline, self._now))


async def wait_all_blocked() -> None:
    """Return once every other task of the event loop is waiting on something.

    On trio this is :func:`trio.testing.wait_all_tasks_blocked`. On asyncio's own
    loop it yields until the loop has nothing else ready to run; other loops fall
    back to :func:`anyio.wait_all_tasks_blocked` (which polls every 0.1 s of real time).
    """
    import sniffio

    if sniffio.current_async_library() == "trio":
        import trio.testing

        await trio.testing.wait_all_tasks_blocked()
        return
    import asyncio

    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    if ready is None:
        await anyio.wait_all_tasks_blocked()
        return
    quiet = 0
    while quiet < 2:  # two passes in a row with nothing else ready: all are waiting
        await asyncio.sleep(0)
        quiet = quiet + 1 if not ready else 0
