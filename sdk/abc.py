"""Interfaces that applications and plugins implement or receive."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._messages import Message
    from ._session import Session

__all__ = ["Clock", "Flow", "GuaranteedMessaging"]


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


class Flow(ABC):
    """A consumer's binding to a queue: receive guaranteed messages, then ack each."""

    @abstractmethod
    async def receive(self) -> Message:
        """Wait for the next message (at most ``window`` can be unacknowledged)."""

    @abstractmethod
    def ack(self, message: Message) -> None:
        """Acknowledge ``message``: the spool deletes it once every holder has acked."""

    @abstractmethod
    async def unbind(self) -> None:
        """Stop receiving; unacknowledged messages are redelivered to other consumers."""

    async def __aenter__(self) -> Flow:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.unbind()

    def __aiter__(self) -> Flow:
        return self

    @abstractmethod
    async def __anext__(self) -> Message:
        """The next message; stops when the flow is unbound."""


class GuaranteedMessaging(ABC):
    """What a guaranteed-messaging plugin provides to sessions (SPEC 4).

    A plugin registers one per node with :meth:`meshbus.Node.provide_guaranteed`;
    :meth:`meshbus.Session.send`, :meth:`~meshbus.Session.send_to_queue` and
    :meth:`~meshbus.Session.bind` delegate to it. The ``options`` they pass hold
    ``persistent``, ``headers``, ``ttl``, ``eliding_eligible``, ``reply_to``,
    ``correlation_id`` and ``size``: the bytes the headers and strings take, checked
    against :data:`meshbus.HEADER_LIMITS` already, so that a message's whole size
    (:attr:`meshbus.Message.size`) is its payload's length plus ``size``.
    """

    @abstractmethod
    def create_queue(self, name: str, *, vpn: str = "default", **settings: Any) -> Any:
        """Provision a queue in ``vpn`` (idempotent for identical settings); return it."""

    @abstractmethod
    async def send(
        self, session: Session, topic: str, payload: bytes, options: Mapping[str, Any]
    ) -> None:
        """Publish a guaranteed message to a topic; return once the bus holds it."""

    @abstractmethod
    async def send_to_queue(
        self, session: Session, queue: str, payload: bytes, options: Mapping[str, Any]
    ) -> None:
        """Publish a guaranteed message to a queue by name; return once the bus holds it."""

    @abstractmethod
    async def send_many(
        self,
        session: Session,
        messages: Sequence[tuple[str, bytes]],
        options: Mapping[str, Any],
    ) -> list[Exception | None]:
        """Publish many guaranteed messages to topics in one go; one result per message."""

    @abstractmethod
    async def bind(self, session: Session, queue: str, window: int) -> Flow:
        """Bind a consumer flow of ``session`` to ``queue``."""

    @abstractmethod
    async def bind_topic_endpoint(
        self, session: Session, endpoint: str, subscription: str, window: int
    ) -> Flow:
        """Bind a consumer flow to a topic endpoint, giving (or changing) its subscription."""
