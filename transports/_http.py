"""A minimal HTTP/1.1 server for GET requests: what the metrics endpoint answers with.

It serves a fixed table of paths, each answered by a plain function (no await), so
an answer is computed in the node's event loop between two of its other tasks and
nothing reads the node's objects from another thread. It is meant to face
scrapers and probes, but takes whatever the network sends without harm:

* a request head (request line and headers) of at most ``max_request_size`` bytes,
  else ``431``; a malformed one gets ``400``; a body is never read;
* the request read and answered within ``request_timeout`` seconds of the node's
  clock, else the connection is closed without an answer;
* at most ``max_connections`` connections at once: more are closed as soon as they
  are accepted;
* only ``GET``: ``405`` (with ``Allow: GET``) for any other method on a known path,
  ``404`` for an unknown path;
* one answer per connection (``Connection: close``), then the connection closes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import attrs

if TYPE_CHECKING:
    from meshbus.abc import Clock

__all__ = ["HttpRequest", "HttpResponse", "HttpServer"]

log = logging.getLogger("meshbus.transports.http")

_END_OF_HEAD = b"\r\n\r\n"
_LINGER_BYTES = 1024 * 1024  # read and dropped after an early answer, at most
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_STREAM_ERRORS = (
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    OSError,
)


@attrs.frozen
class HttpRequest:
    """One GET request, as a route's function sees it."""

    path: str
    """The path of the request target, without its query."""
    query: str
    """What follows ``?`` in the target (empty without one)."""
    headers: Mapping[str, str]
    """Header fields by lower-case name (the last of repeated ones)."""


@attrs.frozen
class HttpResponse:
    """What a route answers: a status, a body and its content type."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Route = Callable[[HttpRequest], HttpResponse]


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, why: str, headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(why)
        self.status = status
        self.why = why
        self.headers = headers


class HttpServer:
    """Answers GET requests for the paths of ``routes`` on the streams given to :meth:`serve`.

    :param clock: what ``request_timeout`` is measured on (the node's clock).
    """

    def __init__(
        self,
        routes: Mapping[str, Route],
        clock: Clock,
        *,
        request_timeout: float,
        max_request_size: int,
        max_connections: int,
    ) -> None:
        self.routes = dict(routes)
        self.clock = clock
        self.request_timeout = request_timeout
        self.max_request_size = max_request_size
        self.max_connections = max_connections
        #: Connections open now.
        self.open = 0
        #: Requests answered, by status code.
        self.answered: dict[int, int] = {}
        #: Connections closed without an answer: timed out, or gone before a whole head.
        self.dropped = 0
        #: Connections closed as soon as accepted, because ``max_connections`` were open.
        self.turned_away = 0

    async def serve(self, stream: anyio.abc.ByteStream) -> None:
        """Answer one request on ``stream``, then close it."""
        if self.open >= self.max_connections:
            self.turned_away += 1
            await anyio.aclose_forcefully(stream)
            return
        self.open += 1
        answered = False
        try:
            with self.clock.move_on_after(self.request_timeout):
                try:
                    rest = await self._exchange(stream)
                    answered = True
                    if rest:  # the peer may still be sending: let it see the answer
                        await self._linger(stream)
                except _STREAM_ERRORS:
                    pass
        finally:
            self.open -= 1
            if not answered:
                self.dropped += 1
            await anyio.aclose_forcefully(stream)

    async def _exchange(self, stream: anyio.abc.ByteStream) -> bool:
        """Read one request head and write its answer; whether unread input may remain."""
        head, rest = await self._read_head(stream)
        if head is None:
            response = _error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request too large")
            rest = True
        else:
            try:
                request = self._parse(head)
                body_announced = (
                    "content-length" in request.headers or "transfer-encoding" in request.headers
                )
                rest = rest or body_announced
                response = self.routes[request.path](request)
            except _BadRequest as exc:
                response = _error(exc.status, exc.why, exc.headers)
        self.answered[response.status] = self.answered.get(response.status, 0) + 1
        await stream.send(_encode(response))
        return rest

    async def _read_head(self, stream: anyio.abc.ByteStream) -> tuple[bytes | None, bool]:
        """The request head (``None`` when it is too large) and whether more came after it.

        :raises anyio.EndOfStream: the peer stopped sending before a whole head.
        """
        buffer = bytearray()
        limit = self.max_request_size
        while True:
            chunk = await stream.receive(limit + 4 - len(buffer))
            start = max(0, len(buffer) - 3)
            buffer += chunk
            end = buffer.find(_END_OF_HEAD, start)
            if end >= 0 and end + 4 <= limit:
                return bytes(buffer[:end]), end + 4 < len(buffer)
            if len(buffer) >= limit:
                return None, True

    def _parse(self, head: bytes) -> HttpRequest:
        try:
            text = head.decode("ascii")
        except UnicodeDecodeError:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "request head is not ASCII") from None
        line, *fields = text.split("\r\n")
        parts = line.split(" ")
        if len(parts) != 3:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line")
        method, target, version = parts
        if not method or not set(method) <= _TOKEN:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed method")
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "only HTTP/1.0 and HTTP/1.1 are served")
        if not target.startswith("/"):
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "the target must be a path")
        headers: dict[str, str] = {}
        for field in fields:
            name, colon, value = field.partition(":")
            if not colon or not name or not set(name) <= _TOKEN:
                raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed header field")
            headers[name.lower()] = value.strip(" \t")
        path, _, query = target.partition("?")
        if path not in self.routes:
            raise _BadRequest(HTTPStatus.NOT_FOUND, f"no such path; try {', '.join(self.routes)}")
        if method != "GET":
            raise _BadRequest(
                HTTPStatus.METHOD_NOT_ALLOWED, "only GET is served", (("Allow", "GET"),)
            )
        return HttpRequest(path=path, query=query, headers=headers)

    async def _linger(self, stream: anyio.abc.ByteStream) -> None:
        """Half-close, then read and drop what the peer still sends (up to a bound), so
        that closing with unread input does not reset the connection before the peer
        has read the answer."""
        await stream.send_eof()
        dropped = 0
        while dropped < _LINGER_BYTES:
            dropped += len(await stream.receive())


def _error(status: HTTPStatus, why: str, headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    return HttpResponse(status=status, body=f"{status.phrase}: {why}\n".encode(), headers=headers)


def _encode(response: HttpResponse) -> bytes:
    status = HTTPStatus(response.status)
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Connection: close",
        "Cache-Control: no-store",
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + response.body
