"""The node: one in-process broker hosting Message VPNs, composed from plugins."""

from __future__ import annotations

import itertools
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from types import MappingProxyType, TracebackType

import anyio
import orjson
from anyio.abc import TaskGroup

from ._clock import SystemClock
from ._files import write_json_atomically
from ._logins import LoginGuard
from ._plugins import PluginManager, compose
from ._profiles import check_identity
from ._session import MessageHandler, Session
from ._slow_consumers import SlowConsumerLog
from ._stash import Stash
from ._stats import NodeStatistics
from ._topics import TopicLimits
from ._vpn import Vpn
from .abc import Clock, GuaranteedMessaging, RetainedMessages, ServiceHandler
from .errors import AuthenticationError, ConfigurationError, StateError

__all__ = ["DEFAULT_PLUGINS", "Node"]

DEFAULT_PLUGINS: tuple[str, ...] = (
    "direct",
    "shared",
    "eliding",
    "guaranteed",
    "retained",
    "mqtt",
    "hopcount",
    "bridge",
    "dmr",
)
"""Entry-point names loaded when ``Node(plugins=None)``."""


class Node:
    """An in-process broker. Use it as an async context manager::

        async with Node() as node:
            async with node.connect() as session:
                session.subscribe("greetings/>")
                session.publish("greetings/world", b"hello")
                print(await session.receive())

    :param name: used in generated client names and logs.
    :param plugins: plugin objects and/or installed plugin names (entry points of
        the ``meshbus`` group). ``None`` means :data:`DEFAULT_PLUGINS`.
    :param autoload: also load every installed plugin not named in ``plugins``.
    :param block: plugin names never to load.
    :param clock: where time comes from (a :class:`meshbus.testing.ManualClock` in tests).
    :param seed: seeds :attr:`random`, which plugins use for random choices.
    :param topic_limits: default limits for the VPNs of this node.
    :param data_dir: a directory for durable state (the guaranteed-message spool);
        without one, guaranteed messages are kept in memory only.
    :param node_id: the node's identity among the nodes it links to (SPEC 7, 8). Without
        one, a node with a ``data_dir`` keeps the id it made the first time in that
        directory (file ``node-id``), and a node without one makes a new id each run.
    :param cluster: the cluster the node belongs to (SPEC 8), told to the nodes it
        links to; ``None`` when it belongs to none.
    """

    def __init__(
        self,
        *,
        name: str = "meshbus",
        plugins: Iterable[object] | None = None,
        autoload: bool = False,
        block: Iterable[str] = (),
        clock: Clock | None = None,
        seed: int | None = None,
        topic_limits: TopicLimits | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        node_id: str | None = None,
        cluster: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"node name must be a non-empty str, got {name!r}")
        if cluster is not None:
            check_identity("cluster name", cluster)
        self.name = name
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.random = random.Random(seed)
        self.topic_limits = topic_limits if topic_limits is not None else TopicLimits()
        self.stash = Stash()
        #: Where plugins keep durable state (the guaranteed spool); ``None`` keeps it in RAM.
        self.data_dir: Path | None = Path(data_dir) if data_dir is not None else None
        #: The node's identity among linked nodes (see the ``node_id`` parameter).
        self.node_id: str = _node_identity(node_id, self.data_dir)
        #: The cluster the node belongs to, or ``None``.
        self.cluster: str | None = cluster
        #: Numbers the messages this node sends into the mesh (their ``origin``). Counting
        #: from the wall clock in nanoseconds keeps a restarted node's numbers above the
        #: ones it used before, so neighbours never take a new message for an old one.
        self.next_origin_id: Callable[[], int] = itertools.count(time.time_ns()).__next__
        self._guaranteed: GuaranteedMessaging | None = None
        self._retained: RetainedMessages | None = None
        self._services: dict[str, ServiceHandler] = {}
        #: Checks passwords off the event loop and slows down repeated failed logins
        #: (SPEC 6); replace it to change its settings.
        self.logins = LoginGuard(self.clock)
        #: Logs, rate-limited, the sessions that start discarding (slow consumers);
        #: replace it to change its interval or burst.
        self.slow_consumers = SlowConsumerLog(self.clock)
        self.plugins = PluginManager()
        blocked = frozenset(block)
        compose(
            self.plugins,
            # Blocking a default plugin means "not this one", not "refuse to start".
            [p for p in DEFAULT_PLUGINS if p not in blocked] if plugins is None else plugins,
            autoload=autoload,
            blocked=blocked,
        )
        self._vpns: dict[str, Vpn] = {}
        self._task_group: TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._lifespans: AsyncExitStack | None = None
        self._used = False
        #: When the node started, on :attr:`clock`'s ``monotonic()`` scale (for its
        #: uptime); ``None`` before it starts.
        self.started: float | None = None
        self.plugins.configure(self)
        self.create_vpn("default")

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<Node {self.name!r} {state} vpns={list(self._vpns)}>"

    # --- VPNs ---------------------------------------------------------------------

    def create_vpn(
        self, name: str, *, authentication: str = "none", topic_limits: TopicLimits | None = None
    ) -> Vpn:
        """Create a Message VPN; raise :class:`StateError` if the name is taken."""
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigurationError(f"VPN name must be a non-empty str without '/', got {name!r}")
        if name in self._vpns:
            raise StateError(f"VPN {name!r} already exists")
        vpn = Vpn(self, name, authentication, topic_limits or self.topic_limits)
        self._vpns[name] = vpn
        return vpn

    def vpn(self, name: str = "default") -> Vpn:
        """The VPN called ``name``."""
        try:
            return self._vpns[name]
        except KeyError:
            raise StateError(f"no VPN named {name!r} on node {self.name!r}") from None

    def remove_vpn(self, name: str) -> None:
        """Close every session of the VPN and remove it."""
        vpn = self.vpn(name)
        vpn._close_all()
        vpn.links.vpn_removed()
        vpn.removed = True
        del self._vpns[name]
        self.plugins.vpn_removed(vpn)

    @property
    def vpns(self) -> Mapping[str, Vpn]:
        """VPNs by name (read-only view)."""
        return MappingProxyType(self._vpns)

    # --- services plugins provide ------------------------------------------------

    def provide_guaranteed(self, service: GuaranteedMessaging) -> None:
        """Register the guaranteed-messaging implementation (done by the plugin)."""
        if self._guaranteed is not None and self._guaranteed is not service:
            raise ConfigurationError("two plugins provide guaranteed messaging")
        self._guaranteed = service

    @property
    def guaranteed(self) -> GuaranteedMessaging:
        """The guaranteed-messaging service; :class:`ConfigurationError` without the plugin."""
        if self._guaranteed is None:
            raise ConfigurationError(
                "guaranteed messaging needs the 'guaranteed' plugin: "
                "Node(plugins=[..., 'guaranteed'])"
            )
        return self._guaranteed

    def provide_service(self, name: str, handler: ServiceHandler) -> None:
        """Let remote clients call ``handler`` by ``name`` (a plugin's request/answer API).

        A client calls it with :meth:`meshbus.transports.RemoteSession.call`; the
        handler gets the caller's :class:`Session` (its VPN, user and ACL), the call's
        ``args`` and body, and returns the answer's fields and body. Errors it raises
        reach the caller as the same meshbus error. See :class:`meshbus.abc.ServiceHandler`.

        :raises ConfigurationError: another handler already has ``name``.
        """
        known = self._services.get(name)
        if known is not None and known is not handler:
            raise ConfigurationError(f"two plugins provide the service {name!r}")
        self._services[name] = handler

    def withdraw_service(self, name: str) -> None:
        """Stop serving ``name`` (calls then fail with :class:`StateError`)."""
        self._services.pop(name, None)

    def find_service(self, name: str) -> ServiceHandler | None:
        """The handler registered for ``name``, if any."""
        return self._services.get(name)

    def provide_retained(self, service: RetainedMessages) -> None:
        """Register the retained-messages implementation (done by the plugin)."""
        if self._retained is not None and self._retained is not service:
            raise ConfigurationError("two plugins provide retained messages")
        self._retained = service

    @property
    def retained(self) -> RetainedMessages:
        """The retained-messages service; :class:`ConfigurationError` without the plugin."""
        if self._retained is None:
            raise ConfigurationError(
                "retained messages need the 'retained' plugin: Node(plugins=[..., 'retained'])"
            )
        return self._retained

    # --- sessions -----------------------------------------------------------------

    def connect(
        self,
        vpn: str = "default",
        *,
        username: str = "default",
        password: str | None = None,
        client_name: str | None = None,
        no_local: bool = False,
        on_message: MessageHandler | None = None,
        timestamps: bool = False,
    ) -> Session:
        """Log in to a VPN and open a session (also usable as ``async with``).

        This is immediate, so it serves every login that needs no password checked
        (authentication ``"none"``, or a plugin's :func:`~meshbus.hookspecs.meshbus_authenticate`).
        Checking a password takes a worker thread, never the event loop (SPEC 6):
        for a VPN with ``"basic"`` authentication use :meth:`login`.

        :param on_message: a function called with each message, inline with the
            publish, or an ``async`` function awaited by one task per session;
            ``None`` buffers messages for :meth:`Session.receive`.
        :param timestamps: stamp the direct messages this session publishes with the
            node clock's time (:attr:`Message.timestamp`); without it they carry
            ``None``. Guaranteed messages are always stamped.
        :raises AuthenticationError: the login was refused (also: no VPN of that name).
        :raises StateError: the node is not running, the client name is in use, or
            a password would have to be checked (use :meth:`login`).
        """
        target = self._vpns.get(vpn)
        if target is None:
            raise AuthenticationError(username, f"no Message VPN named {vpn!r}")
        return target.open_session(
            username=username,
            password=password,
            client_name=client_name,
            no_local=no_local,
            on_message=on_message,
            timestamps=timestamps,
        )

    async def login(
        self,
        vpn: str = "default",
        *,
        username: str = "default",
        password: str | None = None,
        client_name: str | None = None,
        no_local: bool = False,
        on_message: MessageHandler | None = None,
        timestamps: bool = False,
        certificate_name: str | None = None,
        address: str | None = None,
        replace: bool = False,
    ) -> Session:
        """Log in to a VPN and open a session, checking a password off the event loop.

        Takes what :meth:`connect` takes and works for every authentication scheme;
        listeners log their clients in this way. The login goes through
        :attr:`logins`: the password is checked in a worker thread, a refusal says
        ``login refused`` whatever the reason (the reason is logged), and repeated
        failures for the username, or from ``address``, make later attempts wait
        for their turn on the node's clock. ::

            async with await node.login("tenant", username="ops", password=secret) as s:
                ...

        :param certificate_name: the common name of a client certificate that a
            listener verified (for ``authentication="client-certificate"``).
        :param address: where the client connects from (listeners pass the peer's).
        :param replace: when a session of that client name is open, close it and open
            this one, once this login is accepted (MQTT's session takeover); without
            it the login is refused.
        :raises AuthenticationError: the login was refused (also: no VPN of that name).
        :raises AccessDeniedError: the ACL profile denies connecting.
        :raises StateError: the node is not running, or the client name is in use.
        """
        target = self._vpns.get(vpn)
        if target is None:
            raise await self.logins.unknown_vpn(vpn, username, address)
        return await target.login(
            username=username,
            password=password,
            client_name=client_name,
            no_local=no_local,
            on_message=on_message,
            timestamps=timestamps,
            certificate_name=certificate_name,
            address=address,
            replace=replace,
        )

    # --- lifecycle ----------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the node has started and not stopped."""
        return self._task_group is not None

    @property
    def task_group(self) -> TaskGroup:
        """The node's task group, for plugins' long-lived tasks (never one per message)."""
        if self._task_group is None:
            raise StateError("the node is not running")
        return self._task_group

    async def __aenter__(self) -> Node:
        if self._used:
            raise StateError("a Node can be started only once; create a new one")
        self._used = True
        self.started = self.clock.monotonic()
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            tg = await stack.enter_async_context(anyio.create_task_group())
            # Lifespans start their tasks with node.task_group: it must exist before them.
            self._task_group = tg
            lifespans = AsyncExitStack()
            await stack.enter_async_context(lifespans)
            for cm in self.plugins.lifespans(self):
                await lifespans.enter_async_context(cm)
        except BaseException:
            # Unwind without the error: the task group would wrap it in an ExceptionGroup.
            if self._task_group is not None:
                self._task_group.cancel_scope.cancel()
                self._task_group = None
            await stack.aclose()
            raise
        self._stack = stack
        self._lifespans = lifespans
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._stack is not None
        assert self._lifespans is not None
        try:
            # The links first: each writes what it had taken for its peer (the sessions'
            # last publishes too) while the node's sessions and tasks, which some links
            # feed on (a bridge's queue flow), still run.
            async with anyio.create_task_group() as tg:
                for vpn in self._vpns.values():
                    for link in list(vpn.links):
                        tg.start_soon(link.aclose, f"node {self.name!r} is stopping")
            for vpn in list(self._vpns.values()):
                vpn._close_all()
                vpn.links.vpn_removed()
                # As the hookspec promises: plugins drop per-VPN state when the node stops.
                self.plugins.vpn_removed(vpn)
            # Plugins clean up while their tasks still run, then the tasks are cancelled.
            await self._lifespans.aclose()
        finally:
            # Cancelled whatever failed above: a plugin's error must not leave the
            # node's tasks running, with this exit waiting for them for ever.
            if self._task_group is not None:
                self._task_group.cancel_scope.cancel()
            self._task_group = None
            try:
                # Not the body's exception: the task group would wrap it in an ExceptionGroup.
                # It propagates as is; a failed plugin task still raises from here.
                await self._stack.aclose()
            finally:
                self.plugins.unconfigure(self)
        return None

    # --- statistics ---------------------------------------------------------------

    def statistics(self) -> NodeStatistics:
        """Totals over every VPN."""
        per_vpn = [vpn.statistics() for vpn in self._vpns.values()]
        return NodeStatistics(
            node_id=self.node_id,
            cluster=self.cluster,
            vpns=len(per_vpn),
            sessions=sum(s.sessions for s in per_vpn),
            published=sum(s.published for s in per_vpn),
            delivered=sum(s.delivered for s in per_vpn),
            discarded=sum(s.discarded for s in per_vpn),
            denied=sum(s.denied for s in per_vpn),
            unmatched=sum(s.unmatched for s in per_vpn),
            login_failures=sum(s.login_failures for s in per_vpn),
        )


NODE_ID_FILE = "node-id"
"""The file in a node's data directory that keeps its identity."""


def _node_identity(given: str | None, data_dir: Path | None) -> str:
    """The node id: as given, else kept in (or first written to) ``data_dir``, else new."""
    if given is not None:
        return check_identity("node id", given)
    if data_dir is None:
        return uuid.uuid4().hex
    path = data_dir / NODE_ID_FILE
    try:
        kept = path.read_bytes()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigurationError(f"cannot read the node id from {path}: {exc}") from exc
    else:
        try:
            return check_identity("node id", orjson.loads(kept))
        except (orjson.JSONDecodeError, ConfigurationError):
            raise ConfigurationError(f"{path} does not hold a node id") from None
    made = uuid.uuid4().hex
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomically(path, made)
    except OSError as exc:
        raise ConfigurationError(f"cannot keep the node id in {path}: {exc}") from exc
    return made
