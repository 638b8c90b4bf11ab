"""Reconnect delays for remote sessions and links."""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    """Reconnect delays: ``initial`` doubling to ``maximum``, each with random jitter.

    The jitter (up to ``jitter`` of the delay, either way) keeps many clients cut off
    together from coming back together.
    """

    def __init__(
        self,
        initial: float = 1.0,
        maximum: float = 120.0,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self._rng = rng or random.Random()
        self.attempt = 0

    def __eq__(self, other: object) -> bool:
        """Two backoffs are equal when their policy is (not the attempts they counted)."""
        if not isinstance(other, Backoff):
            return NotImplemented
        return self._policy() == other._policy()

    def __hash__(self) -> int:
        return hash(self._policy())

    def __repr__(self) -> str:
        return f"Backoff(initial={self.initial}, maximum={self.maximum}, jitter={self.jitter})"

    def _policy(self) -> tuple[float, float, float]:
        return (self.initial, self.maximum, self.jitter)

    def next_delay(self) -> float:
        """The delay before the next attempt (and count the attempt)."""
        base = min(self.maximum, self.initial * 2.0 ** min(self.attempt, 64))
        self.attempt += 1
        return base * (1 + self._rng.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        """Start again from ``initial`` (after a successful login)."""
        self.attempt = 0

    def fresh(self) -> Backoff:
        """A backoff with the same policy that counts its own attempts from none."""
        return Backoff(self.initial, self.maximum, self.jitter, self._rng)
