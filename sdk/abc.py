"""Interfaces that applications and plugins implement or receive."""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["Clock"]


class Clock(ABC):
    """Where a node gets time from; injectable so timers can be tested without sleeping."""

    @abstractmethod
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (timers, delays)."""

    @abstractmethod
    def time(self) -> float:
        """Wall-clock seconds since the epoch (message timestamps)."""

    @abstractmethod
    async def sleep_until(self, deadline: float) -> None:
        """Return once :meth:`monotonic` has reached ``deadline``."""
