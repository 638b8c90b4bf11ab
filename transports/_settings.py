"""Settings of listeners and TLS, as attrs values (validated when made)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import attrs

from meshbus.errors import ConfigurationError

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TLS_PORT",
    "LOGIN_FRAME_SIZE",
    "MAX_FRAME_SIZE",
    "ListenerSettings",
    "TlsSettings",
]

DEFAULT_PORT = 55555
"""Where ``meshbus run`` listens for plain TCP when no configuration says otherwise."""
DEFAULT_TLS_PORT = 55443
"""The customary port of a TLS listener."""
MAX_FRAME_SIZE = 32 * 1024 * 1024
"""Largest frame a link accepts by default (a 30 MB payload plus its header)."""
LOGIN_FRAME_SIZE = 64 * 1024
"""Largest frame a connection accepts before it is logged in, by default (a login
takes well under 1 KB)."""

_TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def _optional_path(value: object) -> Path | None:
    if value is None or isinstance(value, Path):
        return value
    if isinstance(value, str) and value:
        return Path(value)
    raise ConfigurationError(f"expected a file path, got {value!r}")


def _tls_version(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in _TLS_VERSIONS:
        raise ConfigurationError(
            f"{attribute.name} must be one of {sorted(_TLS_VERSIONS)}, got {value!r}"
        )


def _positive_number(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigurationError(
            f"{type(instance).__name__}.{attribute.name} must be a positive number, got {value!r}"
        )


def _at_least(minimum: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigurationError(
                f"{type(instance).__name__}.{attribute.name} must be an integer of at least "
                f"{minimum}, got {value!r}"
            )

    return check


def _port(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigurationError(f"port must be an integer from 0 to 65535, got {value!r}")


@attrs.frozen
class TlsSettings:
    """TLS for one side of a link.

    A server needs ``certificate`` and ``private_key``; with
    ``require_client_certificate`` it also needs ``ca`` (mutual authentication).
    A client trusts only ``ca`` (the pinned CA) when it is given, else the system's
    trust store, and presents ``certificate``/``private_key`` when given.
    """

    ca: Path | None = attrs.field(default=None, converter=_optional_path)
    """PEM file of the CA certificate(s) to trust; nothing else is trusted when set."""
    certificate: Path | None = attrs.field(default=None, converter=_optional_path)
    """PEM file of this side's certificate chain."""
    private_key: Path | None = attrs.field(default=None, converter=_optional_path)
    """PEM file of this side's private key."""
    require_client_certificate: bool = False
    """Server only: refuse clients without a certificate signed by ``ca``."""
    server_hostname: str | None = None
    """Client only: the name to verify in the server's certificate (default: the host)."""
    check_hostname: bool = True
    """Client only: verify that the server certificate names the host."""
    minimum_version: str = attrs.field(default="TLSv1.2", validator=_tls_version)
    """Oldest protocol version accepted: ``"TLSv1.2"`` or ``"TLSv1.3"``."""
    ciphers: str | None = None
    """OpenSSL cipher list for TLS 1.2 (TLS 1.3 suites are not configurable)."""

    def server_context(self) -> ssl.SSLContext:
        """An :class:`ssl.SSLContext` for a listener; :class:`ConfigurationError` if unusable."""
        if self.certificate is None or self.private_key is None:
            raise ConfigurationError("a TLS listener needs 'certificate' and 'private_key'")
        if self.require_client_certificate and self.ca is None:
            raise ConfigurationError("'require_client_certificate' needs 'ca' to verify them")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._common(context)
        if self.ca is not None:
            context.verify_mode = (
                ssl.CERT_REQUIRED if self.require_client_certificate else ssl.CERT_OPTIONAL
            )
        return context

    def client_context(self) -> ssl.SSLContext:
        """An :class:`ssl.SSLContext` for connecting; :class:`ConfigurationError` if unusable."""
        if (self.certificate is None) != (self.private_key is None):
            raise ConfigurationError("give both 'certificate' and 'private_key', or neither")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = self.check_hostname
        if self.ca is None:
            context.load_default_certs()
        self._common(context)
        return context

    def _common(self, context: ssl.SSLContext) -> None:
        context.minimum_version = _TLS_VERSIONS[self.minimum_version]
        try:
            if self.ciphers is not None:
                context.set_ciphers(self.ciphers)
            if self.ca is not None:
                context.load_verify_locations(cafile=str(self.ca))
            if self.certificate is not None:
                context.load_cert_chain(str(self.certificate), keyfile=str(self.private_key))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"TLS settings are not usable: {exc}") from exc


@attrs.frozen
class ListenerSettings:
    """One listening socket of a node, for remote sessions (and, later, links)."""

    host: str = "127.0.0.1"
    """Address to bind; ``"0.0.0.0"`` or ``"::"`` to accept from other machines."""
    port: int = attrs.field(default=DEFAULT_PORT, validator=_port)
    """TCP port; 0 picks a free one (see :attr:`meshbus.transports.Server.port`)."""
    tls: TlsSettings | None = None
    """TLS settings; ``None`` for plain TCP."""
    compression: bool = True
    """Whether a client may ask for compression on its connection."""
    max_frame_size: int = attrs.field(default=MAX_FRAME_SIZE, validator=_positive_number)
    """Largest frame accepted from a logged-in client; a bigger one closes the connection.
    Clients learn it at login and refuse to send more (``PublishRejectedError``)."""
    login_frame_size: int = attrs.field(default=LOGIN_FRAME_SIZE, validator=_at_least(1024))
    """Largest frame accepted before login; a bigger one closes the connection at once."""
    max_unauthenticated: int = attrs.field(default=256, validator=_at_least(1))
    """Most connections logging in at once (from their TCP connect until their login is
    answered); more are closed as soon as they connect, and counted."""
    keepalive: float = attrs.field(default=10.0, validator=_positive_number)
    """Seconds of silence after which a ping is sent."""
    keepalive_timeout: float = attrs.field(default=30.0, validator=_positive_number)
    """Seconds without hearing from a peer after which it is taken as dead."""
    handshake_timeout: float = attrs.field(default=10.0, validator=_positive_number)
    """Seconds a new connection has to log in."""
    drain_timeout: float = attrs.field(default=5.0, validator=_positive_number)
    """Seconds a link this listener accepted (a bridge's, a mesh peer's) may take, as it
    closes, to write what it had taken for its peer (see
    :attr:`~meshbus.transports.WireLink.drain_timeout`)."""
    name: str = ""
    """A label for logs and statistics (default: ``host:port``)."""
