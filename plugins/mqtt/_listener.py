"""An MQTT listener: accepts TCP (or TLS) connections, upgraded to WebSocket ones on a
WebSocket listener, and serves each as a client."""

from __future__ import annotations

import logging
import ssl

import anyio
import anyio.abc
import attrs

from meshbus import Node, StashKey, TransportError
from meshbus.transports import (
    RenewableCertificates,
    accept_stream,
    peer_address,
    peer_name,
)

from ._connection import MqttConnection
from ._sessions import SessionRegistry
from ._settings import MqttListenerSettings, url_of
from ._websocket import accept_websocket

__all__ = [
    "MqttListener",
    "MqttListenerStatistics",
    "close_mqtt_listener",
    "start_mqtt_listener",
]

log = logging.getLogger("meshbus.mqtt")


@attrs.frozen
class MqttListenerStatistics:
    """What an MQTT listener has done."""

    accepted: int
    """TCP connections accepted."""
    connected: int
    """Clients connected now."""
    logins: int
    """CONNECTs accepted."""
    refused: int
    """CONNECTs refused (credentials, ACL, protocol version, client id)."""
    turned_away: int
    """Connections closed at once: ``max_unauthenticated`` were logging in already."""
    malformed: int
    """Connections closed for a packet that broke the protocol (on a WebSocket
    listener, also those whose upgrade request was refused)."""
    received: int
    """PUBLISH packets taken from clients."""
    sent: int
    """PUBLISH packets sent to clients."""
    written_through: int
    """Of those, the ones written from the publisher's own call (the client's
    connection was idle), without waking its delivery task."""
    refused_publishes: int
    """Publishes the node refused (ACL, limits)."""
    too_large: int
    """Messages not sent: over the client's maximum packet size."""
    expired: int
    """QoS 0 messages not sent: their expiry interval ran out while they waited for
    the client's connection (QoS 1 ones are counted by the client's queue)."""
    wills: int
    """Will messages published as their connection ended, or was taken over (one that
    waited for its delay counts in the VPN's ``mqtt.delayed_wills``)."""


class MqttListener(RenewableCertificates):
    """One MQTT listener of a node; made by :func:`start_mqtt_listener`, closes with it."""

    def __init__(
        self, node: Node, settings: MqttListenerSettings, registry: SessionRegistry
    ) -> None:
        self.node = node
        self.settings = settings
        self.registry = registry
        self.host = settings.host
        #: The port it listens on (the one the system picked when ``settings.port`` is 0).
        self.port = settings.port
        self._context: ssl.SSLContext | None = (
            settings.tls.server_context() if settings.tls is not None else None
        )
        self._scope: anyio.CancelScope | None = None
        self._stopped = anyio.Event()
        self.connections: set[MqttConnection] = set()
        self.accepted = self.logins = self.refused = self.turned_away = self.malformed = 0
        self.received = self.sent = self.refused_publishes = self.too_large = self.wills = 0
        self.expired = 0
        self.written_through = 0
        self.logging_in = 0

    def __repr__(self) -> str:
        return f"<MqttListener {self.url}>"

    @property
    def url(self) -> str:
        """``mqtt://host:port`` (``mqtts://`` with TLS), or ``ws://host:port/path``
        (``wss://``) for MQTT over WebSocket."""
        settings = self.settings
        tls = self._context is not None
        return url_of(self.host, self.port, tls, settings.websocket, settings.websocket_path)

    def statistics(self) -> MqttListenerStatistics:
        """Counts, now."""
        return MqttListenerStatistics(
            self.accepted,
            sum(1 for c in self.connections if c.session is not None),
            self.logins,
            self.refused,
            self.turned_away,
            self.malformed,
            self.received,
            self.sent,
            self.written_through,
            self.refused_publishes,
            self.too_large,
            self.expired,
            self.wills,
        )

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            try:
                listener = await anyio.create_tcp_listener(
                    local_host=self.host, local_port=self.settings.port
                )
            except OSError as exc:
                raise TransportError(
                    f"cannot listen for MQTT on {self.host}:{self.settings.port}: {exc}"
                ) from exc
            async with listener, anyio.create_task_group() as tg:
                self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
                self._scope = tg.cancel_scope
                task_status.started()
                log.info("listening for MQTT on %s", self.url)
                await listener.serve(self._accepted, task_group=tg)
        finally:
            self._stopped.set()

    async def aclose(self) -> None:
        """Stop accepting and close every connection, after telling each MQTT 5
        client why (a DISCONNECT, "server shutting down"; a second at most)."""
        if self._scope is not None and not self._scope.cancel_called:
            async with anyio.create_task_group() as tg:
                for connection in list(self.connections):
                    tg.start_soon(connection.goodbye, "the node closes this listener")
        if self._scope is not None:
            self._scope.cancel()
        await self._stopped.wait()

    async def _accepted(self, stream: anyio.abc.ByteStream) -> None:
        self.accepted += 1
        peer, address = peer_name(stream), peer_address(stream)
        if self.logging_in >= self.settings.max_unauthenticated:
            self.turned_away += 1
            await anyio.aclose_forcefully(stream)
            return
        self.logging_in += 1
        logged_in = anyio.Event()
        counted = True
        try:
            accepted = await accept_stream(
                stream, self._context, self.node.clock, self.settings.connect_timeout, peer
            )
            if accepted is None:
                return
            stream, certificate_name = accepted
            if self.settings.websocket:
                upgraded = await accept_websocket(
                    stream,
                    self.settings.websocket_path,
                    self.node.clock,
                    self.settings.connect_timeout,
                    peer,
                )
                if upgraded is None:
                    self.malformed += 1
                    return
                stream = upgraded
            connection = MqttConnection(self, stream, peer, address, certificate_name)
            self.connections.add(connection)
            try:
                async with anyio.create_task_group() as tg:

                    async def release() -> None:
                        nonlocal counted
                        await logged_in.wait()
                        if counted:
                            counted = False
                            self.logging_in -= 1

                    tg.start_soon(release)
                    await connection.serve(logged_in)
            except Exception:  # a bug costs one connection, never the listener
                log.exception("closing MQTT connection from %s: internal error", peer)
            finally:
                self.connections.discard(connection)
        finally:
            if counted:
                counted = False
                self.logging_in -= 1


LISTENERS: StashKey[list[MqttListener]] = StashKey()
"""The node's MQTT listeners (``node.stash``)."""
REGISTRY: StashKey[SessionRegistry] = StashKey()
"""The node's MQTT sessions (``node.stash``)."""


async def start_mqtt_listener(
    node: Node, settings: MqttListenerSettings | None = None
) -> MqttListener:
    """Start an MQTT listener in ``node`` (which must be running); it closes with the node.

    :raises ConfigurationError: the TLS settings are not usable.
    :raises TransportError: the address cannot be bound.
    """
    registry = node.stash.get(REGISTRY, None)
    if registry is None:
        registry = node.stash[REGISTRY] = SessionRegistry(node)
    listener = MqttListener(node, settings or MqttListenerSettings(), registry)
    node.vpn(listener.settings.vpn)  # refuses an unknown VPN now, not at each login
    await node.task_group.start(
        listener.run, name=f"meshbus mqtt listener {listener.settings.label}"
    )
    node.stash.setdefault(LISTENERS, []).append(listener)
    registry.release_wills()
    return listener


async def close_mqtt_listener(node: Node, listener: MqttListener) -> None:
    """Close one of the node's MQTT listeners while the node runs: its MQTT 5 clients
    are told why, its connections end, and it is no longer one of the node's
    (:func:`~meshbus.plugins.mqtt.listeners_of`). The sessions of its clients stay,
    for them to come back to, through another listener of the VPN."""
    await listener.aclose()
    listeners = node.stash.get(LISTENERS, [])
    if listener in listeners:
        listeners.remove(listener)
