"""Origin de-duplication (SPEC 7): what a VPN remembers of the messages that crossed
its links, so that any graph of links delivers a publish at most once per subscriber."""

from __future__ import annotations

from collections.abc import Callable

from .errors import ConfigurationError

__all__ = ["OriginFilter"]


class OriginFilter:
    """Remembers the origins of messages seen lately: each for at least ``window``
    seconds, and for at most about twice that.

    Two generations of origins are kept: new ones go into the current one, and it
    becomes the previous one (whose origins are then forgotten a generation later) once
    it is ``window`` seconds old or holds half of ``max_entries``. So memory stays under
    roughly ``max_entries`` times 100 bytes, and under heavy traffic the window is the
    shorter of the two; duplicates that loops make arrive within milliseconds. A check
    runs for every message that crosses a link: it is two lookups and, for a new
    origin, one look at the clock.

    A generation maps each origin node to the set of its message ids, not a set of
    ``(node, id)`` pairs: a node numbers its messages in sequence, so the ids of one
    node land next to each other in their set (an int's hash is the int), and the
    sets hold ints, which the garbage collector need not visit.
    """

    __slots__ = (
        "_count",
        "_current",
        "_half",
        "_now",
        "_previous",
        "_previous_count",
        "_rotate_at",
        "max_entries",
        "window",
    )

    def __init__(
        self, now: Callable[[], float], window: float = 10.0, max_entries: int = 100_000
    ) -> None:
        if not window > 0 or max_entries < 1:
            raise ConfigurationError("origin de-duplication needs a window > 0 and entries >= 1")
        self._now = now
        self.window = window
        self.max_entries = max_entries
        self._half = max(1, max_entries // 2)  # the most one generation holds
        self._current: dict[str, set[int]] = {}
        self._previous: dict[str, set[int]] = {}
        self._count = 0  # origins in the current generation
        self._previous_count = 0
        self._rotate_at = float("inf")  # when the current generation is window seconds old

    def __len__(self) -> int:
        return self._count + self._previous_count

    def check(self, origin: tuple[str, int]) -> bool:
        """Whether ``origin`` was seen lately (see the class); remember it now if not."""
        node, number = origin
        ids = self._current.get(node)
        if ids is not None and number in ids:
            return True
        old = self._previous.get(node)
        if old is not None and number in old:
            return True
        now = self._now()
        if now >= self._rotate_at or self._count >= self._half:
            if now >= self._rotate_at + self.window:
                # Quiet for a whole generation: all of it is old.
                self._previous, self._previous_count = {}, 0
            else:
                self._previous, self._previous_count = self._current, self._count
            self._current, self._count, ids = {}, 0, None
            self._rotate_at = float("inf")
        if not self._count:
            self._rotate_at = now + self.window
        if ids is None:
            ids = self._current[node] = set()
        ids.add(number)
        self._count += 1
        return False

    def forget(self, origin: tuple[str, int]) -> None:
        """Forget ``origin``: the message was refused, and its next copy is not a duplicate."""
        node, number = origin
        for generation in (self._current, self._previous):
            ids = generation.get(node)
            if ids is not None and number in ids:
                ids.discard(number)
                if generation is self._current:
                    self._count -= 1
                else:
                    self._previous_count -= 1
