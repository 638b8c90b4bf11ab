"""What a stream is: the spec a reader sends, its id, its partitions and what feeds them."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

import attrs

from ._errors import BridgeError
from ._log import StreamLog

if TYPE_CHECKING:
    from meshbus import Message, Session
    from meshbus.abc import Flow

__all__ = ["Stream", "StreamSpec", "partition_of"]

_MAX_PARTITIONS = 256


@attrs.frozen
class StreamSpec:
    """Topic filters or one queue, split into ``partitions``: where a stream's messages
    come from and how they are numbered."""

    subscribe: tuple[str, ...] = ()
    queue: str | None = None
    partitions: int = 1

    @property
    def id(self) -> str:
        """How checkpointed offsets name the stream (``queue:orders``, ``a/>,b/*``, and
        ``#N`` after either when it has N partitions)."""
        base = f"queue:{self.queue}" if self.queue is not None else ",".join(self.subscribe)
        return base if self.partitions == 1 else f"{base}#{self.partitions}"

    @classmethod
    def from_wire(cls, value: Any) -> StreamSpec:
        if isinstance(value, dict):
            partitions = value.get("partitions", 1)
            if type(partitions) is not int or not 1 <= partitions <= _MAX_PARTITIONS:
                raise BridgeError(f"not a partition count: {partitions!r}")
            queue = value.get("queue")
            if isinstance(queue, str) and queue:
                return cls(queue=queue, partitions=partitions)
            filters = value.get("subscribe")
            if isinstance(filters, list) and filters and all(isinstance(f, str) for f in filters):
                return cls(subscribe=tuple(sorted(set(filters))), partitions=partitions)
        raise BridgeError(f"not a stream spec: {value!r}")

    def to_wire(self) -> dict[str, Any]:
        spec: dict[str, Any] = (
            {"queue": self.queue} if self.queue is not None else {"subscribe": list(self.subscribe)}
        )
        if self.partitions != 1:
            spec["partitions"] = self.partitions
        return spec


def partition_of(message: Message, partitions: int) -> int:
    """The partition of ``message``: by its key (the correlation ID) as Kafka does, else
    by its topic, so each key's and each topic's messages stay in order in one partition.
    CRC-32 rather than ``hash()``: the same in every process and every run."""
    key = message.correlation_id
    return zlib.crc32((key if key is not None else message.topic).encode()) % partitions


@attrs.define(eq=False)
class Stream:
    """A running stream: a log per partition, and what feeds them (a session or a flow)."""

    spec: StreamSpec
    logs: list[StreamLog]
    session: Session | None = None
    flow: Flow | None = None
    failure: str | None = None

    @property
    def log(self) -> StreamLog:
        """The log of a stream with one partition."""
        return self.logs[0]

    def append(self, message: Message) -> None:
        """Number ``message`` in its partition (the capture's callback)."""
        logs = self.logs
        if len(logs) == 1:
            logs[0].append(message)
        else:
            logs[partition_of(message, len(logs))].append(message)

    def partition(self, number: Any) -> StreamLog:
        if type(number) is not int or not 0 <= number < len(self.logs):
            raise BridgeError(f"stream {self.spec.id!r} has no partition {number!r}")
        return self.logs[number]
