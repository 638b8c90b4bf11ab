"""The hooks of the ``guaranteed`` plugin: wiring the service into a node."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio

from meshbus import (
    ConfigSections,
    Node,
    Pipeline,
    PluginManager,
    Session,
    StashKey,
    Vpn,
    hookimpl,
)

from . import _hookspecs
from ._config import SECTIONS
from ._durability import DURABILITY
from ._memory import MemoryStore
from ._service import ROUTER, GuaranteedService
from ._sqlite import SqliteStore
from ._store import SpoolStore

log = logging.getLogger("meshbus.guaranteed")

SERVICE: StashKey[GuaranteedService] = StashKey()


@hookimpl
def meshbus_add_hookspecs(plugins: PluginManager) -> None:
    plugins.add_hookspecs(_hookspecs)


@hookimpl
def meshbus_config_sections(sections: ConfigSections) -> None:
    for section in SECTIONS:
        sections.add(section, plugin="guaranteed")


@hookimpl
def meshbus_configure(node: Node) -> None:
    service = GuaranteedService(node)
    node.stash[SERVICE] = service
    node.provide_guaranteed(service)


@hookimpl(trylast=True)
def meshbus_spool_store(node: Node) -> SpoolStore:
    """The embedded default: SQLite in the node's data directory, else memory."""
    if node.data_dir is None:
        log.info("node %r has no data_dir: guaranteed messages are kept in memory", node.name)
        return MemoryStore()
    node.data_dir.mkdir(parents=True, exist_ok=True)
    return SqliteStore(node.data_dir / "spool.sqlite", node.stash.get(DURABILITY, "full"))


@hookimpl
def meshbus_lifespan(node: Node) -> AbstractAsyncContextManager[None]:
    return _running(node)


@asynccontextmanager
async def _running(node: Node) -> AsyncIterator[None]:
    service = node.stash[SERVICE]
    store = node.plugins.hook.meshbus_spool_store(node=node)
    if not isinstance(store, SpoolStore):
        raise TypeError(f"meshbus_spool_store returned {store!r}, not a SpoolStore")
    async with store:
        service._store = store
        service._saved_subscriptions()  # read now: provisioning does no I/O (the API rule)
        await node.task_group.start(service.run, name="meshbus guaranteed spooler")
        await node.task_group.start(service.sweep_ttl, name="meshbus guaranteed TTL sweep")
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):  # commit acks even when cancelled
                await service.stop()
            service._store = None
            service._subscriptions_read = False


@hookimpl
def meshbus_vpn_pipeline(vpn: Vpn, pipeline: Pipeline) -> None:
    service = vpn.node.stash[SERVICE]
    # Off until a queue in this VPN has a subscription.
    pipeline.add_router(ROUTER, service.router_for(vpn), enabled=False)


@hookimpl
def meshbus_session_closed(session: Session) -> None:
    session.node.stash[SERVICE].session_closed(session)


@hookimpl
def meshbus_vpn_removed(vpn: Vpn) -> None:
    vpn.node.stash[SERVICE].vpn_removed(vpn)
