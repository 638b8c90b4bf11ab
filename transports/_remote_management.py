"""The management API of a node, from a remote session (``RemoteSession.call``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshbus.errors import ProtocolError

from ._management import DEFAULT_LIMIT, MANAGEMENT_SERVICE

if TYPE_CHECKING:
    from ._client import RemoteSession

__all__ = ["RemoteManagement"]


class RemoteManagement:
    """The views and queue administration of :class:`Management`, over a remote
    session whose username has the management role::

        async with connect(url, vpn="shop", username="ops", password=secret) as session:
            manage = RemoteManagement(session)
            for row in (await manage.connections())["connections"]:
                print(row["client_name"], row["address"])
            await manage.purge_queue("orders")

    Each method answers what the in-process method of the same name returns. The
    views cover every VPN; the queue actions act in the session's own VPN.

    :raises AccessDeniedError: (from each call) the username lacks the management
        role, or an action names another VPN than the session's.
    """

    def __init__(self, session: RemoteSession) -> None:
        self.session = session

    async def _call(self, op: str, **args: Any) -> dict[str, Any]:
        result, _ = await self.session.call(MANAGEMENT_SERVICE, {"op": op, **args})
        answer = result.get("result")
        if not isinstance(answer, dict):
            raise ProtocolError(f"the management answer to {op!r} is malformed")
        return answer

    # --- views ----------------------------------------------------------------------------

    async def node(self) -> dict[str, Any]:
        """The node's identity, uptime, memory, CPU time, rates and totals."""
        return await self._call("node")

    async def connections(self, vpn: str | None = None) -> dict[str, Any]:
        """The open sessions of ``vpn`` (of every VPN for ``None``)."""
        return await self._call("connections", vpn=vpn)

    async def subscriptions(
        self,
        vpn: str | None = None,
        *,
        client: str | None = None,
        topic: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        """The sessions' subscriptions, filtered, at most ``limit`` of them."""
        return await self._call("subscriptions", vpn=vpn, client=client, topic=topic, limit=limit)

    async def queues(self, vpn: str | None = None) -> dict[str, Any]:
        """The statistics of the queues and topic endpoints of ``vpn`` (every VPN)."""
        return await self._call("queues", vpn=vpn)

    async def links(self, vpn: str | None = None) -> dict[str, Any]:
        """The links of ``vpn`` (every VPN) and the DMR routing figures."""
        return await self._call("links", vpn=vpn)

    async def listeners(self) -> dict[str, Any]:
        """The node's listeners and their counters."""
        return await self._call("listeners")

    # --- queue administration (in the session's VPN) -------------------------------------

    async def create_queue(self, name: str, **settings: Any) -> dict[str, Any]:
        """Provision a queue with ``settings`` (JSON values); its statistics."""
        return await self._call("create_queue", name=name, settings=settings)

    async def delete_queue(self, name: str) -> dict[str, Any]:
        """Delete a queue, its messages and its flows."""
        return await self._call("delete_queue", name=name)

    async def purge_queue(self, name: str) -> dict[str, Any]:
        """Delete every message of a queue; ``purged``: how many."""
        return await self._call("purge_queue", name=name)

    async def enable_queue(
        self, name: str, *, ingress: bool | None = None, egress: bool | None = None
    ) -> dict[str, Any]:
        """Switch a queue's ingress and egress on or off; its statistics."""
        return await self._call("enable_queue", name=name, ingress=ingress, egress=egress)
