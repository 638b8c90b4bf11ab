"""Interfaces that applications and plugins implement or receive."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio

from .errors import PublishRejectedError

if TYPE_CHECKING:
    from ._links import Link
    from ._messages import Message
    from ._session import Session
    from ._stats import QueueStatistics
    from ._vpn import Vpn

__all__ = [
    "Clock",
    "Flow",
    "GuaranteedMessaging",
    "RetainedMessages",
    "ServiceHandler",
    "SessionAPI",
]


class ServiceHandler(Protocol):
    """A service a plugin provides to remote clients (:meth:`meshbus.Node.provide_service`).

    Called in the node's event loop for each call, with the calling :class:`Session`
    (whose VPN, user and ACL the service should apply), the call's ``args`` (a JSON
    object) and its ``body``; returns the answer's fields (a JSON object) and body.
    Raise a :class:`~meshbus.MeshbusError` to answer with an error.
    """

    async def __call__(
        self, session: Session, args: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]: ...


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

    @abstractmethod
    def move_on_after(self, seconds: float) -> AbstractContextManager[anyio.CancelScope]:
        """A cancel scope that this clock cancels ``seconds`` from now.

        As :func:`anyio.move_on_after`, but on this clock: with a
        :class:`~meshbus.ManualClock` the scope is cancelled when the test moves
        time past the deadline, never by the wall clock. Use it with ``with``; its
        ``cancelled_caught`` tells whether the deadline passed.
        """

    @contextmanager
    def fail_after(self, seconds: float) -> Iterator[anyio.CancelScope]:
        """As :func:`anyio.fail_after` on this clock: raise :class:`TimeoutError` when
        the block is still running ``seconds`` from now (it is cancelled first)."""
        with self.move_on_after(seconds) as scope:
            yield scope
        if scope.cancelled_caught:
            raise TimeoutError(f"timed out after {seconds:g} s")


class Flow(ABC):
    """A consumer's binding to a queue: receive guaranteed messages, then ack each."""

    @abstractmethod
    async def receive(self) -> Message:
        """Wait for the next message (at most ``window`` can be unacknowledged)."""

    @abstractmethod
    def receive_nowait(self) -> Message | None:
        """The next message the flow holds for the application, or ``None`` at once.

        Never waits: a flow that holds nothing asks the node for more in the
        background, so a later call finds what has come meanwhile.
        """

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
    def add_subscription(self, name: str, subscription: str, *, vpn: str = "default") -> None:
        """Add a subscription to a queue while it runs (a no-op if it has it already)."""

    @abstractmethod
    def remove_subscription(self, name: str, subscription: str, *, vpn: str = "default") -> None:
        """Remove a subscription from a queue while it runs (a no-op if it has none such)."""

    @abstractmethod
    def queue_statistics(self, vpn: str | None = None) -> list[QueueStatistics]:
        """The depth, quota, flows and counters of every queue and topic endpoint of
        ``vpn`` (of every VPN for ``None``), ordered by VPN, kind and name."""

    @abstractmethod
    async def delete_queue(self, name: str, *, vpn: str = "default") -> None:
        """Unbind a queue's flows, delete its messages and forget it.

        :raises StateError: no such queue.
        """

    @abstractmethod
    async def purge_queue(self, name: str, *, vpn: str = "default") -> int:
        """Delete every message a queue holds, those handed to flows and not yet
        acknowledged too (their acks are then ignored); return how many.

        :raises StateError: no such queue.
        """

    @abstractmethod
    def enable_queue(
        self,
        name: str,
        *,
        vpn: str = "default",
        ingress: bool | None = None,
        egress: bool | None = None,
    ) -> None:
        """Switch a queue's ingress (it takes messages) and egress (flows bind and
        receive) on or off; ``None`` leaves one as it is. Bound flows stay bound
        while egress is off and receive again once it is on.

        :raises StateError: no such queue.
        """

    @abstractmethod
    async def send(
        self, session: Session, topic: str, payload: bytes, options: Mapping[str, Any]
    ) -> None:
        """Publish a guaranteed message to a topic; return once the bus holds it."""

    @abstractmethod
    async def send_to_queue(
        self, session: Session, queue: str, payload: bytes, options: Mapping[str, Any]
    ) -> None:
        """Publish a guaranteed message to a queue by name; return once the bus holds it.

        An implementation checks the session's ACL first, with
        :meth:`Session.check_publish_acl() <meshbus.Session.check_publish_acl>` on the
        queue's topic ``#P2P/QUE/<queue>`` (SPEC 4), and stores nothing when it is denied.
        """

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

    async def put_in_queue(self, vpn: str, queue: str, message: Message) -> int:
        """Spool ``message`` to the queue ``queue`` of VPN ``vpn`` only, whatever its
        subscriptions, keeping its topic, delivery mode and ``retained`` flag: for a
        plugin that gives one consumer one message through its queue (the MQTT
        listener's retained values at QoS 1). Returns once it is held, the
        :attr:`~meshbus.Message.message_id` the queue's flows will give it.

        :raises PublishRejectedError: no such queue, or it cannot take the message now.
        """
        raise PublishRejectedError("unsupported", "putting a message in one queue")

    @abstractmethod
    async def spool_from_link(
        self, link: Link, message: Message, *, delivered: bool = False
    ) -> tuple[str, ...]:
        """Take a guaranteed message that came in over ``link`` (SPEC 7).

        Spool it to every endpoint of the link's VPN whose subscriptions match, in one
        commit, or to none: when a matching endpoint cannot take it now, raise
        :class:`~meshbus.errors.PublishRejectedError` and keep nothing (the peer sends it
        again later). Then deliver its direct copy to matching client subscriptions
        and other links, unless ``delivered``: its direct copy came first, over some
        link, and was delivered so. Return the endpoints that hold it (empty when none
        matched: the message is dropped as guaranteed, counted
        ``no_eligible_destination``). Returns only once it is held, so the link can
        acknowledge it to the peer.
        """

    async def spool_many_from_link(
        self,
        link: Link,
        messages: Sequence[Message],
        *,
        delivered: Sequence[bool] | None = None,
    ) -> tuple[list[tuple[str, ...]], PublishRejectedError | None]:
        """Take several guaranteed messages that came in over ``link``, in order, as
        :meth:`spool_from_link` takes one, up to the first one that an endpoint refuses.

        :param delivered: for each message, whether its direct copy was delivered
            already (see :meth:`spool_from_link`); ``None``: none was.

        Return the endpoints that hold each message taken, in order, and the refusal of
        the first message not taken (``None`` when all were taken); that message and
        those after it were not kept. An implementation should store the messages it
        takes in one commit (this default commits one at a time).
        """
        taken: list[tuple[str, ...]] = []
        for i, message in enumerate(messages):
            try:
                done = delivered is not None and delivered[i]
                taken.append(await self.spool_from_link(link, message, delivered=done))
            except PublishRejectedError as refusal:
                return taken, refusal
        return taken, None


class RetainedMessages(ABC):
    """What a retained-messages plugin provides (SPEC 12): each VPN's kept last values.

    A plugin registers one per node with :meth:`meshbus.Node.provide_retained`;
    :meth:`meshbus.Session.publish` and :meth:`~meshbus.Session.send` with
    ``retain=True`` hand it the message before it is routed.
    """

    @abstractmethod
    def check(self, vpn: Vpn, topic: str, size: int) -> None:
        """Raise :class:`~meshbus.errors.PublishRejectedError` if a retained message of
        ``size`` bytes on ``topic`` would not be kept (a limit of the VPN); keep nothing."""

    @abstractmethod
    def keep(self, vpn: Vpn, message: Message) -> None:
        """Keep ``message`` as its topic's last value (an empty payload clears it).

        :raises PublishRejectedError: a limit of the VPN; nothing changed.
        """

    @abstractmethod
    async def flush(self) -> None:
        """Return once what :meth:`keep` took is as durable as the node keeps it."""


@runtime_checkable
class SessionAPI(Protocol):
    """What a session offers, in the process (:class:`meshbus.Session`) or over the
    network (:class:`meshbus.transports.RemoteSession`) alike.

    Code written against this protocol runs on either; one behaviour test suite
    holds both to it. Where they differ is when refusals arrive: an in-process
    session applies a subscription or publish at once and raises at the call, a
    remote one sends it and raises the node's refusal from :meth:`confirm`. After
    ``await confirm()`` both have applied every earlier call.
    """

    @property
    def client_name(self) -> str | None:
        """The session's client name."""

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """The subscriptions it holds, as given."""

    @property
    def closed(self) -> bool:
        """Whether it is closed."""

    def publish(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str = b"",
        *,
        headers: Mapping[str, Any] | None = None,
        eliding_eligible: bool = False,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        retain: bool = False,
        ttl: float | None = None,
    ) -> None:
        """Publish a direct message; never waits for subscribers."""

    def subscribe(self, subscription: str) -> None:
        """Add a subscription (a no-op when it has it)."""

    def unsubscribe(self, subscription: str) -> None:
        """Remove a subscription (a no-op when it has none such)."""

    def subscribe_for(self, client_name: str, subscription: str) -> None:
        """As a subscription manager, add a subscription to another session of the VPN."""

    def unsubscribe_for(self, client_name: str, subscription: str) -> None:
        """As a subscription manager, remove a subscription from another session."""

    async def confirm(self) -> None:
        """Return once every earlier call is applied; raise the first refusal since
        the last call (a remote session's subscribes and publishes are refused late)."""

    async def receive(self) -> Message:
        """Wait for the next direct message."""

    def receive_nowait(self) -> Message | None:
        """The next direct message waiting, or ``None``."""

    def __aiter__(self) -> AsyncIterator[Message]:
        """Iterate over received messages until the session closes."""

    async def send(
        self,
        topic: str,
        payload: bytes | bytearray | memoryview | str = b"",
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
        eliding_eligible: bool = False,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        retain: bool = False,
    ) -> None:
        """Publish a guaranteed message to a topic; return once the node holds it."""

    async def send_many(
        self,
        messages: Iterable[tuple[str, bytes | bytearray | memoryview | str]],
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
    ) -> list[Exception | None]:
        """Publish many guaranteed messages; one result per message, in order."""

    async def send_to_queue(
        self,
        queue: str,
        payload: bytes | bytearray | memoryview | str = b"",
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
        reply_to: str | None = None,
        correlation_id: str | None = None,
    ) -> None:
        """Publish a guaranteed message to one queue by name."""

    async def bind(self, queue: str, *, window: int = 255) -> Flow:
        """Bind a consumer flow to a queue."""

    async def bind_topic_endpoint(
        self, endpoint: str, subscription: str, *, window: int = 255
    ) -> Flow:
        """Bind a consumer flow to a topic endpoint, naming its subscription."""

    async def aclose(self) -> None:
        """Close the session."""
