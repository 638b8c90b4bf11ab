"""The management API: views of a running node, and queue administration.

:class:`Management` reads a node in process; the same views are served to remote
sessions as the service :data:`MANAGEMENT_SERVICE` (see
:meth:`meshbus.Node.provide_service`), which :func:`start_server` registers with a
node's first listener, and which :class:`RemoteManagement` calls. Every answer is
plain JSON data, the same in process and over the wire.

Access (SPEC 6): only a session whose username has the management role may call the
service. A refusal raises :class:`~meshbus.errors.AccessDeniedError` and is counted:
in the calling session's ``denied`` (so in its VPN's and the node's ``denied``), and
in the node view's ``management.refused``. The views cover every VPN, as ``meshbus
stats`` does for the role; queue administration acts in the caller's own VPN only,
so each VPN's configuration decides who may change its queues.
"""

from __future__ import annotations

import enum
import os
import sys
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

import meshbus
from meshbus._stash import StashKey
from meshbus.errors import AccessDeniedError, ConfigurationError, StateError

from ._serving import SERVED

if TYPE_CHECKING:
    from meshbus._node import Node
    from meshbus._session import Session
    from meshbus._stats import NodeStatistics
    from meshbus._vpn import Vpn

__all__ = [
    "DEFAULT_LIMIT",
    "MANAGEMENT_SERVICE",
    "MAX_LIMIT",
    "Management",
    "provide_management",
]

MANAGEMENT_SERVICE = "management"
"""The name the management API is served under (:meth:`meshbus.Node.provide_service`)."""

DEFAULT_LIMIT = 1000
"""Rows of the subscriptions view when no ``limit`` is given."""

MAX_LIMIT = 100_000
"""The largest ``limit`` the subscriptions view takes."""

RATE_WINDOW = 10.0
"""Seconds over which the node view's rates are measured, at most (see :meth:`Management.node`)."""

_SAMPLE_EVERY = 1.0  # seconds between two samples kept for the rates


@attrs.define
class _State:
    """A node's management counters and the samples its rates are measured from."""

    calls: int = 0
    refused: int = 0
    samples: deque[tuple[float, int, int]] = attrs.field(factory=deque)

    def rates(self, now: float, started: float | None, stats: NodeStatistics) -> dict[str, Any]:
        """Messages per second since the oldest sample of the last ``RATE_WINDOW``
        seconds (else the latest older one, else the node's start); keeps this call's."""
        samples = self.samples
        horizon = now - RATE_WINDOW
        while len(samples) > 1 and samples[1][0] <= horizon:
            samples.popleft()  # at most one is kept from before the window
        earlier = [sample for sample in samples if sample[0] < now]
        inside = [sample for sample in earlier if sample[0] >= horizon]
        if inside or earlier:
            base = inside[0] if inside else earlier[-1]
        else:
            base = (started if started is not None else now, 0, 0)
        if not samples or now - samples[-1][0] >= _SAMPLE_EVERY:
            samples.append((now, stats.published, stats.delivered))
        span = now - base[0]
        if span <= 0:
            return {"window": 0.0, "published_per_second": None, "delivered_per_second": None}
        return {
            "window": span,
            # A removed VPN takes its counters along: never a negative rate.
            "published_per_second": max(0, stats.published - base[1]) / span,
            "delivered_per_second": max(0, stats.delivered - base[2]) / span,
        }


_STATE: StashKey[_State] = StashKey()


def _state(node: Node) -> _State:
    return node.stash.setdefault(_STATE, _State())


def provide_management(node: Node) -> None:
    """Serve the management API to ``node``'s remote sessions (done by :func:`start_server`;
    calling it again does nothing).

    :raises ConfigurationError: something else provides the service ``"management"``.
    """
    _state(node)
    node.provide_service(MANAGEMENT_SERVICE, _serve)


class Management:
    """The management views and queue administration of a node, in process::

        manage = Management(node)
        print(manage.node()["rates"])
        await manage.purge_queue("orders", vpn="shop")

    The views return what the ``management`` service answers a remote session (see
    :class:`RemoteManagement`): plain data that ``json`` or ``orjson`` can write.
    In process there is no access check: the application owns the node.
    """

    def __init__(self, node: Node) -> None:
        self._node = node
        self._state = _state(node)

    # --- views ------------------------------------------------------------------------

    def node(self) -> dict[str, Any]:
        """The node: ``name``, ``node_id``, ``cluster``, ``version``, ``uptime``
        (seconds), ``vpns``, ``memory`` (``rss_bytes`` now and ``peak_rss_bytes``,
        ``None`` where the platform does not tell), ``cpu`` (``user_seconds``,
        ``system_seconds`` of the process), ``rates`` (``published_per_second`` and
        ``delivered_per_second`` over ``window`` seconds: since the oldest of the
        earlier calls in the last 10 seconds, else since the latest
        earlier call, else since the node started), ``totals`` (its
        :class:`~meshbus.NodeStatistics`) and ``management`` (``calls`` served and
        ``refused``)."""
        node = self._node
        stats = node.statistics()
        now = node.clock.monotonic()
        return {
            "name": node.name,
            "node_id": node.node_id,
            "cluster": node.cluster,
            "version": meshbus.__version__,
            "uptime": now - node.started if node.started is not None else None,
            "vpns": sorted(node.vpns),
            "memory": _memory(),
            "cpu": _cpu(),
            "rates": self._state.rates(now, node.started, stats),
            "totals": _plain(stats),
            "management": {"calls": self._state.calls, "refused": self._state.refused},
        }

    def connections(self, vpn: str | None = None) -> dict[str, Any]:
        """``connections``: every open session of ``vpn`` (of every VPN for ``None``),
        by VPN and client name: ``vpn``, ``client_name``, ``username``, ``transport``
        (``"meshbus"`` for a client of a listener; ``None`` for a session opened in the
        node's process, by the application or a plugin such as MQTT's), ``address``
        (the client's ``host:port``), ``connected_since`` (wall-clock seconds),
        ``bytes_received`` and ``bytes_sent`` (these three ``None`` without a
        transport), ``subscriptions`` (how many), ``egress_messages`` and
        ``egress_bytes`` (waiting for it), ``discarded``, ``published``, ``delivered``."""
        rows = []
        for each in _vpns(self._node, vpn):
            for name in sorted(each.sessions):
                rows.append(_connection(each.sessions[name]))
        return {"connections": rows}

    def subscriptions(
        self,
        vpn: str | None = None,
        *,
        client: str | None = None,
        topic: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        """``subscriptions``: the first ``limit`` (1000 by default) subscriptions of
        sessions (``vpn``, ``client_name``, ``subscription``), by VPN and client name;
        only ``client``'s with a client name, only filters containing ``topic`` with one.
        ``total`` counts every one that matched, and ``truncated`` says whether some
        were left out.

        :raises ConfigurationError: ``limit`` is not from 1 to 100 000.
        """
        _check_limit(limit)
        rows: list[dict[str, Any]] = []
        total = 0
        for each in _vpns(self._node, vpn):
            for name in sorted(each.sessions):
                if client is not None and name != client:
                    continue
                for subscription in each.sessions[name].subscriptions:
                    if topic is not None and topic not in subscription:
                        continue
                    total += 1
                    if len(rows) < limit:
                        row = {"vpn": each.name, "client_name": name, "subscription": subscription}
                        rows.append(row)
        return {"subscriptions": rows, "total": total, "truncated": total > len(rows)}

    def queues(self, vpn: str | None = None) -> dict[str, Any]:
        """``queues``: the :class:`~meshbus.QueueStatistics` of every queue and topic
        endpoint of ``vpn`` (of every VPN for ``None``). Without the ``guaranteed``
        plugin, ``available`` is false, ``reason`` says so and the list is empty."""
        vpns = _vpns(self._node, vpn)  # an unknown VPN is refused, plugin or not
        try:
            service = self._node.guaranteed
        except ConfigurationError as exc:
            return {"available": False, "reason": str(exc), "queues": []}
        rows = []
        for each in vpns:
            rows += [_plain(stats) for stats in service.queue_statistics(each.name)]
        return {"available": True, "reason": None, "queues": rows}

    def links(self, vpn: str | None = None) -> dict[str, Any]:
        """``links``: each link of ``vpn`` (of every VPN) with its ``vpn`` and its
        :class:`~meshbus.LinkStatistics` (bridges, DMR links), and ``routing``: the
        ``dmr`` plugin's figures for each VPN it routes (node, cluster, neighbours)."""
        rows = []
        routing = {}
        for each in _vpns(self._node, vpn):
            for link in sorted(each.links, key=lambda link: link.name):
                rows.append({"vpn": each.name, **_plain(link.statistics())})
            figures = self._node.plugins.vpn_statistics(each).get("dmr")
            if figures:
                routing[each.name] = figures
        return {"links": rows, "routing": routing}

    def listeners(self) -> dict[str, Any]:
        """``listeners``: each listener's ``url`` and its
        :class:`~meshbus.transports.ServerStatistics`."""
        from ._server import servers_of  # which registers this API: imported when used

        rows = [{"url": s.url, **_plain(s.statistics())} for s in servers_of(self._node)]
        return {"listeners": rows}

    # --- queue administration ---------------------------------------------------------

    async def create_queue(
        self, name: str, *, vpn: str = "default", **settings: Any
    ) -> dict[str, Any]:
        """Provision a queue (idempotent for identical settings, as
        :meth:`~meshbus.abc.GuaranteedMessaging.create_queue`); its statistics.

        :raises ConfigurationError: no ``guaranteed`` plugin, or invalid settings.
        :raises StateError: a queue of that name exists with other settings.
        """
        self._node.guaranteed.create_queue(name, vpn=vpn, **settings)
        return self._queue(vpn, name)

    async def delete_queue(self, name: str, *, vpn: str = "default") -> dict[str, Any]:
        """Delete a queue, its messages and its flows; ``deleted``: its name.

        :raises StateError: no such queue.
        """
        await self._node.guaranteed.delete_queue(name, vpn=vpn)
        return {"deleted": name}

    async def purge_queue(self, name: str, *, vpn: str = "default") -> dict[str, Any]:
        """Delete every message of a queue (see
        :meth:`~meshbus.abc.GuaranteedMessaging.purge_queue`); ``purged``: how many.

        :raises StateError: no such queue.
        """
        return {"purged": await self._node.guaranteed.purge_queue(name, vpn=vpn)}

    async def enable_queue(
        self,
        name: str,
        *,
        vpn: str = "default",
        ingress: bool | None = None,
        egress: bool | None = None,
    ) -> dict[str, Any]:
        """Switch a queue's ingress and egress on or off (``None`` leaves one as it
        is); its statistics.

        :raises StateError: no such queue.
        """
        self._node.guaranteed.enable_queue(name, vpn=vpn, ingress=ingress, egress=egress)
        return self._queue(vpn, name)

    def _queue(self, vpn: str, name: str) -> dict[str, Any]:
        for stats in self._node.guaranteed.queue_statistics(vpn):
            if stats.name == name and stats.kind == "queue":
                return _plain(stats)
        raise StateError(f"no queue {name!r} in VPN {vpn!r}")  # deleted meanwhile


# --- the service ------------------------------------------------------------------------

_VIEWS = ("node", "connections", "subscriptions", "queues", "links", "listeners")
_ACTIONS = ("create_queue", "delete_queue", "purge_queue", "enable_queue")


async def _serve(
    session: Session, args: dict[str, Any], body: bytes
) -> tuple[dict[str, Any], bytes]:
    """The ``management`` service: ``args["op"]`` names a view or an action."""
    node = session.node
    state = _state(node)
    if not session.user.management:
        _refuse(session, state, "the management role is needed")
    op = args.get("op")
    manage = Management(node)
    if op in _VIEWS:
        result = _view(manage, op, args)
    elif op in _ACTIONS:
        vpn = args.get("vpn", session.vpn.name)
        if vpn != session.vpn.name:
            _refuse(session, state, f"queues of VPN {vpn!r} are managed from a session of it")
        result = await _act(manage, op, vpn, args)
    else:
        raise ConfigurationError(f"unknown management operation {op!r}; one of {_VIEWS + _ACTIONS}")
    state.calls += 1
    return {"result": result}, b""


def _refuse(session: Session, state: _State, why: str) -> None:
    state.refused += 1
    session.denied += 1
    raise AccessDeniedError(session.username, "manage", why=why)


def _view(manage: Management, op: str, args: dict[str, Any]) -> dict[str, Any]:
    vpn = _text(args, "vpn")
    if op == "node":
        return manage.node()
    if op == "connections":
        return manage.connections(vpn)
    if op == "subscriptions":
        limit = args.get("limit", DEFAULT_LIMIT)
        client, topic = _text(args, "client"), _text(args, "topic")
        return manage.subscriptions(vpn, client=client, topic=topic, limit=limit)
    if op == "queues":
        return manage.queues(vpn)
    if op == "links":
        return manage.links(vpn)
    return manage.listeners()


async def _act(manage: Management, op: str, vpn: str, args: dict[str, Any]) -> dict[str, Any]:
    name = _text(args, "name")
    if name is None:
        raise ConfigurationError(f"{op} needs the queue's 'name'")
    if op == "create_queue":
        settings = args.get("settings", {})
        if not isinstance(settings, dict):
            raise ConfigurationError("create_queue's 'settings' must be an object")
        return await manage.create_queue(name, vpn=vpn, **settings)
    if op == "delete_queue":
        return await manage.delete_queue(name, vpn=vpn)
    if op == "purge_queue":
        return await manage.purge_queue(name, vpn=vpn)
    ingress, egress = args.get("ingress"), args.get("egress")
    for flag, value in (("ingress", ingress), ("egress", egress)):
        if value is not None and not isinstance(value, bool):
            raise ConfigurationError(f"{flag} must be true, false or null, got {value!r}")
    return await manage.enable_queue(name, vpn=vpn, ingress=ingress, egress=egress)


def _text(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigurationError(f"management argument {key!r} must be a string, got {value!r}")
    return value


# --- helpers ------------------------------------------------------------------------------


def _vpns(node: Node, name: str | None) -> list[Vpn]:
    """The VPN called ``name`` (:class:`StateError` if none), or all of them, by name."""
    if name is None:
        return [node.vpns[each] for each in sorted(node.vpns)]
    return [node.vpn(name)]


def _check_limit(limit: object) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigurationError(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")


def _connection(session: Session) -> dict[str, Any]:
    served = session.stash.get(SERVED, None)
    stats = session.statistics()
    return {
        "vpn": session.vpn.name,
        "client_name": session.client_name,
        "username": session.username,
        "transport": "meshbus" if served is not None else None,
        "address": served.peer if served is not None else None,
        "connected_since": served.since if served is not None else None,
        "bytes_received": served.protocol.bytes_received if served is not None else None,
        "bytes_sent": served.protocol.bytes_sent if served is not None else None,
        "subscriptions": stats.subscriptions,
        "egress_messages": stats.egress_messages,
        "egress_bytes": stats.egress_bytes,
        "discarded": stats.discarded,
        "published": stats.published,
        "delivered": stats.delivered,
    }


def _plain(value: Any) -> dict[str, Any]:
    """An attrs statistics value as JSON data: enums as their values, mappings as dicts."""
    return attrs.asdict(value, value_serializer=_json_value)


def _json_value(instance: Any, field: Any, value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping) and not isinstance(value, dict):
        return dict(value)
    if isinstance(value, tuple):  # as JSON gives it back: the same in process and remote
        return list(value)
    return value


def _memory() -> dict[str, int | None]:
    """The process's resident memory now (Linux: ``/proc``) and at its peak."""
    rss = None
    try:
        with open("/proc/self/statm", "rb") as statm:
            rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    peak = None
    try:
        import resource
    except ImportError:  # Windows
        pass
    else:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes there, KiB here
        if rss is not None:
            peak = max(peak, rss)  # the two are read apart: never a peak below the present
    return {"rss_bytes": rss, "peak_rss_bytes": peak}


def _cpu() -> dict[str, float]:
    times = os.times()
    return {"user_seconds": times.user, "system_seconds": times.system}
