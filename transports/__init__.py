"""Transports: links between processes, and remote sessions over them (SPEC 10).

Layered from the bottom up: a byte stream (memory pair, TCP, TLS) → optional
compression → length-prefixed frames → a codec (JSON headers, raw payloads) →
the sans-IO :class:`LinkProtocol`. On top: :func:`start_server` serves a node's
sessions to other processes, and :func:`connect` opens a :class:`RemoteSession`
with the same calls as an in-process :class:`meshbus.Session`.
"""

from __future__ import annotations

from ._asyncio_tcp import READ_HIGH_WATER, AsyncioTcpStream, adopt_tcp_stream
from ._backoff import Backoff
from ._certificates import RenewableCertificates
from ._client import RemoteSession, connect
from ._config_tables import read_backoff_table, read_listener_tls_table, read_tls_table
from ._dialing import ConnectSettings, Remote, Target, validate_compression
from ._events import Advertise
from ._framing import FrameDecoder, FrameKind, encode_frame
from ._link import WireLink, open_link
from ._management import MANAGEMENT_SERVICE, Management
from ._memory import MemoryListener, MemoryNetwork, MemoryStream
from ._metrics import (
    DEFAULT_METRICS_PORT,
    MetricsEndpoint,
    MetricsSettings,
    NodeCollector,
    serve_metrics,
)
from ._protocol import PROTOCOL_VERSION, ConnectionState, LinkProtocol, Role
from ._remote_flow import RemoteFlow
from ._remote_management import RemoteManagement
from ._server import (
    Server,
    ServerStatistics,
    accept_stream,
    certificate_common_name,
    peer_address,
    peer_name,
    servers_of,
    start_server,
)
from ._serving import WriteThrough, write_through_of
from ._session_calls import RemoteSessionStatistics
from ._settings import (
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    MAX_FRAME_SIZE,
    ListenerSettings,
    TlsSettings,
)
from ._streams import MemoryByteStream, connect_stream, memory_stream_pair, parse_url

__all__ = [
    "DEFAULT_METRICS_PORT",
    "DEFAULT_PORT",
    "DEFAULT_TLS_PORT",
    "MANAGEMENT_SERVICE",
    "MAX_FRAME_SIZE",
    "PROTOCOL_VERSION",
    "READ_HIGH_WATER",
    "Advertise",
    "AsyncioTcpStream",
    "Backoff",
    "ConnectSettings",
    "FrameDecoder",
    "FrameKind",
    "LinkProtocol",
    "ConnectionState",
    "ListenerSettings",
    "Management",
    "MemoryByteStream",
    "MemoryListener",
    "MemoryNetwork",
    "MemoryStream",
    "MetricsEndpoint",
    "MetricsSettings",
    "NodeCollector",
    "RemoteFlow",
    "RemoteManagement",
    "RemoteSession",
    "RemoteSessionStatistics",
    "RenewableCertificates",
    "Role",
    "Server",
    "ServerStatistics",
    "Remote",
    "Target",
    "TlsSettings",
    "WireLink",
    "WriteThrough",
    "accept_stream",
    "adopt_tcp_stream",
    "certificate_common_name",
    "connect",
    "connect_stream",
    "encode_frame",
    "memory_stream_pair",
    "open_link",
    "parse_url",
    "peer_address",
    "peer_name",
    "read_backoff_table",
    "servers_of",
    "serve_metrics",
    "read_listener_tls_table",
    "read_tls_table",
    "start_server",
    "validate_compression",
    "write_through_of",
]
