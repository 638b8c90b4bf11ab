"""Byte streams under the link protocol: memory pairs, TCP and TLS, with errors mapped.

Everything here returns anyio byte streams, so the layers above do not care
which one they run on. Foreign exceptions (``OSError``, ``ssl.SSLError``,
anyio's stream errors) become :class:`~meshbus.TransportError` at this boundary.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.tls import TLSStream

from meshbus.errors import ConfigurationError, TransportError

from ._asyncio_tcp import adopt_tcp_stream
from ._settings import DEFAULT_PORT, DEFAULT_TLS_PORT, TlsSettings

__all__ = [
    "Address",
    "MemoryByteStream",
    "connect_stream",
    "map_exceptions",
    "memory_stream_pair",
    "parse_url",
    "set_nodelay",
]

Address = tuple[str, str, int]
"""``(scheme, host, port)`` with scheme ``"tcp"`` or ``"tls"``."""

_FOREIGN = (
    OSError,
    ssl.SSLError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


@contextlib.contextmanager
def map_exceptions(what: str) -> Iterator[None]:
    """Re-raise the stream errors of ``what`` as :class:`~meshbus.TransportError`."""
    try:
        yield
    except ssl.SSLCertVerificationError as exc:
        raise TransportError(f"{what}: certificate not trusted: {exc.verify_message}") from exc
    except ssl.SSLError as exc:
        raise TransportError(f"{what}: TLS failed: {exc.reason or exc}") from exc
    except anyio.EndOfStream as exc:
        raise TransportError(f"{what}: connection closed by the peer") from exc
    except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        cause = exc.__cause__
        raise TransportError(f"{what}: connection lost{f': {cause}' if cause else ''}") from exc
    except OSError as exc:
        raise TransportError(f"{what}: {exc.strerror or exc}") from exc


def parse_url(url: str) -> Address:
    """``tcp://host:port`` or ``tls://host:port`` as ``(scheme, host, port)``."""
    parts = urlsplit(url)
    if parts.scheme not in ("tcp", "tls") or not parts.hostname:
        raise ConfigurationError(f"expected tcp://HOST:PORT or tls://HOST:PORT, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"bad port in {url!r}") from None
    if port is None:
        port = DEFAULT_TLS_PORT if parts.scheme == "tls" else DEFAULT_PORT
    return parts.scheme, parts.hostname, port


def set_nodelay(stream: anyio.abc.AnyByteStream) -> None:
    """Switch off Nagle's algorithm: frames are small and latency matters."""
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if raw is not None and raw.family in (socket.AF_INET, socket.AF_INET6):
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def connect_stream(
    url: str, *, tls: TlsSettings | None = None, timeout: float = 10.0
) -> anyio.abc.ByteStream:
    """Open a TCP (``tcp://``) or TLS (``tls://``) byte stream to a node.

    :raises TransportError: the connection or the TLS handshake failed, or timed out.
    """
    scheme, host, port = parse_url(url)
    if scheme == "tls" and tls is None:
        tls = TlsSettings()
    context = tls.client_context() if scheme == "tls" and tls is not None else None
    with map_exceptions(f"connecting to {url}"):
        try:
            with anyio.fail_after(timeout):
                stream: anyio.abc.ByteStream = await anyio.connect_tcp(host, port)
                set_nodelay(stream)
                stream = adopt_tcp_stream(stream)
                if context is not None:
                    assert tls is not None
                    try:
                        stream = await TLSStream.wrap(
                            stream,
                            server_side=False,
                            hostname=tls.server_hostname or host,
                            ssl_context=context,
                            standard_compatible=False,
                        )
                    except BaseException:
                        await anyio.aclose_forcefully(stream)  # the socket, not left to gc
                        raise
        except TimeoutError:
            raise TransportError(f"connecting to {url}: timed out after {timeout} s") from None
    return stream


class MemoryByteStream(anyio.abc.ByteStream):
    """One end of an in-process byte stream pair (see :func:`memory_stream_pair`)."""

    def __init__(
        self,
        send: anyio.abc.ObjectSendStream[bytes],
        receive: anyio.abc.ObjectReceiveStream[bytes],
    ) -> None:
        self._send = send
        self._receive = receive
        self._pending = b""

    async def send(self, item: bytes) -> None:
        if item:
            await self._send.send(bytes(item))

    async def send_eof(self) -> None:
        await self._send.aclose()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        # A checkpoint either way, as anyio's own streams do: a reader of a long write
        # must not take its pieces one after another without letting others run.
        if self._pending:
            await anyio.lowlevel.checkpoint()
            data = self._pending
        else:
            data = await self._receive.receive()
        self._pending = data[max_bytes:]
        return data[:max_bytes]

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()

    @property
    def extra_attributes(self) -> Any:
        return {}


def memory_stream_pair(buffer: int = 64) -> tuple[MemoryByteStream, MemoryByteStream]:
    """Two connected in-process byte streams (for tests and same-process nodes).

    :param buffer: writes each direction holds before a writer waits.
    """
    a_send, b_receive = anyio.create_memory_object_stream[bytes](buffer)
    b_send, a_receive = anyio.create_memory_object_stream[bytes](buffer)
    return MemoryByteStream(a_send, a_receive), MemoryByteStream(b_send, b_receive)
