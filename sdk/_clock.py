"""Clock implementations: the system clock and a manual one for tests."""

from __future__ import annotations

import heapq
import itertools
import time

import anyio

from .abc import Clock

__all__ = ["ManualClock", "SystemClock"]


class SystemClock(Clock):
    """Real time: :func:`time.monotonic`, :func:`time.time` and :func:`anyio.sleep`."""

    # The builtins themselves, so reading the clock on the publish path costs no Python frame.
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep(max(0.0, deadline - time.monotonic()))


class ManualClock(Clock):
    """A clock that only moves when told to; sleepers wake when :meth:`advance` passes them.

    ``time()`` is ``epoch + monotonic()``, so timestamps move with it.
    """

    def __init__(self, start: float = 0.0, epoch: float = 1_700_000_000.0) -> None:
        self._now = start
        self._epoch = epoch
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
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
        heapq.heappush(self._sleepers, (deadline, next(self._seq), event))
        await event.wait()

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            heapq.heappop(self._sleepers)[2].set()

    @property
    def sleepers(self) -> int:
        """How many tasks are waiting on this clock."""
        return len(self._sleepers)
