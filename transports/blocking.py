"""Remote sessions for code without an event loop: :func:`meshbus.transports.connect`,
blocking.

:func:`connect` logs in to a node in another process and returns a
:class:`BlockingRemoteSession`, which runs the :class:`~meshbus.transports.RemoteSession`
on an event loop in a background thread of its own and has the methods of
:class:`meshbus.blocking.BlockingSession` (``publish``, ``publish_many``,
``subscribe``, ``receive``, ``send``, ``bind``, ...)::

    from meshbus.transports import blocking

    session = blocking.connect("tcp://broker:55555", username="app", password="...")
    try:
        session.publish_many([("orders/1", b"{}"), ("orders/2", b"{}")])
        session.confirm()  # the node's refusals, if any, are raised here
    finally:
        session.close()

It lives here rather than in :mod:`meshbus.blocking` because the core does not
import the transports.
"""

from __future__ import annotations

import functools
from types import TracebackType
from typing import Any

from meshbus._session import MessageHandler
from meshbus.blocking import BlockingSession, EventLoopThread

from ._client import RemoteSession
from ._dialing import ConnectSettings, Target
from ._session_calls import RemoteSessionStatistics

__all__ = ["BlockingRemoteSession", "connect"]


def connect(
    *targets: Target,
    backend: str = "asyncio",
    on_message: MessageHandler | None = None,
    **settings: Any,
) -> BlockingRemoteSession:
    """Log in to the node at ``targets`` (tried in order) and return the session.

    Takes the arguments of :func:`meshbus.transports.connect` (``vpn``,
    ``username``, ``password``, ``client_name``, ``tls``, ``reconnect``, ...), and
    ``backend`` (``"asyncio"`` or ``"trio"``) for the session's event loop. Close the
    session with :meth:`BlockingRemoteSession.close` (or use it with ``with``); one
    not closed is closed when the interpreter exits.

    ``on_message`` handlers run on the session's thread, not the caller's.

    :raises AuthenticationError: the node refused the login.
    :raises TransportError: the node could not be reached.
    :raises ConfigurationError: a setting is invalid.
    :raises TypeError: a setting :class:`~meshbus.transports.ConnectSettings` does not have.
    """
    checked = ConnectSettings(targets, **settings)  # fails here, before a thread starts
    loop = EventLoopThread(backend, name="meshbus-remote-session")
    try:
        session = loop.call(functools.partial(RemoteSession, checked, on_message=on_message))
        loop.enter(session)
    except BaseException:
        loop.stop()
        raise
    loop.stopped_message = f"remote session {session.client_name!r} is closed"
    return BlockingRemoteSession(loop, session)


class BlockingRemoteSession(BlockingSession[RemoteSession]):
    """Blocking view of a :class:`~meshbus.transports.RemoteSession`, on an event loop
    of its own (from :func:`connect`).

    Besides the methods of :class:`meshbus.blocking.BlockingSession` it has those
    a remote session adds (:meth:`flush`, :meth:`call`, :meth:`node_statistics`).
    Calls after :meth:`close` raise :class:`~meshbus.errors.StateError`.
    """

    @property
    def url(self) -> str:
        """The node's target the session is (or was last) connected to."""
        return self.session.url

    @property
    def connected(self) -> bool:
        """Whether it is connected now (it reconnects by itself after a loss)."""
        return self.session.connected

    def close(self) -> None:
        """Write what is buffered, log out, close and end the session's thread. Idempotent."""
        self.loop.stop()

    def __enter__(self) -> BlockingRemoteSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def flush(self) -> None:
        """Wait until everything buffered so far has been written to the connection."""
        self.loop.call(self.session.flush)

    def call(
        self, service: str, args: dict[str, Any] | None = None, body: bytes = b""
    ) -> tuple[dict[str, Any], bytes]:
        """Call a service a plugin on the node provides (see
        :meth:`meshbus.transports.RemoteSession.call`); the answer's fields and body."""
        answer: tuple[dict[str, Any], bytes] = self.loop.call(
            self.session.call, service, args, body
        )
        return answer

    def node_statistics(self) -> dict[str, Any]:
        """The node's statistics as ``meshbus stats`` prints them (a round trip)."""
        return self.loop.call(self.session.node_statistics)

    def statistics(self) -> RemoteSessionStatistics:
        """A snapshot of the session's own counters, as the client counts them."""
        return self.loop.call(self.session.statistics)
