"""A blocking facade for applications without an event loop.

The node runs on an event loop in a background thread (an anyio blocking
portal); every method here hands its work to that thread and waits::

    from meshbus import blocking

    node = blocking.start_node(data_dir="/var/lib/app")
    try:
        session = node.connect()
        session.subscribe("orders/>")
        session.publish_many([("orders/1", b"{}"), ("orders/2", b"{}")])
        print(session.receive(timeout=1.0))
    finally:
        node.stop()

:func:`start` is the same as a context manager. The facade has no ``async``
methods: each call crosses to the node's thread once (``publish_many`` and
``send_many`` once for a whole batch). ``on_message`` handlers run on the node's
thread, not the caller's. Remote sessions, on a node in another process, have the
same blocking API in :mod:`meshbus.transports.blocking`.
"""

from __future__ import annotations

import atexit
import functools
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from concurrent.futures import CancelledError, Future
from contextlib import AbstractContextManager, contextmanager, suppress
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, overload

import anyio
from anyio.from_thread import BlockingPortal

from ._messages import Message
from ._node import Node
from ._session import Session
from ._stats import NodeStatistics, QueueStatistics
from ._vpn import Vpn
from .abc import Flow, GuaranteedMessaging, SessionAPI
from .errors import StateError

__all__ = [
    "BlockingFlow",
    "BlockingGuaranteed",
    "BlockingNode",
    "BlockingSession",
    "EventLoopThread",
    "start",
    "start_node",
]

T = TypeVar("T")
Payload = bytes | bytearray | memoryview | str


class _CountingSession(SessionAPI, Protocol):
    """A session with counters: :class:`meshbus.Session` or a remote session."""

    def statistics(self) -> Any: ...


SessionT = TypeVar("SessionT", bound=_CountingSession)


# --- the background loop --------------------------------------------------------------


class EventLoopThread:
    """An anyio event loop in a daemon thread, behind a :class:`~anyio.from_thread.BlockingPortal`.

    The blocking node and the blocking remote session each run on one. Calls after
    :meth:`stop` raise :class:`~meshbus.errors.StateError` with
    :attr:`stopped_message`. One that is never stopped is stopped when the
    interpreter exits (an :mod:`atexit` hook), so what it runs still shuts down
    cleanly.

    :param backend: ``"asyncio"`` or ``"trio"``.
    :param name: the thread's name.
    """

    def __init__(self, backend: str = "asyncio", *, name: str = "meshbus-loop") -> None:
        if backend not in ("asyncio", "trio"):
            raise ValueError(f"backend must be 'asyncio' or 'trio', got {backend!r}")
        #: The message of the :class:`~meshbus.errors.StateError` raised after a stop.
        self.stopped_message = "the event loop has stopped"
        self._stopped = False
        self._lock = threading.Lock()
        self._entered: list[AbstractContextManager[Any]] = []
        ready: Future[BlockingPortal] = Future()

        async def serve() -> None:
            async with BlockingPortal() as portal:
                ready.set_result(portal)
                await portal.sleep_until_stopped()

        def run() -> None:
            try:
                anyio.run(serve, backend=backend)
            except BaseException as exc:  # handed to the thread that waits for the loop
                if not ready.done():
                    ready.set_exception(exc)

        # A daemon thread: the interpreter's exit does not wait for it, and the atexit
        # hook below stops it cleanly while it still runs.
        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()
        self._portal = ready.result()
        atexit.register(self._stop_at_exit)

    @property
    def portal(self) -> BlockingPortal:
        """The portal: ``portal.call(func, *args)`` runs ``func`` on the loop's thread."""
        return self._portal

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` has been called."""
        return self._stopped

    @property
    def thread(self) -> threading.Thread:
        """The thread the loop runs in."""
        return self._thread

    @overload
    def call(self, func: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    @overload
    def call(self, func: Callable[..., T], *args: Any) -> T: ...

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        """Run ``func(*args)`` (a coroutine function or a plain one) on the loop and
        return its result; its exceptions propagate unchanged.

        :raises StateError: the loop has stopped.
        """
        if self._stopped:
            raise StateError(self.stopped_message)
        try:
            return self._portal.call(func, *args)
        except (RuntimeError, CancelledError) as exc:
            # The portal refuses calls once it stops, and cancels those still running.
            if self._stopped:
                raise StateError(self.stopped_message) from exc
            raise

    def enter(self, manager: Any) -> Any:
        """Enter the async context manager ``manager`` on the loop, in a task of its own;
        :meth:`stop` exits it (the last entered first). Returns what it yields."""
        if self._stopped:
            raise StateError(self.stopped_message)
        wrapped = self._portal.wrap_async_context_manager(manager)
        entered = wrapped.__enter__()
        self._entered.append(wrapped)
        return entered

    def stop(self) -> None:
        """Exit what :meth:`enter` entered, cancel calls still running, end the loop
        and join its thread. Idempotent; an error of an exit is raised after all that.

        :raises StateError: called from the loop's own thread (an ``on_message``
            handler, say), where it would wait for itself.
        """
        if threading.current_thread() is self._thread:
            raise StateError("cannot stop an event loop from its own thread")
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            atexit.unregister(self._stop_at_exit)
            try:
                while self._entered:
                    self._entered.pop().__exit__(None, None, None)
            finally:
                with suppress(RuntimeError):  # the loop ended by itself
                    self._portal.call(self._portal.stop, True)
                self._thread.join()

    def _stop_at_exit(self) -> None:
        self.stop()


# --- the node -------------------------------------------------------------------------


def start_node(backend: str = "asyncio", **node_options: Any) -> BlockingNode:
    """Start a :class:`meshbus.Node` on an event loop in a background thread.

    Stop it with :meth:`BlockingNode.stop` (or use the node with ``with``). A node
    not stopped is stopped when the interpreter exits.

    :param backend: ``"asyncio"`` or ``"trio"``.
    :param node_options: passed to :class:`meshbus.Node` (``data_dir``, ``plugins``, ...).
    :raises ConfigurationError: the options are invalid; no thread was started.
    """
    node = Node(**node_options)  # invalid options fail here, before a thread starts
    loop = EventLoopThread(backend, name=f"meshbus-node-{node.name}")
    loop.stopped_message = f"node {node.name!r} has stopped"
    try:
        loop.enter(node)
    except BaseException:
        loop.stop()
        raise
    return BlockingNode(loop, node)


@contextmanager
def start(backend: str = "asyncio", **node_options: Any) -> Iterator[BlockingNode]:
    """Start a :class:`meshbus.Node` on a background event loop; stop it on exit.

    The same as :func:`start_node` with ``with``.

    :param backend: ``"asyncio"`` or ``"trio"``.
    :param node_options: passed to :class:`meshbus.Node`.
    """
    node = start_node(backend, **node_options)
    try:
        yield node
    finally:
        node.stop()


class BlockingNode:
    """Blocking view of a running :class:`meshbus.Node` (from :func:`start_node`)."""

    def __init__(self, loop: EventLoopThread, node: Node) -> None:
        #: The loop the node runs on.
        self.loop = loop
        #: The node; call its methods through :attr:`portal` so they run on its thread.
        self.node = node

    def __repr__(self) -> str:
        return f"<BlockingNode {self.node!r}>"

    @property
    def portal(self) -> BlockingPortal:
        """The portal to the node's thread: ``node.portal.call(func, *args)``."""
        return self.loop.portal

    @property
    def running(self) -> bool:
        """Whether the node runs (it has not been stopped)."""
        return not self.loop.stopped and self.node.running

    def stop(self) -> None:
        """Stop the node: close its sessions, let its plugins shut down (the guaranteed
        spool commits what is pending and closes), then end its thread. Idempotent.

        Calls on the node, its sessions and flows raise
        :class:`~meshbus.errors.StateError` afterwards.
        """
        self.loop.stop()

    def __enter__(self) -> BlockingNode:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def connect(self, vpn: str = "default", **options: Any) -> BlockingSession[Session]:
        """Log in and open a session; takes the options of :meth:`meshbus.Node.login`.

        It waits for the login as :meth:`meshbus.Node.login` does, so it also serves
        VPNs whose passwords are checked in a worker thread.
        """
        session = self.loop.call(functools.partial(self.node.login, vpn, **options))
        return BlockingSession(self.loop, session)

    def create_vpn(self, name: str, **options: Any) -> Vpn:
        """Create a VPN; takes the options of :meth:`meshbus.Node.create_vpn`."""
        return self.loop.call(functools.partial(self.node.create_vpn, name, **options))

    def statistics(self) -> NodeStatistics:
        """Totals over every VPN."""
        return self.loop.call(self.node.statistics)

    @property
    def guaranteed(self) -> BlockingGuaranteed:
        """Blocking view of :attr:`meshbus.Node.guaranteed`: queues and their statistics.

        :raises ConfigurationError: no plugin provides guaranteed messaging.
        """
        return BlockingGuaranteed(self.loop, self.node.guaranteed)


class BlockingGuaranteed:
    """Blocking view of a node's :class:`~meshbus.abc.GuaranteedMessaging`.

    The methods and arguments are those of the interface.
    """

    def __init__(self, loop: EventLoopThread, service: GuaranteedMessaging) -> None:
        #: The loop the node runs on.
        self.loop = loop
        #: The service; call what is not wrapped here through ``loop.call``.
        self.service = service

    def create_queue(self, name: str, *, vpn: str = "default", **settings: Any) -> Any:
        """Provision a queue in ``vpn`` (idempotent for identical settings); return it.

        ``settings`` are the plugin's (``subscriptions``, ``max_messages``, ...).
        """
        return self.loop.call(
            functools.partial(self.service.create_queue, name, vpn=vpn, **settings)
        )

    def add_subscription(self, name: str, subscription: str, *, vpn: str = "default") -> None:
        """Add a subscription to a queue while it runs."""
        self.loop.call(
            functools.partial(self.service.add_subscription, name, subscription, vpn=vpn)
        )

    def remove_subscription(self, name: str, subscription: str, *, vpn: str = "default") -> None:
        """Remove a subscription from a queue while it runs."""
        self.loop.call(
            functools.partial(self.service.remove_subscription, name, subscription, vpn=vpn)
        )

    def enable_queue(
        self,
        name: str,
        *,
        vpn: str = "default",
        ingress: bool | None = None,
        egress: bool | None = None,
    ) -> None:
        """Switch a queue's ingress or egress on or off (``None`` leaves it)."""
        self.loop.call(
            functools.partial(
                self.service.enable_queue, name, vpn=vpn, ingress=ingress, egress=egress
            )
        )

    def queue_statistics(self, vpn: str | None = None) -> list[QueueStatistics]:
        """The statistics of every queue and topic endpoint of ``vpn`` (all for ``None``)."""
        return self.loop.call(self.service.queue_statistics, vpn)

    def delete_queue(self, name: str, *, vpn: str = "default") -> None:
        """Unbind a queue's flows, delete its messages and forget it.

        :raises StateError: no such queue.
        """
        self.loop.call(functools.partial(self.service.delete_queue, name, vpn=vpn))

    def purge_queue(self, name: str, *, vpn: str = "default") -> int:
        """Delete every message a queue holds; return how many.

        :raises StateError: no such queue.
        """
        return self.loop.call(functools.partial(self.service.purge_queue, name, vpn=vpn))


# --- sessions and flows ---------------------------------------------------------------


class BlockingSession(Generic[SessionT]):
    """Blocking view of a session: a :class:`meshbus.Session` from
    :meth:`BlockingNode.connect`, or a remote one (see :mod:`meshbus.transports.blocking`).

    The methods and arguments are those of :class:`meshbus.abc.SessionAPI`;
    ``close`` is its ``aclose``. Iterating over it receives messages until it closes.
    """

    def __init__(self, loop: EventLoopThread, session: SessionT) -> None:
        #: The loop the session runs on (its node's, or its own for a remote session).
        self.loop = loop
        #: The session; call what is not wrapped here through ``loop.call``.
        self.session = session

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.session!r}>"

    @property
    def portal(self) -> BlockingPortal:
        """The portal to the session's event loop."""
        return self.loop.portal

    @property
    def client_name(self) -> str | None:
        """The session's client name."""
        return self.session.client_name

    @property
    def closed(self) -> bool:
        """Whether the session is closed (its node stopped, too)."""
        return self.loop.stopped or self.session.closed

    @property
    def subscriptions(self) -> tuple[str, ...]:
        """The subscriptions it holds, as given."""
        return self.loop.call(lambda: self.session.subscriptions)

    # --- direct messaging ---------------------------------------------------------

    def publish(
        self,
        topic: str,
        payload: Payload = b"",
        *,
        headers: Mapping[str, Any] | None = None,
        eliding_eligible: bool = False,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        retain: bool = False,
        ttl: float | None = None,
    ) -> None:
        """Publish a direct message (see :meth:`meshbus.Session.publish`)."""
        self.loop.call(
            functools.partial(
                self.session.publish,
                topic,
                payload,
                headers=headers,
                eliding_eligible=eliding_eligible,
                reply_to=reply_to,
                correlation_id=correlation_id,
                retain=retain,
                ttl=ttl,
            )
        )

    def publish_many(
        self,
        messages: Iterable[tuple[str, Payload]],
        *,
        headers: Mapping[str, Any] | None = None,
        eliding_eligible: bool = False,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        retain: bool = False,
    ) -> None:
        """Publish ``(topic, payload)`` pairs as direct messages, in order, crossing to
        the event loop once for the batch; the options apply to every message.

        An error of one message (:class:`~meshbus.errors.InvalidTopicError`,
        :class:`~meshbus.errors.AccessDeniedError`, ...) propagates unchanged: those
        before it were published, it and those after it were not.
        """
        batch = list(messages)  # iterated here, in the caller's thread
        options = {
            "headers": headers,
            "eliding_eligible": eliding_eligible,
            "reply_to": reply_to,
            "correlation_id": correlation_id,
            "retain": retain,
        }
        plain = headers is None and reply_to is None and correlation_id is None
        plain = plain and not eliding_eligible and not retain
        self.loop.call(self._publish_many, batch, None if plain else options)

    def _publish_many(
        self, batch: list[tuple[str, Payload]], options: dict[str, Any] | None
    ) -> None:
        publish = self.session.publish
        if options is None:
            for topic, payload in batch:
                publish(topic, payload)
        else:
            for topic, payload in batch:
                publish(topic, payload, **options)

    def subscribe(self, subscription: str) -> None:
        """Add a subscription (a no-op when it has it)."""
        self.loop.call(self.session.subscribe, subscription)

    def unsubscribe(self, subscription: str) -> None:
        """Remove a subscription (a no-op when it has none such)."""
        self.loop.call(self.session.unsubscribe, subscription)

    def subscribe_for(self, client_name: str, subscription: str) -> None:
        """As a subscription manager, add a subscription to another session of the VPN."""
        self.loop.call(self.session.subscribe_for, client_name, subscription)

    def unsubscribe_for(self, client_name: str, subscription: str) -> None:
        """As a subscription manager, remove a subscription from another session."""
        self.loop.call(self.session.unsubscribe_for, client_name, subscription)

    def confirm(self) -> None:
        """Return once every earlier call is applied; raise the first refusal since the
        last call (a remote session's subscribes and publishes are refused late)."""
        self.loop.call(self.session.confirm)

    def receive(self, timeout: float | None = None) -> Message:
        """Wait for the next direct message.

        :raises TimeoutError: none came within ``timeout`` seconds.
        :raises StateError: the session is closed or its node stopped.
        """
        return self.loop.call(self._receive, timeout)

    async def _receive(self, timeout: float | None) -> Message:
        with anyio.fail_after(timeout):
            return await self.session.receive()

    def receive_nowait(self) -> Message | None:
        """The next direct message waiting, or ``None``."""
        return self.loop.call(self.session.receive_nowait)

    def __iter__(self) -> Iterator[Message]:
        """Receive messages until the session closes (or its node stops)."""
        while True:
            try:
                yield self.loop.call(self._next)
            except StopAsyncIteration:
                return
            except StateError:
                if self.closed:
                    return
                raise

    async def _next(self) -> Message:
        return await self.session.__aiter__().__anext__()

    # --- guaranteed messaging -----------------------------------------------------

    def send(
        self,
        topic: str,
        payload: Payload = b"",
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
        eliding_eligible: bool = False,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        retain: bool = False,
    ) -> None:
        """Publish a guaranteed message to a topic; return once the node holds it
        (see :meth:`meshbus.Session.send`)."""
        self.loop.call(
            functools.partial(
                self.session.send,
                topic,
                payload,
                persistent=persistent,
                headers=headers,
                ttl=ttl,
                eliding_eligible=eliding_eligible,
                reply_to=reply_to,
                correlation_id=correlation_id,
                retain=retain,
            )
        )

    def send_many(
        self,
        messages: Iterable[tuple[str, Payload]],
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
    ) -> list[Exception | None]:
        """Publish many guaranteed messages in one call to the event loop (and one
        store commit); one result per message, in order: ``None`` once it is held,
        or the exception that rejected it (see :meth:`meshbus.Session.send_many`)."""
        batch = list(messages)
        return self.loop.call(
            functools.partial(
                self.session.send_many, batch, persistent=persistent, headers=headers, ttl=ttl
            )
        )

    def send_to_queue(
        self,
        queue: str,
        payload: Payload = b"",
        *,
        persistent: bool = True,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
        reply_to: str | None = None,
        correlation_id: str | None = None,
    ) -> None:
        """Publish a guaranteed message to one queue by name."""
        self.loop.call(
            functools.partial(
                self.session.send_to_queue,
                queue,
                payload,
                persistent=persistent,
                headers=headers,
                ttl=ttl,
                reply_to=reply_to,
                correlation_id=correlation_id,
            )
        )

    def bind(self, queue: str, *, window: int = 255) -> BlockingFlow:
        """Bind a consumer flow to a queue (see :meth:`meshbus.Session.bind`)."""
        flow = self.loop.call(functools.partial(self.session.bind, queue, window=window))
        return BlockingFlow(self.loop, flow)

    def bind_topic_endpoint(
        self, endpoint: str, subscription: str, *, window: int = 255
    ) -> BlockingFlow:
        """Bind a consumer flow to a topic endpoint, naming its subscription."""
        flow = self.loop.call(
            functools.partial(
                self.session.bind_topic_endpoint, endpoint, subscription, window=window
            )
        )
        return BlockingFlow(self.loop, flow)

    # --- lifecycle ----------------------------------------------------------------

    def statistics(self) -> Any:
        """A snapshot of the session's counters (:class:`meshbus.SessionStatistics` for
        an in-process session)."""
        return self.loop.call(self.session.statistics)

    def close(self) -> None:
        """Close the session. Idempotent; a no-op once its node has stopped."""
        if not self.loop.stopped:
            self.loop.call(self.session.aclose)

    def __enter__(self) -> BlockingSession[SessionT]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class BlockingFlow:
    """Blocking view of a consumer :class:`~meshbus.abc.Flow`, from
    :meth:`BlockingSession.bind`. Use it with ``with`` to unbind it at the end;
    iterating over it receives messages until it is unbound."""

    def __init__(self, loop: EventLoopThread, flow: Flow) -> None:
        #: The loop the flow's session runs on.
        self.loop = loop
        #: The flow.
        self.flow = flow

    def __repr__(self) -> str:
        return f"<BlockingFlow {self.flow!r}>"

    def receive(self, timeout: float | None = None) -> Message:
        """Wait for the next message (at most the flow's ``window`` unacknowledged).

        :raises TimeoutError: none came within ``timeout`` seconds.
        :raises StateError: the flow is unbound or its node stopped.
        """
        return self.loop.call(self._receive, timeout)

    async def _receive(self, timeout: float | None) -> Message:
        with anyio.fail_after(timeout):
            return await self.flow.receive()

    def receive_nowait(self) -> Message | None:
        """The next message the flow holds, or ``None`` at once (a flow holding none
        fetches more in the background; see :meth:`meshbus.abc.Flow.receive_nowait`)."""
        return self.loop.call(self.flow.receive_nowait)

    def ack(self, message: Message) -> None:
        """Acknowledge ``message``: the spool deletes it once every holder has acked."""
        self.loop.call(self.flow.ack, message)

    def unbind(self) -> None:
        """Stop receiving; unacknowledged messages are redelivered to other consumers.
        A no-op once the node (or remote session) has stopped."""
        if not self.loop.stopped:
            self.loop.call(self.flow.unbind)

    def __iter__(self) -> Iterator[Message]:
        """Receive messages until the flow is unbound (or its node stops)."""
        while True:
            try:
                yield self.loop.call(self.flow.__anext__)
            except StopAsyncIteration:
                return
            except StateError:
                if self.loop.stopped:
                    return
                raise

    def __enter__(self) -> BlockingFlow:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unbind()
