"""How a client reaches a node: its settings, its targets in connect order, on its clock.

:class:`ConnectSettings` is everything a remote session (or a link opened to another
node) needs to reach and log in to a node. Its ``targets`` are tried in order: a URL
(``tcp://`` or ``tls://``) or any anyio :class:`~anyio.abc.ByteStreamConnectable`
(an in-memory network's, say). :class:`Dialer` connects and logs in, with every
timeout and every wait between attempts on the given clock, so that a test on a
:class:`~meshbus.ManualClock` drives reconnects by moving time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
import attrs

from meshbus._clock import SystemClock
from meshbus.abc import Clock
from meshbus.errors import AuthenticationError, ConfigurationError, TransportError

from . import _events as ev
from ._backoff import Backoff
from ._compression import ALGORITHMS
from ._connection import Connection
from ._framing import FRAME_HEADROOM
from ._protocol import LinkProtocol, Role
from ._settings import MAX_FRAME_SIZE, TlsSettings
from ._streams import connect_stream, map_exceptions, parse_url

__all__ = ["ConnectSettings", "Dialer", "Remote", "Target", "target_name"]

Target = str | anyio.abc.ByteStreamConnectable
"""Where a node is: ``tcp://host:port``, ``tls://host:port``, or a connectable."""


def _check_target(item: object) -> None:
    if isinstance(item, str):
        parse_url(item)  # raises ConfigurationError naming what is wrong
    elif not isinstance(item, anyio.abc.ByteStreamConnectable):
        raise ConfigurationError(f"a target is a URL or a connectable, not {item!r}")


def validate_compression(value: object) -> None:
    """Check a ``compression`` setting: ``True`` (offer every algorithm this install
    has), ``False`` (none) or the name of one algorithm to offer alone.

    :raises ConfigurationError: naming the algorithms this install can negotiate.
    """
    if isinstance(value, bool) or (isinstance(value, str) and value in ALGORITHMS):
        return
    raise ConfigurationError(
        f"compression must be true, false or one of {', '.join(map(repr, ALGORITHMS))}, "
        f"got {value!r}"
    )


def _compression(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:  # a Remote's None: as the common settings say
        validate_compression(value)


@attrs.frozen
class Remote:
    """A target with login settings of its own; each ``None`` is the
    :class:`ConnectSettings`' own (for a bridge whose remotes differ: SPEC 7)."""

    target: Target = attrs.field()
    """Where the node is: a URL or a connectable."""
    username: str | None = None
    """Who to log in as there."""
    password: str | None = attrs.field(default=None, repr=False)
    """The password there."""
    tls: TlsSettings | None = None
    """What to trust and the certificate to show there."""
    compression: bool | str | None = attrs.field(default=None, validator=_compression)
    """Whether to ask that node to compress the connection, or with which algorithm
    (as :attr:`ConnectSettings.compression`); ``None``: as the common settings say."""
    window: int | None = attrs.field(default=None)
    """For a link: the guaranteed messages in flight on each flow it binds there (to
    the queues it pulls), instead of the flow's own window."""

    @window.validator
    def _window(self, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65_535
        ):
            raise ConfigurationError(f"window must be an int from 1 to 65535, got {value!r}")

    @target.validator
    def _target(self, attribute: attrs.Attribute[Any], value: object) -> None:
        _check_target(value)


def _targets(value: object) -> tuple[Target | Remote, ...]:
    single = (str, anyio.abc.ByteStreamConnectable, Remote)
    items = [value] if isinstance(value, single) else value
    if not isinstance(items, Sequence) or isinstance(items, str):
        raise ConfigurationError(f"targets must be URLs or connectables, got {value!r}")
    out = tuple(items)
    if not out:
        raise ConfigurationError("a client needs at least one target to connect to")
    for item in out:
        if not isinstance(item, Remote):
            _check_target(item)
    return out


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigurationError(f"{attribute.name} must be a positive number, got {value!r}")


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not value > 0:
        raise ConfigurationError(f"{attribute.name} must be a positive integer, got {value!r}")


def compression_offer(compression: bool | str | None) -> list[str]:
    """The algorithms a HELLO offers for a ``compression`` setting: all this version
    speaks, fastest first, for ``True``; the one named; none for ``False``/``None``."""
    if compression is True:
        return list(ALGORITHMS)
    return [compression] if isinstance(compression, str) else []


def target_name(target: Target | Remote) -> str:
    """How a target is named in logs and errors."""
    if isinstance(target, Remote):
        target = target.target
    return target if isinstance(target, str) else repr(target)


@attrs.frozen
class ConnectSettings:
    """How a client reaches and logs in to a node (see :func:`meshbus.transports.connect`)."""

    targets: tuple[Target | Remote, ...] = attrs.field(converter=_targets)
    """Where the node is, tried in this order: URLs (``tcp://``, ``tls://``) or anyio
    connectables, each alone or in a :class:`Remote` with login settings of its own."""
    vpn: str = "default"
    """The Message VPN to log in to."""
    username: str | None = None
    """The client username; without one, a client certificate's name (TLS) or
    ``"default"``."""
    password: str | None = attrs.field(default=None, repr=False)
    """For basic authentication."""
    client_name: str | None = None
    """The session's client name (default: one the node makes up, kept for every
    reconnect)."""
    no_local: bool = False
    """Not to receive the session's own publishes."""
    timestamps: bool = False
    """Have the node stamp the direct messages the session publishes."""
    tls: TlsSettings | None = None
    """Trust, certificate and checks for ``tls://`` targets (default: system CAs)."""
    compression: bool | str = attrs.field(default=False, validator=_compression)
    """Ask the node to compress the connection: ``True`` offers every algorithm this
    version speaks, fastest first (``"lz4"``, then ``"zlib"``), and the node takes the
    first it speaks too; ``"lz4"`` or ``"zlib"`` offers that one alone (zlib's smaller
    output can pay on a slow link, see :doc:`/how-to/remote-sessions`)."""
    reconnect: bool = True
    """After a lost connection, reconnect with backoff (the first connection is not
    retried: its failure raises)."""
    backoff: Backoff | None = None
    """Delays between reconnect attempts (a policy: each client counts its own
    attempts); default 1 s doubling to 2 min, jittered."""
    connect_timeout: float = attrs.field(default=10.0, validator=_positive)
    """Seconds allowed to connect to a target, and again for the login's answer."""
    max_buffered_messages: int = attrs.field(default=100_000, validator=_positive_int)
    """Received messages buffered for :meth:`RemoteSession.receive`; beyond, the oldest
    are discarded."""
    max_buffered_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=_positive_int)
    """Bytes of received messages buffered likewise."""
    max_send_buffer: int = attrs.field(default=16 * 1024 * 1024, validator=_positive_int)
    """Bytes of publishes waiting to be written before :meth:`RemoteSession.publish`
    refuses more."""
    max_frame_size: int = attrs.field(
        default=MAX_FRAME_SIZE + FRAME_HEADROOM, validator=_positive_int
    )
    """The largest frame accepted from the node (told to it at login)."""
    clock: Clock | None = attrs.field(default=None, eq=False)
    """Where keepalive, timeouts and reconnect delays take their time from (default:
    the system clock; a node's clock for links and tests)."""

    @property
    def uses_tls(self) -> bool:
        """Whether these settings ask for TLS anywhere (a ``tls`` setting or a ``tls://``
        URL, their own or a :class:`Remote`'s)."""
        if self.tls is not None:
            return True
        for target in self.targets:
            if isinstance(target, Remote):
                if target.tls is not None:
                    return True
                target = target.target
            if isinstance(target, str) and target.startswith("tls:"):
                return True
        return False

    def hello(self, client_name: str | None) -> dict[str, Any]:
        """The HELLO header of a login with these settings."""
        hello: dict[str, Any] = {"vpn": self.vpn, "no_local": self.no_local}
        if self.timestamps:
            hello["timestamps"] = True
        if self.username is not None:
            hello["username"] = self.username
        if self.password is not None:
            hello["password"] = self.password
        if client_name is not None:
            hello["client_name"] = client_name
        if self.compression:
            hello["compression"] = compression_offer(self.compression)
        return hello


class Dialer:
    """Connects and logs in to a node, trying :attr:`ConnectSettings.targets` in order.

    :param settings: where and how.
    :param clock: the clock of timeouts and waits (default: the settings' or the system's).
    """

    def __init__(self, settings: ConnectSettings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or settings.clock or SystemClock()
        template = settings.backoff or Backoff()
        self.backoff = template.fresh()
        #: The target of the current (or last) connection.
        self.index = 0

    @property
    def target(self) -> str:
        """The name of the current (or last) target."""
        return target_name(self.settings.targets[self.index])

    async def login(
        self, hello: dict[str, Any], *, start: int = 0, stop: int | None = None
    ) -> tuple[Connection, ev.Welcome]:
        """Connect and log in to the first target, from ``start``, that takes the login.

        :raises AuthenticationError: a node refused the login (and no later target took it).
        :raises TransportError: no target could be reached.
        """
        targets = self.settings.targets
        failure: Exception | None = None
        for index in range(start, len(targets) if stop is None else stop):
            try:
                connection, welcome = await self._login_once(targets[index], hello)
            except (AuthenticationError, TransportError) as exc:
                if failure is None or isinstance(exc, AuthenticationError):
                    failure = exc  # a refusal says more than an unreachable target
                continue
            self.index = index
            return connection, welcome
        assert failure is not None
        raise failure

    async def _login_once(
        self, remote: Target | Remote, hello: dict[str, Any]
    ) -> tuple[Connection, ev.Welcome]:
        settings = self.settings
        name = target_name(remote)
        target: Target
        tls, username = settings.tls, settings.username
        if not isinstance(remote, Remote):
            target = remote
        else:  # its own settings replace the common ones
            target, hello = remote.target, dict(hello)
            if remote.username is not None:
                hello["username"] = username = remote.username
            if remote.password is not None:
                hello["password"] = remote.password
            if remote.compression is not None:
                hello.pop("compression", None)
                if remote.compression:
                    hello["compression"] = compression_offer(remote.compression)
            if remote.tls is not None:
                tls = remote.tls
        stream = await self._connect(target, tls)
        protocol = LinkProtocol(Role.CLIENT, max_frame_size=settings.max_frame_size)
        connection = Connection(stream, protocol, name, self.clock)
        try:
            protocol.hello(hello)
            await connection.flush()
            try:
                with self.clock.fail_after(settings.connect_timeout):
                    welcome = await connection.receive_handshake()
            except AuthenticationError as exc:  # name the user as the node did
                username = exc.username or username or "default"
                raise AuthenticationError(username, exc.why) from None
        except TimeoutError:
            await connection.aclose()
            raise TransportError(f"connecting to {name}: no answer to the login") from None
        except TransportError as exc:
            await connection.aclose()
            if name.startswith("tls:") and (tls is None or tls.certificate is None):
                # With TLS 1.3 a node checks client certificates after the client's side
                # of the handshake is done; its refusal arrives as a closed connection.
                raise TransportError(
                    f"{exc} (during login, without a client certificate: the node may require one)"
                ) from exc
            raise
        except BaseException:
            await connection.aclose()
            raise
        assert isinstance(welcome, ev.Welcome)
        return connection, welcome

    async def _connect(self, target: Target, tls: TlsSettings | None) -> anyio.abc.ByteStream:
        settings = self.settings
        if isinstance(target, str):
            return await connect_stream(target, tls=tls, timeout=settings.connect_timeout)
        name = target_name(target)
        try:
            with (
                self.clock.fail_after(settings.connect_timeout),
                map_exceptions(f"connecting to {name}"),
            ):
                return await target.connect()
        except TimeoutError:
            raise TransportError(
                f"connecting to {name}: timed out after {settings.connect_timeout} s"
            ) from None
        except anyio.ConnectionFailed as exc:
            raise TransportError(f"connecting to {name}: {exc}") from exc

    async def wait(self) -> float:
        """Wait, on the clock, before the next attempt; return how long."""
        delay = self.backoff.next_delay()
        await self.clock.sleep_until(self.clock.monotonic() + delay)
        return delay
