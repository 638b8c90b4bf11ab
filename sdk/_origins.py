"""Origin de-duplication (SPEC 7): what a VPN remembers of the messages that crossed
its links, so that any graph of links delivers a publish at most once per subscriber."""

from __future__ import annotations

from collections.abc import Callable

from .errors import ConfigurationError

__all__ = ["COPY_SEEN", "NEW", "SEEN", "OriginFilter"]

# What OriginFilter.check_guaranteed found (also its class attributes): a message not
# seen lately, one whose direct copy was delivered here (its endpoints have not had
# it), one seen whole (a duplicate).
NEW, COPY_SEEN, SEEN = 0, 1, 2


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

    A guaranteed message is routed on its node as a direct copy (what client
    subscriptions get) besides being spooled, and the copy can cross links, reaching a
    node before the message itself, which a flow brings later. Such a copy is
    remembered also as *only a copy* (:meth:`check_copy`), so that the message that
    follows is still spooled there, to its endpoints only (:meth:`check_guaranteed`),
    however long it took. Until it comes, its copy is remembered: at most half of
    ``max_entries`` such origins are kept, the oldest let go first.

    A guaranteed message can wait in queues for long on its way, so the origins of
    those this VPN had whole (spooled from a link) or sent over a link are kept for
    room, not time, too (another half of ``max_entries`` at most): its direct copy,
    passed on by a node further down its way once that node took it at last, is then
    still known here, however late it comes back.
    """

    __slots__ = (
        "_copies",
        "_count",
        "_current",
        "_half",
        "_kept",
        "_now",
        "_previous",
        "_previous_count",
        "_rotate_at",
        "max_entries",
        "window",
    )

    NEW = NEW
    COPY_SEEN = COPY_SEEN
    SEEN = SEEN

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
        # Origins seen only as the direct copy of a guaranteed message, oldest first.
        self._copies: dict[tuple[str, int], None] = {}
        # Origins of guaranteed messages this VPN had whole or sent over links, kept
        # for room rather than time (see check_guaranteed and hold), oldest first.
        self._kept: dict[tuple[str, int], None] = {}

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
        if self._kept and origin in self._kept:
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

    def check_copy(self, origin: tuple[str, int]) -> bool:
        """:meth:`check` for the direct copy of a guaranteed message: if it was not
        seen, remember it as seen only as a copy."""
        copies = self._copies
        if origin in copies or self.check(origin):
            return True
        copies[origin] = None
        if len(copies) > self._half:
            del copies[next(iter(copies))]
        return False

    def check_guaranteed(self, origin: tuple[str, int]) -> int:
        """:meth:`check` for a guaranteed message about to be spooled: ``NEW`` (now
        remembered), ``COPY_SEEN`` (only its direct copy was: now remembered as
        seen whole; spool it, but deliver no direct copy again) or ``SEEN``.

        Copies are not forgotten with their generation, only for room: the message
        may wait in a queue far longer than the window before it follows its copy. And
        a message taken whole is kept for room too: another node may hold it in a
        queue for long before its direct copy comes back here.
        """
        if self._copies and self._copies.pop(origin, 0) is None:
            self.check(origin)
            self._keep(origin)
            return COPY_SEEN
        if self.check(origin):
            return SEEN
        self._keep(origin)
        return NEW

    def remember(self, origin: tuple[str, int]) -> None:
        """Remember ``origin`` as seen now, for a whole window from now, even if it was
        seen before (and no longer for room: see :meth:`forget`)."""
        self.forget(origin)
        self.check(origin)

    def hold(self, origin: tuple[str, int]) -> None:
        """A message that left over a link and may come back: ``origin`` is seen for as
        long as there is room, however long that is."""
        self._keep(origin)

    def release(self, origin: tuple[str, int]) -> None:
        """The message of ``origin`` was taken (see :meth:`hold`): still kept, now as the
        newest, and remembered for a window from now too.

        Kept for room, not time: the nodes down the message's way may hold it in their
        own queues for long before they pass on its direct copy, which then comes back
        here. This VPN had the message whole, so any copy is a duplicate here.
        """
        self.remember(origin)  # first: it forgets, then checks
        self._keep(origin)

    def _keep(self, origin: tuple[str, int]) -> None:
        """Keep ``origin`` for room (the newest of at most half of ``max_entries``, the
        oldest let go first)."""
        kept = self._kept
        kept.pop(origin, None)
        kept[origin] = None
        if len(kept) > self._half:
            del kept[next(iter(kept))]

    def forget(self, origin: tuple[str, int], *, copy_seen: bool = False) -> None:
        """Forget ``origin``: the message was refused, and its next copy is not a duplicate.

        :param copy_seen: its direct copy was delivered here before (what
            :meth:`check_guaranteed` said): remember that again.
        """
        self._kept.pop(origin, None)
        node, number = origin
        for generation in (self._current, self._previous):
            ids = generation.get(node)
            if ids is not None and number in ids:
                ids.discard(number)
                if generation is self._current:
                    self._count -= 1
                else:
                    self._previous_count -= 1
        if copy_seen:
            self.check_copy(origin)
