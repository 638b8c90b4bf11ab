"""Advertisements on a :class:`~meshbus.transports.WireLink`: sending them, and checking
the order of what the peer sends before a routing plugin sees it (see the ADVERTISE
frame in the link protocol)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from meshbus.errors import ProtocolError

from . import _events as ev
from ._framing import FrameKind

if TYPE_CHECKING:
    from meshbus._vpn import Vpn

    from ._connection import Connection

K = FrameKind

__all__ = ["Advertising"]


class Advertising:
    """The advertising half of :class:`~meshbus.transports.WireLink` (a mixin: it uses
    the link's connection, epoch and sequence counters)."""

    # What it uses of the link (declared for the type checker; the link sets them).
    vpn: Vpn
    on_advertise: Callable[[Any, ev.Advertise], None] | None
    _connection: Connection | None
    _advertised: tuple[int, int] | None
    _resync_asked: bool
    _my_epoch: int
    _my_seq: int
    _control_frame: Callable[..., None]
    count_drop: Callable[[str], None]

    def advertise(
        self,
        add: Iterable[str] = (),
        remove: Iterable[str] = (),
        *,
        snapshot: bool = False,
        data: dict[str, Any] | None = None,
    ) -> bool:
        """Send an ADVERTISE; a ``snapshot`` starts a new epoch. Return ``False`` when the
        link is down (the next connection starts with a snapshot: send one then)."""
        if self._connection is None:
            return False
        if snapshot:
            self._my_epoch = self.vpn.node.next_origin_id()
            self._my_seq = 0
        else:
            self._my_seq += 1
        event = ev.Advertise(
            self._my_epoch,
            self._my_seq,
            snapshot,
            tuple(add),
            tuple(remove),
            False,
            None,
            data or {},
        )
        try:
            self._control_frame(K.ADVERTISE, event.encode())
        except ProtocolError:  # closing: the next connection starts with a snapshot
            return False
        return True

    def _advertise_received(self, event: ev.Advertise) -> None:
        if event.resync:
            self._hand_over(event)
            return
        last = self._advertised
        if event.snapshot:
            self._advertised = (event.epoch, event.seq)
            self._resync_asked = False
        elif last is None or last[0] != event.epoch or event.seq != last[1] + 1:
            # A gap: ignore what follows until the snapshot asked for (once) arrives.
            self.count_drop("advertise_gap")
            if last is not None or not self._resync_asked:
                self._resync_asked = True
                self._control_frame(
                    K.ADVERTISE, ev.Advertise(0, 0, False, (), (), True, None, {}).encode()
                )
            self._advertised = None
            return
        else:
            self._advertised = (event.epoch, event.seq)
        self._hand_over(event)

    def _hand_over(self, event: ev.Advertise) -> None:
        handler = self.on_advertise
        if handler is not None:
            handler(self, event)
