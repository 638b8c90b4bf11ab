"""What an MQTT listener is configured with."""

from __future__ import annotations

from typing import Any

import attrs

from meshbus import ConfigurationError
from meshbus.transports import TlsSettings

__all__ = [
    "DEFAULT_MQTTS_PORT",
    "DEFAULT_MQTT_PORT",
    "DEFAULT_WSS_PORT",
    "DEFAULT_WS_PORT",
    "MqttListenerSettings",
]

DEFAULT_MQTT_PORT = 1883
"""MQTT's registered port, for a plain TCP listener."""
DEFAULT_MQTTS_PORT = 8883
"""MQTT over TLS's registered port."""
DEFAULT_WS_PORT = 8000
"""The port of an MQTT over WebSocket listener in the configuration file, when it
names none (MQTT has no registered one)."""
DEFAULT_WSS_PORT = 8443
"""The port of an MQTT over secure WebSocket listener, likewise."""


def _at_least(minimum: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigurationError(
                f"{attribute.name} must be an integer >= {minimum}, got {value!r}"
            )

    return check


def _between(low: int, high: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigurationError(
                f"{attribute.name} must be an integer from {low} to {high}, got {value!r}"
            )

    return check


def _flag(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{attribute.name} must be true or false, got {value!r}")


def _path(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "? #"):
        raise ConfigurationError(
            f"{attribute.name} must be a URL path starting with '/' (no query), got {value!r}"
        )


def _seconds(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ConfigurationError(f"{attribute.name} must be a positive number, got {value!r}")


@attrs.frozen
class MqttListenerSettings:
    """One MQTT listener of a node: MQTT 3.1.1 and 5 clients of one VPN (SPEC 13)."""

    host: str = "127.0.0.1"
    """Address to bind; ``"0.0.0.0"`` or ``"::"`` to accept from other machines."""
    port: int = attrs.field(default=DEFAULT_MQTT_PORT, validator=_between(0, 65535))
    """TCP port; 0 picks a free one (see :attr:`MqttListener.port`)."""
    vpn: str = "default"
    """The Message VPN its clients log in to: its users, passwords, client
    certificates, ACLs and client profiles apply."""
    tls: TlsSettings | None = None
    """TLS settings (``require_client_certificate`` for certificate logins); ``None``
    for plain TCP."""
    name: str = ""
    """A label for logs and statistics (default: ``mqtt://host:port``)."""
    max_packet_size: int = attrs.field(default=16 * 1024 * 1024, validator=_at_least(1024))
    """Largest packet taken from a logged-in client (announced in an MQTT 5 CONNACK);
    a bigger one closes the connection as soon as its fixed header is read."""
    connect_packet_size: int = attrs.field(default=65536, validator=_at_least(128))
    """Largest packet taken before the client is logged in (its CONNECT)."""
    connect_timeout: float = attrs.field(default=10.0, validator=_seconds)
    """Seconds a new connection has to send its CONNECT and be answered."""
    max_unauthenticated: int = attrs.field(default=256, validator=_at_least(1))
    """Most connections logging in at once; more are closed as soon as they connect."""
    max_keepalive: int = attrs.field(default=3600, validator=_between(1, 65535))
    """The longest keepalive allowed: an MQTT 5 client asking for more (or for none)
    is told this one (server keep alive)."""
    receive_maximum: int = attrs.field(default=100, validator=_between(1, 65535))
    """QoS 1 and 2 publishes a client may have unacknowledged (MQTT 5 receive maximum)."""
    max_inflight: int = attrs.field(default=100, validator=_between(1, 65535))
    """QoS 1 messages sent to a client and not acknowledged yet, at most (an MQTT 5
    client's own receive maximum lowers it)."""
    topic_alias_maximum: int = attrs.field(default=32, validator=_between(0, 65535))
    """Topic aliases an MQTT 5 client may set (0: none)."""
    max_session_expiry: int = attrs.field(default=0xFFFFFFFF, validator=_at_least(0))
    """Longest a persistent session outlives its connection, in seconds (0xFFFFFFFF:
    until the client cleans it, as MQTT 3.1.1 persistent sessions do)."""
    max_queued_messages: int = attrs.field(default=100_000, validator=_at_least(1))
    """Messages a client's queue holds for its QoS 1 subscriptions, at most."""
    websocket: bool = attrs.field(default=False, validator=_flag)
    """MQTT over WebSocket (``ws://``, or ``wss://`` with ``tls``): clients upgrade an
    HTTP request for :attr:`websocket_path` with the ``mqtt`` subprotocol, then send
    their packets in binary messages."""
    websocket_path: str = attrs.field(default="/mqtt", validator=_path)
    """The path a WebSocket listener takes upgrades at; any other is answered 404."""

    @property
    def label(self) -> str:
        """The name, or ``mqtt://host:port`` (``mqtts://`` with TLS)."""
        if self.name:
            return self.name
        tls = self.tls is not None
        return url_of(self.host, self.port, tls, self.websocket, self.websocket_path)


def url_of(host: str, port: int, tls: bool, websocket: bool, path: str) -> str:
    """``mqtt://host:port``, ``mqtts://``, or ``ws://host:port/path`` (``wss://``)."""
    if ":" in host:
        host = f"[{host}]"
    if websocket:
        return f"{'wss' if tls else 'ws'}://{host}:{port}{path}"
    return f"{'mqtts' if tls else 'mqtt'}://{host}:{port}"
