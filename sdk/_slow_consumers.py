"""The warning a node logs when a session starts discarding: a slow consumer.

A session whose egress buffer overflows loses its oldest messages (SPEC 5): the
consumer learns it from ``discard_indication`` and the operator from the
``discarded`` counters, but a counter nobody watches finds nothing. So the node also
logs, at ``WARNING`` on the ``meshbus.session`` logger, when a session *starts*
discarding. A session that keeps discarding is not named again until ``interval``
seconds of the node's clock have passed, and then the warning says how many were
discarded since the last one; a session that recovers and falls behind again later
gets a new warning. Across all sessions at most ``burst`` warnings are logged per
interval and the rest at ``DEBUG``, so a thousand slow consumers at once cannot
flood the log (the next warning counts those that were logged at ``DEBUG`` only).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .abc import Clock

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["SlowConsumerLog"]

log = logging.getLogger("meshbus.session")


class SlowConsumerLog:
    """Rate-limited slow-consumer warnings for one node (see the module's text).

    :param clock: the node's clock (the intervals are measured on it).
    :param interval: seconds between two warnings about one session, and the length
        of the window of ``burst``.
    :param burst: warnings logged at ``WARNING`` per interval, for all sessions.
    """

    __slots__ = ("_clock", "_logged", "_quiet", "_window", "burst", "interval")

    def __init__(self, clock: Clock, *, interval: float = 10.0, burst: int = 10) -> None:
        self._clock = clock
        self.interval = interval
        self.burst = burst
        self._window = float("-inf")
        self._logged = 0
        self._quiet = 0

    def discarded(self, session: Session, state: list[float]) -> None:
        """Note that ``session`` discarded messages; ``state`` is the session's own
        ``[time of its last warning, its discards counted then]``."""
        now = self._clock.monotonic()
        total = session._egress.discarded
        if now - state[0] < self.interval:
            return  # told recently: the next warning counts these
        since = total - int(state[1])
        state[0] = now
        state[1] = total
        if now - self._window >= self.interval:
            self._window = now
            self._logged = 0
        egress = session._egress
        text = (
            "slow consumer: session %r (username %r, VPN %r) discarded %d message(s); "
            "its egress buffer holds %d message(s), %d byte(s) (limits %d, %d); "
            "%d discarded since it opened"
        )
        args = (
            session.client_name,
            session.username,
            session.vpn.name,
            since,
            len(egress),
            egress.bytes,
            egress.max_messages,
            egress.max_bytes,
            total,
        )
        extra = {
            "client_name": session.client_name,
            "username": session.username,
            "vpn": session.vpn.name,
            "discarded": since,
            "discarded_total": total,
        }
        if self._logged >= self.burst:
            self._quiet += 1
            log.debug(text, *args, extra=extra)
            return
        self._logged += 1
        quiet, self._quiet = self._quiet, 0
        if quiet:
            text += f" ({quiet} more slow-consumer warnings were logged at DEBUG level only)"
        log.warning(text, *args, extra=extra)
