"""What a stream is: the spec a reader sends, its id, and what captures it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ._errors import BridgeError
from ._log import StreamLog

if TYPE_CHECKING:
    from meshbus import Session
    from meshbus.abc import Flow

__all__ = ["Stream", "StreamSpec"]


@attrs.frozen
class StreamSpec:
    """Topic filters or one queue: where a stream's messages come from."""

    subscribe: tuple[str, ...] = ()
    queue: str | None = None

    @property
    def id(self) -> str:
        """How checkpointed offsets name the stream (``queue:orders`` or ``a/>,b/*``)."""
        return f"queue:{self.queue}" if self.queue is not None else ",".join(self.subscribe)

    @classmethod
    def from_wire(cls, value: Any) -> StreamSpec:
        if isinstance(value, dict):
            queue = value.get("queue")
            if isinstance(queue, str) and queue:
                return cls(queue=queue)
            filters = value.get("subscribe")
            if isinstance(filters, list) and filters and all(isinstance(f, str) for f in filters):
                return cls(subscribe=tuple(sorted(set(filters))))
        raise BridgeError(f"not a stream spec: {value!r}")

    def to_wire(self) -> dict[str, Any]:
        return (
            {"queue": self.queue} if self.queue is not None else {"subscribe": list(self.subscribe)}
        )


@attrs.define(eq=False)
class Stream:
    """A running stream: its log and what feeds it (a session or a queue flow)."""

    spec: StreamSpec
    log: StreamLog
    session: Session | None = None
    flow: Flow | None = None
    failure: str | None = None
