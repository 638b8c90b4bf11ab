"""A node's Prometheus/OpenMetrics endpoint, with liveness and readiness probes.

:func:`serve_metrics` serves three paths over HTTP (see :mod:`._http`) in the node's
task group:

* ``/metrics``: the node's figures, read from its statistics at scrape time by a
  :class:`NodeCollector` and written by ``prometheus_client`` in the Prometheus text
  format, or in OpenMetrics when the scraper's ``Accept`` header asks for it;
* ``/healthz``: ``200`` while the node runs (the answer comes from the node's own
  event loop, so a stuck loop answers nothing);
* ``/readyz``: ``200`` when the node is ready for clients (see :func:`readiness`),
  else ``503`` with one line per reason.

Labels are bounded by configuration: per VPN, listener, queue and link, never per
client or session, so the number of series does not grow with connections.

``prometheus_client`` is the optional ``metrics`` extra; it is imported when an
endpoint starts, and its absence is a :class:`~meshbus.errors.ConfigurationError`
naming the extra.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import attrs

from meshbus._links import LinkState
from meshbus._stats import LatencyHistogram
from meshbus.errors import ConfigurationError, StateError

from ._http import HttpRequest, HttpResponse, HttpServer
from ._server import servers_of
from ._settings import _at_least, _positive_number
from ._streams import map_exceptions

if TYPE_CHECKING:
    from meshbus._node import Node

__all__ = [
    "DEFAULT_METRICS_PORT",
    "MetricsEndpoint",
    "MetricsSettings",
    "NodeCollector",
    "readiness",
    "serve_metrics",
]

log = logging.getLogger("meshbus.transports.metrics")

DEFAULT_METRICS_PORT = 9464
"""The port of a metrics endpoint when none is given (the customary one of exporters)."""

EXTRA_HINT = "pip install 'meshbus[metrics]'"
_IN_SYNC = (LinkState.IN_SYNC, LinkState.REUSING)


def split_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:PORT"`` for IPv6) as ``(host, port)``.

    :raises ValueError: it is not of that form, or the port is not 0 to 65535.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected HOST:PORT as a string, got {text!r}")
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT with a port from 0 to 65535, got {text!r}")
    return host, int(port)


def _listen(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    try:
        split_address(value)
    except ValueError:
        raise ConfigurationError(
            f"{type(instance).__name__}.{attribute.name} must be HOST:PORT with a port "
            f"from 0 to 65535, got {value!r}"
        ) from None


@attrs.frozen
class MetricsSettings:
    """Where a metrics endpoint listens, and its bounds on what clients send."""

    listen: str = attrs.field(default=f"127.0.0.1:{DEFAULT_METRICS_PORT}", validator=_listen)
    """``HOST:PORT`` to listen on (``[::1]:PORT`` for IPv6; port 0 picks a free one)."""
    request_timeout: float = attrs.field(default=5.0, validator=_positive_number)
    """Seconds a client has to send its request and read the answer."""
    max_connections: int = attrs.field(default=16, validator=_at_least(1))
    """Connections served at once; more are closed as soon as they connect."""
    max_request_size: int = attrs.field(default=8192, validator=_at_least(256))
    """Largest request head (request line and headers) read, in bytes."""

    @property
    def host(self) -> str:
        """The host part of :attr:`listen`."""
        return split_address(self.listen)[0]

    @property
    def port(self) -> int:
        """The port part of :attr:`listen`."""
        return split_address(self.listen)[1]


def prometheus_missing() -> str | None:
    """Why the metrics endpoint cannot run here (``prometheus_client`` is not
    installed), or ``None`` when it can."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return f"the metrics endpoint needs prometheus_client: {EXTRA_HINT}"
    return None


def readiness(node: Node, listeners: int = 0) -> list[str]:
    """Why ``node`` is not ready for clients: empty when it is.

    Ready means: the node runs; at least ``listeners`` of its listeners are up; its
    guaranteed-message spool is open (when the ``guaranteed`` plugin is loaded); and
    every link of every VPN is in sync (:attr:`~meshbus.LinkState.IN_SYNC`, or
    :attr:`~meshbus.LinkState.REUSING` another link's connection).
    """
    if not node.running:
        return ["the node is not running"]
    reasons = []
    up = len(servers_of(node))
    if up < listeners:
        reasons.append(f"{up} of {listeners} listeners are up")
    if not _spool_open(node):
        reasons.append("the guaranteed-message spool is not open")
    for vpn in node.vpns.values():
        for link in vpn.links:
            if link.state not in _IN_SYNC:
                reasons.append(
                    f"link {link.name!r} of VPN {vpn.name!r} is {link.state.value}"
                    + (f" ({link.reason})" if link.reason else "")
                )
    return reasons


def _spool_open(node: Node) -> bool:
    try:
        guaranteed = node.guaranteed
    except ConfigurationError:
        return True  # no guaranteed plugin: no spool to wait for
    try:
        # The guaranteed plugin's service raises StateError from ``store`` while its
        # spool is closed; another implementation without it counts as open.
        getattr(guaranteed, "store", None)
    except StateError:
        return False
    return True


class NodeCollector:
    """A ``prometheus_client`` collector reading a node's statistics at each scrape.

    Register it in a ``prometheus_client.CollectorRegistry`` of your own to export a
    node's figures another way (a push gateway, an application's own endpoint).

    :param ready: what ``meshbus_ready`` reports (default: :func:`readiness` with no
        listeners required).
    """

    def __init__(self, node: Node, ready: Callable[[], list[str]] | None = None) -> None:
        self.node = node
        self._ready = ready if ready is not None else lambda: readiness(node)

    def collect(self) -> Iterator[Any]:
        """The metric families of the node now (called by the registry at each scrape)."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        node = self.node
        families: list[Any] = []

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            families.append(GaugeMetricFamily(name, doc, labels=labels))
            return families[-1]

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            families.append(CounterMetricFamily(name, doc, labels=labels))
            return families[-1]

        stats = node.statistics()
        info = gauge("meshbus_node_info", "The node: name, id and cluster", NODE_LABELS)
        info.add_metric([node.name, stats.node_id, stats.cluster or ""], 1)
        gauge("meshbus_ready", "1 when the node is ready for clients (see /readyz)").add_metric(
            [], 0 if self._ready() else 1
        )
        gauge("meshbus_node_vpns", "VPNs on the node").add_metric([], stats.vpns)
        for field, kind, doc in NODE_FIGURES:
            family = (gauge if kind == "gauge" else counter)(f"meshbus_node_{field}", doc)
            family.add_metric([], getattr(stats, field))

        vpn_families = [
            ((gauge if kind == "gauge" else counter)(f"meshbus_vpn_{field}", doc, ("vpn",)), field)
            for field, kind, doc in VPN_FIGURES
        ]
        for name, vpn in node.vpns.items():
            vpn_stats = vpn.statistics()
            for family, field in vpn_families:
                family.add_metric([name], getattr(vpn_stats, field))

        listener_families = [
            (
                (gauge if kind == "gauge" else counter)(
                    f"meshbus_listener_{metric}", doc, ("listener",)
                ),
                field,
            )
            for field, metric, kind, doc in LISTENER_FIGURES
        ]
        for server in servers_of(node):
            server_stats = server.statistics()
            for family, field in listener_families:
                family.add_metric([server.url], getattr(server_stats, field))

        try:
            queues = node.guaranteed.queue_statistics()
        except ConfigurationError:
            queues = []  # no guaranteed plugin: no queues
        queue_families = [
            (
                (gauge if kind == "gauge" else counter)(
                    f"meshbus_queue_{metric}", doc, QUEUE_LABELS
                ),
                field,
            )
            for field, metric, kind, doc in QUEUE_FIGURES
        ]
        for queue in queues:
            labels = [queue.vpn, queue.name, queue.kind]
            for family, field in queue_families:
                value = getattr(queue, field)
                if value is not None:  # no quota: no series
                    family.add_metric(labels, float(value))

        link_families = [
            (counter(f"meshbus_link_{field}", doc, LINK_LABELS), field)
            for field, doc in LINK_COUNTERS
        ]
        state = gauge(
            "meshbus_link_state", "1 for the state the link is in, 0 for the others",
            (*LINK_LABELS, "state"),
        )  # fmt: skip
        interest = gauge("meshbus_link_interest", "Filters the peer wants", LINK_LABELS)
        dropped = counter(
            "meshbus_link_dropped", "Messages dropped, by reason", (*LINK_LABELS, "reason")
        )
        latency = HistogramMetricFamily(
            "meshbus_link_forward_latency_seconds",
            "How long forwarded messages waited in the link before they were written",
            labels=LINK_LABELS,
        )
        families.append(latency)
        for vpn in node.vpns.values():
            for link in vpn.links:
                link_stats = link.statistics()
                labels = [vpn.name, link_stats.name, link_stats.kind]
                for family, field in link_families:
                    family.add_metric(labels, getattr(link_stats, field))
                for each in LinkState:
                    state.add_metric([*labels, each.value], 1 if each is link_stats.state else 0)
                interest.add_metric(labels, link_stats.interest)
                for reason, count in sorted(link_stats.dropped.items()):
                    dropped.add_metric([*labels, reason], count)
                if link_stats.forward_latency:
                    latency.add_metric(labels, _buckets(link_stats.forward_latency), None)
        # A family without samples (no queues, no links) is left out rather than
        # announced empty.
        return iter([family for family in families if family.samples])


def _buckets(snapshot: Any) -> list[tuple[str, float]]:
    """A :class:`~meshbus.LatencyHistogram` snapshot (counts per bucket) as Prometheus
    buckets (cumulative counts, ``le`` labels)."""
    from prometheus_client.utils import floatToGoString

    total = 0
    buckets = []
    for label, bound in zip(LatencyHistogram.LABELS, (*LatencyHistogram.BOUNDS, None), strict=True):
        total += snapshot.get(label, 0)
        # Bounds written as the library writes its own histograms' (``1.0``, ``+Inf``).
        le = label if bound is None else floatToGoString(bound)  # type: ignore[no-untyped-call]
        buckets.append((le, float(total)))
    return buckets


NODE_LABELS = ("node", "node_id", "cluster")
QUEUE_LABELS = ("vpn", "queue", "kind")
LINK_LABELS = ("vpn", "link", "kind")

NODE_FIGURES = (
    ("sessions", "gauge", "Sessions open now, in all VPNs"),
    ("published", "counter", "Messages published, in all VPNs"),
    ("delivered", "counter", "Deliveries to sessions, in all VPNs"),
    ("discarded", "counter", "Messages dropped from slow consumers' egress buffers"),
    ("denied", "counter", "Operations refused by ACL profiles"),
    ("unmatched", "counter", "Published messages that matched no subscription"),
    ("login_failures", "counter", "Logins refused"),
)
VPN_FIGURES = (
    ("sessions", "gauge", "Sessions open now"),
    ("published", "counter", "Messages published in the VPN"),
    ("delivered", "counter", "Deliveries to sessions"),
    ("discarded", "counter", "Messages dropped from slow consumers' egress buffers"),
    ("denied", "counter", "Operations refused by ACL profiles"),
    ("unmatched", "counter", "Published messages that matched no subscription"),
    ("login_failures", "counter", "Logins refused (authentication or connect ACL)"),
)
LISTENER_FIGURES = (
    ("open", "connections", "gauge", "Connections open now"),
    ("accepted", "accepted", "counter", "Connections accepted"),
    ("logins", "logins", "counter", "Logins accepted"),
    ("refused", "refused", "counter", "Logins refused"),
    ("failed", "failed", "counter", "Connections closed for a protocol, TLS or keepalive failure"),
    ("turned_away", "turned_away", "counter", "Connections closed at once: too many logging in"),
    ("bytes_received", "received_bytes", "counter", "Bytes read from its connections"),
    ("bytes_sent", "sent_bytes", "counter", "Bytes written to its connections"),
)
QUEUE_FIGURES = (
    ("messages", "messages", "gauge", "Messages held now"),
    ("bytes", "bytes", "gauge", "Payload bytes held now"),
    ("max_messages", "max_messages", "gauge", "Quota in messages (absent without one)"),
    ("max_bytes", "max_bytes", "gauge", "Quota in payload bytes (absent without one)"),
    ("flows", "flows", "gauge", "Consumer flows bound now"),
    ("in_flight", "in_flight", "gauge", "Messages handed to flows, not yet acknowledged"),
    ("ingress_enabled", "ingress_enabled", "gauge", "1 when it accepts messages"),
    ("egress_enabled", "egress_enabled", "gauge", "1 when flows may bind and receive"),
    ("spooled", "spooled", "counter", "Messages spooled to it"),
    ("delivered", "delivered", "counter", "Deliveries to flows (redeliveries included)"),
    ("acked", "acked", "counter", "Messages acknowledged by consumers"),
    ("redelivered", "redelivered", "counter", "Deliveries flagged as redelivered"),
    ("expired", "expired", "counter", "Messages past their TTL"),
    ("dead_lettered", "dead_lettered", "counter", "Messages moved to its dead message queue"),
    ("discarded", "discarded", "counter", "Messages dropped past their limits"),
)
LINK_COUNTERS = (
    ("connects", "Times its connection came up"),
    ("connect_failures", "Attempts to connect that failed"),
    ("disconnects", "Times its connection went down"),
    ("forwarded", "Messages sent over it"),
    ("forward_failures", "Messages that should have gone over it and could not"),
    ("received", "Messages that came in over it and were taken"),
    ("receive_failures", "Messages that came in over it and were refused"),
)


class MetricsEndpoint:
    """A running metrics endpoint, made by :func:`serve_metrics`; closes with the node.

    Use it as an async context manager to close it earlier, or call :meth:`aclose`.
    """

    def __init__(self, node: Node, settings: MetricsSettings, listeners: int) -> None:
        self.node = node
        self.settings = settings
        #: How many listeners of the node must be up for ``/readyz`` to answer ``200``.
        self.listeners = listeners
        #: The host it listens on, and its port (the one bound, for port 0).
        self.host, self.port = split_address(settings.listen)
        #: The in-memory name it listens on, for a listener of a memory network.
        self.memory_name: str | None = None
        self._scope: anyio.CancelScope | None = None
        self._stopped = anyio.Event()
        self._registry, self._choose_encoder = _registry(self)
        self.http = HttpServer(
            {"/metrics": self._metrics, "/healthz": self._healthz, "/readyz": self._readyz},
            node.clock,
            request_timeout=settings.request_timeout,
            max_request_size=settings.max_request_size,
            max_connections=settings.max_connections,
        )

    def __repr__(self) -> str:
        return f"<MetricsEndpoint {self.url}>"

    @property
    def url(self) -> str:
        """Where it answers: ``http://host:port`` (``memory://name`` on a memory network)."""
        if self.memory_name is not None:
            return f"memory://{self.memory_name}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def readiness(self) -> list[str]:
        """Why the node is not ready (see :func:`readiness`); empty when it is."""
        return readiness(self.node, self.listeners)

    async def aclose(self) -> None:
        """Stop listening and close its connections."""
        if self._scope is not None:
            self._scope.cancel()
        await self._stopped.wait()

    async def __aenter__(self) -> MetricsEndpoint:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _run(
        self,
        listener: anyio.abc.Listener[anyio.abc.ByteStream] | None,
        *,
        task_status: anyio.abc.TaskStatus[None],
    ) -> None:
        try:
            if listener is None:
                with map_exceptions(f"metrics endpoint on {self.settings.listen}"):
                    listener = await anyio.create_tcp_listener(
                        local_host=self.host, local_port=self.port
                    )
                self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            else:
                self.memory_name = getattr(listener, "name", None)
            async with listener, anyio.create_task_group() as tg:
                self._scope = tg.cancel_scope
                task_status.started()
                log.info("metrics endpoint on %s", self.url)
                await listener.serve(self.http.serve, task_group=tg)
        finally:
            self._stopped.set()

    # --- the routes ------------------------------------------------------------------

    def _metrics(self, request: HttpRequest) -> HttpResponse:
        encode, content_type = self._choose_encoder(request.headers.get("accept", ""))
        return HttpResponse(200, encode(self._registry), content_type)

    def _healthz(self, request: HttpRequest) -> HttpResponse:
        if self.node.running:
            return HttpResponse(200, b"ok\n")
        return HttpResponse(503, b"the node is not running\n")

    def _readyz(self, request: HttpRequest) -> HttpResponse:
        reasons = self.readiness()
        if not reasons:
            return HttpResponse(200, b"ready\n")
        return HttpResponse(503, "".join(f"not ready: {r}\n" for r in reasons).encode())


def _registry(endpoint: MetricsEndpoint) -> tuple[Any, Any]:
    """A registry holding the endpoint's collector, and the encoder chooser."""
    why = prometheus_missing()
    if why is not None:
        raise ConfigurationError(why)
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.registry import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(endpoint.node, endpoint.readiness))
    return registry, choose_encoder


async def serve_metrics(
    node: Node,
    settings: MetricsSettings | str | None = None,
    *,
    listeners: int = 0,
    listener: anyio.abc.Listener[anyio.abc.ByteStream] | None = None,
) -> MetricsEndpoint:
    """Serve ``node``'s metrics, liveness and readiness over HTTP (``node`` must be running).

    It runs in the node's task group and stops with the node, or earlier with
    :meth:`MetricsEndpoint.aclose`. ::

        endpoint = await serve_metrics(node, "127.0.0.1:0")
        print(endpoint.url + "/metrics")

    :param settings: where to listen and the bounds on requests; a ``"HOST:PORT"``
        string for the other defaults (default: 127.0.0.1:9464).
    :param listeners: how many listeners must be up before ``/readyz`` answers ``200``
        (``meshbus run`` starts the endpoint before its listeners).
    :param listener: accept connections from this listener (a
        :class:`MemoryNetwork`'s, say) instead of binding the settings' address.
    :raises ConfigurationError: ``prometheus_client`` is not installed (the ``metrics``
        extra), or the address is malformed.
    :raises TransportError: the address cannot be bound.
    :raises StateError: the node is not running.
    """
    if isinstance(settings, str):
        settings = MetricsSettings(listen=settings)
    elif settings is None:
        settings = MetricsSettings()
    elif not isinstance(settings, MetricsSettings):
        raise ConfigurationError(f"expected MetricsSettings or 'HOST:PORT', got {settings!r}")
    if isinstance(listeners, bool) or not isinstance(listeners, int) or listeners < 0:
        raise ConfigurationError(f"listeners must be an integer of at least 0, got {listeners!r}")
    endpoint = MetricsEndpoint(node, settings, listeners)
    await node.task_group.start(endpoint._run, listener)
    return endpoint
