"""Calls of services that plugins provide, served on one remote session's connection.

A plugin registers a service with :meth:`meshbus.Node.provide_service`; a remote
client calls it with :meth:`meshbus.transports.RemoteSession.call`. The call travels
as a REQUEST frame (``what: "call"``, the service's name, its ``args`` and a binary
body) and is answered by OK with the handler's result and body, or by ERROR.

Each call runs as its own task, so a slow one (a service that waits, or works in a
thread) holds up neither the connection's reader nor its other calls; at most
:data:`MAX_CALLS` run at once per connection, and the reader waits for a free slot
beyond that, as it does for pipelined sends.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from meshbus.errors import MeshbusError, ProtocolError, StateError

from . import _events as ev

if TYPE_CHECKING:
    from meshbus._session import Session

    from ._answering import Answers
    from ._connection import Connection

__all__ = ["MAX_CALLS", "ServedCalls"]

log = logging.getLogger("meshbus.transports")

#: Service calls one connection may have running at once.
MAX_CALLS = 16


class ServedCalls:
    """The service calls of one connection: each in its task, at most ``MAX_CALLS``."""

    def __init__(self, connection: Connection, session: Session, answers: Answers) -> None:
        self.connection = connection
        self.session = session
        self.answers = answers
        self._slots = anyio.Semaphore(MAX_CALLS)

    async def start(self, event: ev.Request, body: bytes, task_group: anyio.abc.TaskGroup) -> None:
        """Check the call's frame and run it in ``task_group`` (waits for a free slot).

        :raises ProtocolError: the frame does not name a service or its args are not
            an object (this ends the connection, as other malformed frames do).
        """
        if type(event.service) is not str or not event.service:
            raise ProtocolError("a call REQUEST needs a 'service' name")
        args = {} if event.args is None else event.args
        if type(args) is not dict:
            raise ProtocolError("a call REQUEST's 'args' must be an object")
        await self._slots.acquire()
        task_group.start_soon(self._run, event.id, event.service, args, body)

    async def _run(self, request: int, service: str, args: dict[str, object], body: bytes) -> None:
        try:
            handler = self.session.vpn.node.find_service(service)
            if handler is None:
                raise StateError(f"this node provides no service {service!r}")
            try:
                result, answer = await handler(self.session, args, body)
            except (MeshbusError, TypeError, ValueError) as exc:
                self.answers.error(request, exc)
            except Exception as exc:  # a plugin's bug: the caller hears of it, the node goes on
                log.exception("service %r failed", service)
                self.answers.error(request, StateError(f"service {service!r} failed: {exc!r}"))
            else:
                self.answers.ok_with_body(request, result, answer)
        except StateError as exc:
            self.answers.error(request, exc)
        finally:
            self._slots.release()
        await self.connection.flush()
