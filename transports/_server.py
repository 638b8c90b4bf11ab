"""A node's listeners: remote sessions served over TCP, TLS or any byte stream.

:func:`start_server` binds a listener and serves each accepted connection with
a :class:`_Connection` in the node's task group. A connection logs in to a VPN
as a :class:`~meshbus.Session` and then relays frames: it is the only place
where the node meets bytes from the network, so each step is guarded and any
failure ends that connection alone, with a logged reason.

Until a connection is logged in it reads only small frames (the listener's
``login_frame_size``), and a listener has at most ``max_unauthenticated``
connections logging in at once: more are closed as soon as they connect. So
connections that never log in cannot take more than a bounded amount of memory.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import attrs
from anyio.streams.tls import TLSAttribute, TLSStream

from meshbus._stash import StashKey
from meshbus.errors import (
    AccessDeniedError,
    AuthenticationError,
    MeshbusError,
    ProtocolError,
    TransportError,
)

from . import _events as ev
from ._asyncio_tcp import adopt_tcp_stream
from ._certificates import RenewableCertificates
from ._compression import ALGORITHMS
from ._connection import Connection
from ._link import WireLink
from ._management import provide_management
from ._protocol import LinkProtocol, Role
from ._serving import ServedSession, write_through_of
from ._settings import ListenerSettings
from ._streams import map_exceptions

if TYPE_CHECKING:
    from meshbus._node import Node
    from meshbus._session import Session
    from meshbus.abc import Clock

__all__ = [
    "Server",
    "ServerStatistics",
    "accept_stream",
    "certificate_common_name",
    "peer_address",
    "peer_name",
    "start_server",
]

log = logging.getLogger("meshbus.transports")

_TURNED_AWAY_LOG_INTERVAL = 10.0  # seconds between two reports of connections turned away


@attrs.frozen
class ServerStatistics:
    """Counters of one listener since it started."""

    accepted: int
    """Connections accepted."""
    open: int
    """Connections open now (logged in or logging in)."""
    logins: int
    """Logins accepted."""
    refused: int
    """Logins refused (wrong password, unknown VPN or username, certificate mismatch)."""
    failed: int
    """Connections closed for a protocol, TLS or keepalive failure."""
    bytes_received: int
    """Bytes read from closed and open connections."""
    bytes_sent: int
    """Bytes written to closed and open connections."""
    turned_away: int = 0
    """Connections closed as soon as they connected, because ``max_unauthenticated``
    others were logging in."""


class Server(RenewableCertificates):
    """One listener of a node. Made by :func:`start_server`; closes with the node."""

    def __init__(
        self,
        node: Node,
        settings: ListenerSettings,
        listener: anyio.abc.Listener[anyio.abc.ByteStream] | None = None,
    ) -> None:
        self.node = node
        self.settings = settings
        self.host = settings.host
        self.port = settings.port
        self._listener = listener
        #: The in-memory name it listens on, for a listener of a memory network.
        self.memory_name: str | None = getattr(listener, "name", None)
        self._context: ssl.SSLContext | None = (
            settings.tls.server_context() if settings.tls is not None else None
        )
        self._scope: anyio.CancelScope | None = None
        self._stopped = anyio.Event()
        self._connections: set[Connection] = set()
        self._links: set[WireLink] = set()  # the links it carries, for a graceful close
        self.accepted = self.logins = self.refused = self.failed = 0
        self._closed_bytes = [0, 0]
        self.logging_in = 0  # connections holding a _LoginSlot
        self.turned_away = 0
        self._turned_away_reported = 0
        self._next_report = float("-inf")

    def __repr__(self) -> str:
        return f"<Server {self.url}>"

    @property
    def url(self) -> str:
        """What clients connect to: ``tcp://host:port`` or ``tls://host:port``
        (``memory://name`` on an in-memory network)."""
        if self.memory_name is not None:
            return f"memory://{self.memory_name}"
        scheme = "tls" if self._context is not None else "tcp"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = self._listener
        if listener is None:
            try:
                with map_exceptions(f"listening on {self.host}:{self.settings.port}"):
                    listener = await anyio.create_tcp_listener(
                        local_host=self.host, local_port=self.settings.port
                    )
            except TransportError:
                self._stopped.set()
                raise
        try:
            async with listener, anyio.create_task_group() as tg:
                if self.memory_name is None:
                    self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
                self._scope = tg.cancel_scope
                task_status.started()
                log.info("listening on %s", self.url)
                await listener.serve(self._serve_accepted, task_group=tg)
        finally:
            self._stopped.set()

    async def _serve_accepted(self, stream: anyio.abc.ByteStream) -> None:
        self.accepted += 1
        peer = peer_name(stream)
        address = peer_address(stream)
        slot = self._admit(peer)
        if slot is None:
            await anyio.aclose_forcefully(stream)
            return
        try:
            await self._serve_tcp(stream, peer, slot, address)
        finally:
            slot.release()

    async def _serve_tcp(
        self, stream: anyio.abc.ByteStream, peer: str, slot: _LoginSlot, address: str | None
    ) -> None:
        accepted = await accept_stream(
            stream, self._context, self.node.clock, self.settings.handshake_timeout, peer
        )
        if accepted is None:
            self.failed += 1
            return
        stream, certificate_name = accepted
        await self._serve(stream, peer, certificate_name, slot, address)

    async def serve(
        self,
        stream: anyio.abc.ByteStream,
        *,
        peer: str = "memory",
        certificate_name: str | None = None,
        address: str | None = None,
    ) -> None:
        """Serve one connection on ``stream`` until it closes (for memory streams too).

        Like a connection the listener accepted, it counts against
        ``max_unauthenticated`` until it is logged in, and is closed at once when
        that many are logging in already.

        :param certificate_name: the common name of a verified client certificate.
        :param address: the client's address, under which the node counts failed
            logins (see :class:`meshbus.LoginGuard`); ``None`` counts per username only.
        """
        slot = self._admit(peer)
        if slot is None:
            await anyio.aclose_forcefully(stream)
            return
        try:
            await self._serve(stream, peer, certificate_name, slot, address)
        finally:
            slot.release()

    def _admit(self, peer: str) -> _LoginSlot | None:
        """A place among the connections logging in, or ``None`` (counted, reported)."""
        if self.logging_in < self.settings.max_unauthenticated:
            return _LoginSlot(self)
        self.turned_away += 1
        now = self.node.clock.monotonic()
        if now >= self._next_report:  # a flood of them must not flood the log
            self._next_report = now + _TURNED_AWAY_LOG_INTERVAL
            log.warning(
                "turned away %d connection(s) since the last report, the latest from %s: "
                "%d connections are logging in already (max_unauthenticated)",
                self.turned_away - self._turned_away_reported,
                peer,
                self.logging_in,
            )
            self._turned_away_reported = self.turned_away
        return None

    async def _serve(
        self,
        stream: anyio.abc.ByteStream,
        peer: str,
        certificate_name: str | None,
        slot: _LoginSlot,
        address: str | None,
    ) -> None:
        settings = self.settings
        protocol = LinkProtocol(
            Role.SERVER,
            max_frame_size=settings.max_frame_size,
            handshake_frame_size=settings.login_frame_size,
        )
        connection = Connection(stream, protocol, peer, self.node.clock)
        self._connections.add(connection)
        try:
            await self._login_and_serve(connection, certificate_name, slot, address)
        except Exception:  # a bug must cost one connection, never the node
            self.failed += 1
            log.exception("closing connection from %s: internal error", peer)
        finally:
            self._connections.discard(connection)
            self._closed_bytes[0] += protocol.bytes_received
            self._closed_bytes[1] += protocol.bytes_sent
            await connection.aclose()

    async def _login_and_serve(
        self,
        connection: Connection,
        certificate_name: str | None,
        slot: _LoginSlot,
        address: str | None,
    ) -> None:
        settings = self.settings
        try:
            with self.node.clock.fail_after(settings.handshake_timeout):
                hello = await connection.receive_handshake()
        except TimeoutError:
            self.failed += 1
            log.warning("closing connection from %s: no login in time", connection.peer)
            return
        except (ProtocolError, TransportError) as exc:
            self.failed += 1
            log.warning("closing connection from %s: %s", connection.peer, exc)
            return
        assert isinstance(hello, ev.Hello)  # a node's side of the handshake reads a HELLO
        if hello.link is not None:
            await self._serve_link(connection, hello, certificate_name, address, slot)
            return
        served = await self._login(connection, hello, certificate_name, address)
        if served is None:
            return
        slot.release()  # logged in: no longer limited as a connection logging in
        self.logins += 1
        try:
            await served.run()
        except (ProtocolError, TransportError) as exc:
            self.failed += 1
            log.warning("closing connection from %s: %s", connection.peer, exc)
        finally:
            served.session.close()

    async def _serve_link(
        self,
        connection: Connection,
        hello: ev.Hello,
        certificate_name: str | None,
        address: str | None,
        slot: _LoginSlot,
    ) -> None:
        """A peer node opens a link: log it in like a client, check that its user may
        open links (``allow_bridge_connections``, plugins), then carry the link."""
        session = await self._authenticate(connection, hello, certificate_name, address)
        if session is None:
            return
        assert hello.link is not None
        login = hello.link
        vpn = session.vpn
        name = f"{login.node}/{login.name}"
        try:
            try:
                user = vpn.users.get(session.username) or vpn.users["default"]
                vpn.accept_link(user, login.kind, login.node, login.cluster, login.name)
                old = vpn.links.get(name)
                if old is not None:
                    if not (isinstance(old, WireLink) and old.settings is None):
                        raise AccessDeniedError(
                            session.username, "connect", why=f"VPN has a link named {name!r}"
                        )
                    # The peer came back while its old connection still looks alive.
                    old.stop(f"replaced by a new connection from {connection.peer}")
            except AccessDeniedError as exc:
                self._refuse(connection, exc, session.username, vpn.name)
                await connection.flush_quietly()
                return
            link = WireLink(
                vpn,
                name,
                kind=login.kind,
                session=session,
                acl=session._acl,
                profile=session.client_profile,
                peer_login=login,
                drain_timeout=self.settings.drain_timeout,
            )
            vpn.links.attach(link)
            welcome = self._welcome(session, {"link": login.kind})
            compression = self._compression(hello)
            connection.protocol.accept(welcome, compression=compression)
            slot.release()
            self.logins += 1
            log.info(
                "link from %s: %r of node %s as %r in VPN %r%s",
                connection.peer,
                login.name,
                login.node,
                session.username,
                vpn.name,
                f" ({compression})" if compression else "",
            )
            self._links.add(link)
            try:
                await link.serve(
                    connection,
                    login.node,
                    login.cluster,
                    keepalive=self.settings.keepalive,
                    keepalive_timeout=self.settings.keepalive_timeout,
                )
            finally:
                self._links.discard(link)
                link.stop(link.reason or "its connection ended")
            if isinstance(link.error, ProtocolError):  # a violation, as for a session
                self.failed += 1
                log.warning("closing connection from %s: %s", connection.peer, link.error)
        finally:
            session.close()

    async def _authenticate(
        self,
        connection: Connection,
        hello: ev.Hello,
        certificate_name: str | None,
        address: str | None,
    ) -> Session | None:
        """The session ``hello`` logs in to, or ``None`` (refused, answered, counted)."""
        vpn = hello.vpn or "default"
        username = hello.username or certificate_name or "default"
        try:
            # Never a password check on the event loop, and a refusal that says
            # nothing of the username (SPEC 6): the node's login does both, and
            # slows down repeated failures from this address.
            return await self.node.login(
                vpn,
                username=username,
                password=hello.password,
                client_name=hello.client_name,
                no_local=hello.no_local,
                timestamps=hello.timestamps,
                certificate_name=certificate_name,
                address=address,
            )
        except MeshbusError as exc:
            self._refuse(connection, exc, username, vpn)
            await connection.flush_quietly()
            return None

    def _refuse(self, connection: Connection, exc: MeshbusError, username: str, vpn: str) -> None:
        self.refused += 1
        code = "authentication" if isinstance(exc, AccessDeniedError) else "refused"
        # The real reason, which the client is not told, at a rate that cannot
        # flood the log.
        reason = exc.reason if isinstance(exc, AuthenticationError) else str(exc)
        where = f"user {username!r}, VPN {vpn!r}"
        self.node.logins.log_refusal(log, connection.peer, f"{reason} ({where})")
        if isinstance(exc, AccessDeniedError):
            connection.protocol.refuse(code, str(exc), exc.why, exc.username)
        else:
            connection.protocol.refuse(code, str(exc))

    def _compression(self, hello: ev.Hello) -> str | None:
        if not self.settings.compression:
            return None
        return next((a for a in ALGORITHMS if a in hello.compression), None)

    def _welcome(self, session: Session, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "client_name": session.client_name,
            "vpn": session.vpn.name,
            "node": self.node.name,
            "node_id": self.node.node_id,
            "cluster": self.node.cluster,
            "keepalive": self.settings.keepalive,
            "keepalive_timeout": self.settings.keepalive_timeout,
            "max_frame_size": self.settings.max_frame_size,
            **extra,
        }

    async def _login(
        self,
        connection: Connection,
        hello: ev.Hello,
        certificate_name: str | None,
        address: str | None,
    ) -> ServedSession | None:
        session = await self._authenticate(connection, hello, certificate_name, address)
        if session is None:
            return None
        vpn = session.vpn.name
        compression = self._compression(hello)
        connection.protocol.accept(self._welcome(session, {}), compression=compression)
        write_through = write_through_of(self.node)
        served = ServedSession(connection, session, self.settings, write_through)
        try:
            await connection.flush()
        except TransportError as exc:
            session.close()
            log.warning("connection from %s lost at login: %s", connection.peer, exc)
            return None
        log.info(
            "login from %s: %s as %r in VPN %r%s",
            connection.peer,
            session.client_name,
            session.username,
            vpn,
            f" ({compression})" if compression else "",
        )
        return served

    async def aclose(self) -> None:
        """Stop listening and close every connection of this listener. The links it
        accepted first write what they had taken for their peers (each for at most its
        :attr:`~meshbus.transports.WireLink.drain_timeout`)."""
        if self._links:
            async with anyio.create_task_group() as tg:
                for link in list(self._links):
                    tg.start_soon(link.aclose, "its listener is closing")
        if self._scope is not None:
            self._scope.cancel()
        await self._stopped.wait()

    def statistics(self) -> ServerStatistics:
        """A snapshot of this listener's counters."""
        received, sent = self._closed_bytes
        for connection in self._connections:
            received += connection.protocol.bytes_received
            sent += connection.protocol.bytes_sent
        return ServerStatistics(
            accepted=self.accepted,
            open=len(self._connections),
            logins=self.logins,
            refused=self.refused,
            failed=self.failed,
            bytes_received=received,
            bytes_sent=sent,
            turned_away=self.turned_away,
        )


async def start_server(
    node: Node,
    settings: ListenerSettings | None = None,
    *,
    listener: anyio.abc.Listener[anyio.abc.ByteStream] | None = None,
) -> Server:
    """Start a listener for remote sessions (and links) in ``node`` (which must be running).

    It stops with the node, or earlier with :meth:`Server.aclose`. The node's first
    listener also serves the management API to usernames with the management role
    (see :class:`Management`).

    :param listener: accept connections from this listener (a
        :class:`MemoryNetwork`'s, say) instead of binding ``settings.host`` and
        ``settings.port``; the other settings apply as for TCP.
    :raises ConfigurationError: the TLS settings are not usable.
    :raises TransportError: the address cannot be bound.
    """
    server = Server(node, settings if settings is not None else ListenerSettings(), listener)
    provide_management(node)  # for remote sessions with the management role
    await node.task_group.start(server._run)
    node.stash.setdefault(SERVERS, []).append(server)
    return server


class _LoginSlot:
    """One connection's place among those a listener has logging in."""

    __slots__ = ("_server",)

    def __init__(self, server: Server) -> None:
        self._server: Server | None = server
        server.logging_in += 1

    def release(self) -> None:
        """Give the place back (once: later calls do nothing)."""
        server = self._server
        if server is not None:
            self._server = None
            server.logging_in -= 1


SERVERS: StashKey[list[Server]] = StashKey()
"""Where a node keeps its servers (``node.stash``), for statistics."""


def servers_of(node: Node) -> list[Server]:
    """The servers (listeners for remote sessions) ``node`` runs, in the order started."""
    return [server for server in node.stash.get(SERVERS, []) if not server._stopped.is_set()]


def peer_address(stream: anyio.abc.ByteStream) -> str | None:
    """Where a client connects from, as failed logins are counted: its IP address, or
    its /64 network for IPv6 (one host usually has a whole /64 to pick from)."""
    address = stream.extra(anyio.abc.SocketAttribute.remote_address, None)
    if not isinstance(address, tuple) or not address:
        return None
    try:
        ip = ipaddress.ip_address(address[0])
    except ValueError:
        return str(address[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


_HANDSHAKE_FAILURES = (
    TimeoutError,
    ssl.SSLError,
    OSError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
)


async def accept_stream(
    stream: anyio.abc.ByteStream,
    context: ssl.SSLContext | None,
    clock: Clock,
    timeout: float,
    peer: str,
) -> tuple[anyio.abc.ByteStream, str | None] | None:
    """An accepted TCP stream made ready to serve: adopted for fast writes
    (:func:`adopt_tcp_stream`) and, with a ``context``, wrapped in TLS within
    ``timeout`` seconds of ``clock``. Return it with the common name of the client
    certificate verified (``None`` without one); ``None`` when the TLS handshake
    failed (logged, and the stream closed)."""
    stream = adopt_tcp_stream(stream)
    if context is None:
        return stream, None
    try:
        with clock.fail_after(timeout):
            stream = await TLSStream.wrap(
                stream, server_side=True, ssl_context=context, standard_compatible=False
            )
    except (
        TimeoutError,
        ssl.SSLError,
        OSError,
        anyio.BrokenResourceError,
        anyio.EndOfStream,
    ) as exc:
        why = str(exc) or type(exc).__name__
        log.warning("closing connection from %s: TLS handshake failed: %s", peer, why)
        await anyio.aclose_forcefully(stream)
        return None
    certificate = stream.extra(TLSAttribute.peer_certificate, None)
    return stream, certificate_common_name(certificate)


def peer_name(stream: anyio.abc.ByteStream) -> str:
    """``host:port`` of a stream's far end, for logs (``"unknown"`` when it has none)."""
    address = stream.extra(anyio.abc.SocketAttribute.remote_address, None)
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address) if address is not None else "unknown"


def certificate_common_name(certificate: object) -> str | None:
    """The subject common name of a peer certificate as ``ssl`` reports it."""
    if not isinstance(certificate, dict):
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
