"""What an end of a :class:`~meshbus.transports.WireLink` asks of its peer
(filters and queues), told again on every connection before the link is in sync."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meshbus._links import LinkState
from meshbus._topics import parse_subscription

from ._framing import FrameKind

if TYPE_CHECKING:
    from ._connection import Connection

K = FrameKind

__all__ = ["Asking"]

log = logging.getLogger("meshbus.links")


class Asking:
    """The asking half of :class:`~meshbus.transports.WireLink` (a mixin: it uses the
    link's connection, requests and flows)."""

    # What it uses of the link (declared for the type checker; the link sets them).
    name: str
    refusals: dict[str, str]
    _wants: dict[str, None]
    _pulls: dict[str, int]
    _connection: Connection | None
    _start: Callable[..., None]
    _request: Callable[..., Any]
    _bind: Callable[..., Any]
    _bind_answer: Callable[[str, int], Callable[[], Any]]
    set_state: Callable[..., None]

    @property
    def wants(self) -> tuple[str, ...]:
        """The filters this side asks the peer for."""
        return tuple(self._wants)

    def want(self, topic_filter: str) -> None:
        """Ask the peer for the messages matching ``topic_filter``, now and after every
        reconnect. A refusal is logged and kept in :attr:`refusals`."""
        parse_subscription(topic_filter)
        if topic_filter in self._wants:
            return
        self._wants[topic_filter] = None
        if self._connection is not None:
            self._start(self._ask, K.SUBSCRIBE, {"subscription": topic_filter}, topic_filter)

    def unwant(self, topic_filter: str) -> None:
        """Stop asking for ``topic_filter``."""
        if self._wants.pop(topic_filter, 0) is None and self._connection is not None:
            self.refusals.pop(topic_filter, None)
            self._start(self._ask, K.UNSUBSCRIBE, {"subscription": topic_filter}, topic_filter)

    def pull(self, queue: str, *, window: int = 255) -> None:
        """Bind a flow to the peer's ``queue`` (now and after every reconnect) and spool
        what it delivers here, acknowledging each message once it is held."""
        if not 1 <= window <= 65_535:
            raise ValueError(f"window must be 1..65535, got {window!r}")
        if queue in self._pulls:
            return
        self._pulls[queue] = window
        if self._connection is not None:
            self._start(self._bind, queue, window)

    # --- telling the peer what this side wants -------------------------------------------

    async def _sync(self) -> None:
        """Tell the peer everything this side wants, then the link is in sync."""
        asks = [self._ask_answer(K.SUBSCRIBE, {"subscription": f}, f) for f in list(self._wants)]
        for queue, window in list(self._pulls.items()):
            asks.append(self._bind_answer(queue, window))
        for ask in asks:
            await ask()
        if self._connection is not None:
            self.set_state(LinkState.IN_SYNC)

    async def _ask(self, kind: FrameKind, header: dict[str, Any], key: str) -> None:
        await self._ask_answer(kind, header, key)()

    def _ask_answer(self, kind: FrameKind, header: dict[str, Any], key: str) -> Callable[[], Any]:
        answer = self._request(kind, header)

        async def wait() -> None:
            await answer.done.wait()
            if answer.error is not None and self._connection is not None:
                self.refusals[key] = str(answer.error)
                log.warning("link %r: the peer refused %s: %s", self.name, key, answer.error)
            elif answer.error is None:
                self.refusals.pop(key, None)

        return wait
