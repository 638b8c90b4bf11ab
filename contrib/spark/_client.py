"""How Spark's Python processes reach a node: blocking calls over the meshbus transport.

The data source's methods run in processes Spark starts (the planner of a streaming
query, the Python workers of each executor, on whichever machine the executor runs).
Each reaches a node like any client does, over ``tcp://`` or ``tls://`` with the VPN's
credentials, and calls the node's ``spark`` service (:meth:`RemoteSession.call`).

Spark's processes are synchronous and reused for many tasks, so a process keeps one
event loop in a background thread and one logged-in session per node and role,
opened on first use and kept until the process ends: a task does not pay for a TLS
handshake and a login.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
from contextlib import AbstractContextManager
from typing import Any

import attrs
from anyio.from_thread import BlockingPortal, start_blocking_portal

from meshbus.errors import AuthenticationError, MeshbusError, TransportError

from ._errors import BridgeUnavailableError
from ._wire import raise_error

__all__ = ["SERVICE", "NodeClient", "NodeTarget"]

#: The name of the service a :class:`SparkBridge` provides on its node.
SERVICE = "spark"


@attrs.frozen
class NodeTarget:
    """Where and as whom Spark's processes connect: URLs in connect order, the VPN,
    credentials and TLS files (paths as seen on each machine that connects)."""

    urls: tuple[str, ...]
    vpn: str = "default"
    username: str = "default"
    password: str | None = attrs.field(default=None, repr=False)
    tls_ca: str | None = None
    tls_certificate: str | None = None
    tls_private_key: str | None = None

    def describe(self) -> str:
        return ", ".join(self.urls)

    def connect_settings(self, client_name: str) -> dict[str, Any]:
        from meshbus.transports import TlsSettings

        tls = None
        if self.tls_ca or self.tls_certificate:
            tls = TlsSettings(
                ca=self.tls_ca, certificate=self.tls_certificate, private_key=self.tls_private_key
            )
        return {
            "vpn": self.vpn,
            "username": self.username,
            "password": self.password,
            "client_name": client_name,
            "tls": tls,
            # A lost connection fails the call: Spark retries the task, which connects
            # again; a session reconnecting by itself would replay calls behind its back.
            "reconnect": False,
        }


class _Process:
    """This process's event loop thread and its sessions, one per target and role."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.portal: BlockingPortal | None = None
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self.sessions: dict[tuple[NodeTarget, str], tuple[Any, AbstractContextManager[Any]]] = {}
        self.pid = os.getpid()

    def session(self, target: NodeTarget, role: str) -> Any:
        with self.lock:
            if self.pid != os.getpid():  # forked: the parent's thread is not ours
                self.__init__()  # type: ignore[misc]
            found = self.sessions.get((target, role))
            if found is not None and found[0].connected:
                return found[0]
            if found is not None:
                self._close_one(found[1])
            if self.portal is None:
                self._portal_cm = start_blocking_portal()
                self.portal = self._portal_cm.__enter__()
            # Made in the loop's thread: a session belongs to the loop that runs it.
            remote = self.portal.call(_connect, target, role)
            session_cm = self.portal.wrap_async_context_manager(remote)
            session = session_cm.__enter__()
            self.sessions[(target, role)] = (session, session_cm)
            return session

    def forget(self, target: NodeTarget, role: str) -> None:
        with self.lock:
            found = self.sessions.pop((target, role), None)
            if found is not None:
                self._close_one(found[1])

    @staticmethod
    def _close_one(session_cm: AbstractContextManager[Any]) -> None:
        with contextlib.suppress(Exception):  # a broken session is being dropped anyway
            session_cm.__exit__(None, None, None)

    def close(self) -> None:
        with self.lock:
            for _, session_cm in self.sessions.values():
                self._close_one(session_cm)
            self.sessions.clear()
            if self._portal_cm is not None:
                self._portal_cm.__exit__(None, None, None)
                self._portal_cm = self.portal = None


def _connect(target: NodeTarget, role: str) -> Any:
    from meshbus.transports import connect

    name = f"spark-{role}-{socket.gethostname()}-{os.getpid()}"
    return connect(*target.urls, **target.connect_settings(name))


_PROCESS = _Process()
atexit.register(_PROCESS.close)


class NodeClient:
    """Blocking calls of a node's ``spark`` service for one role of the data source
    (``planner``, ``reader``, ``writer``); picklable, it connects on first use."""

    def __init__(self, target: NodeTarget, role: str) -> None:
        self.target = target
        self.role = role

    def request(self, op: str, body: bytes = b"", **fields: Any) -> tuple[dict[str, Any], Any]:
        """Call ``op`` with ``fields`` and ``body``; return the answer's fields and body.

        :raises BridgeUnavailableError: the node cannot be reached from this machine
            (the message names the URLs and the machine).
        :raises AuthenticationError: the node refused the login.
        """
        session = self._session()
        assert _PROCESS.portal is not None
        try:
            header, answer = _PROCESS.portal.call(session.call, SERVICE, {"op": op, **fields}, body)
        except TransportError as exc:
            _PROCESS.forget(self.target, self.role)
            raise BridgeUnavailableError(
                f"the meshbus node at {self.target.describe()} went away during {op!r}: {exc}"
            ) from None
        except MeshbusError as exc:
            if "provides no service" in str(exc):
                raise BridgeUnavailableError(
                    f"the meshbus node at {self.target.describe()} serves no Spark connector: "
                    "register meshbus.contrib.spark.SparkBridge on it, or add 'spark' to the "
                    "plugins of its configuration file"
                ) from None
            raise
        raise_error(header)
        return header, answer

    def _session(self) -> Any:
        try:
            return _PROCESS.session(self.target, self.role)
        except AuthenticationError as exc:
            raise AuthenticationError(
                self.target.username,
                f"the meshbus node at {self.target.describe()} refused the login of "
                f"{self.target.username!r} to VPN {self.target.vpn!r}: {exc.why}",
            ) from None
        except (TransportError, OSError) as exc:
            if "certificate" in str(exc):
                hint = (
                    "the node's certificate must be signed by the CA in the 'tlsCa' option "
                    "and name the host of the 'address' option"
                )
            else:
                hint = (
                    "the address must be one this machine can connect to: give the node's "
                    "reachable (advertised) address in the 'address' option"
                )
            raise BridgeUnavailableError(
                f"{socket.gethostname()} cannot reach the meshbus node at "
                f"{self.target.describe()}: {exc}; {hint}"
            ) from None

    def close(self) -> None:
        """Drop this process's session for this role (it reconnects on the next call)."""
        _PROCESS.forget(self.target, self.role)
