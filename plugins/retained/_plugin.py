"""The hooks of the ``retained`` plugin: one store per VPN, durable when the node is."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from meshbus import (
    ConfigContext,
    ConfigReader,
    ConfigSection,
    ConfigSections,
    Envelope,
    Link,
    LinkPipeline,
    Message,
    Node,
    PublishRejectedError,
    Session,
    StashKey,
    Subscription,
    Vpn,
    hookimpl,
)
from meshbus.abc import RetainedMessages

from ._durable import DurableRetained
from ._store import RetainedLimits, RetainedStore

__all__ = ["RetainedService"]

log = logging.getLogger("meshbus.retained")


class RetainedService(RetainedMessages):
    """A node's retained values: a :class:`RetainedStore` per VPN."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.stores: dict[str, RetainedStore] = {}
        self.limits: dict[str, RetainedLimits] = {}
        self.durable: DurableRetained | None = None
        self._loaded: dict[str, list[Message]] = {}

    def store(self, vpn: Vpn | str) -> RetainedStore:
        name = vpn if isinstance(vpn, str) else vpn.name
        store = self.stores.get(name)
        if store is None:
            store = self.stores[name] = RetainedStore(
                name, self.limits.get(name, RetainedLimits()), self.node.clock.time, self._changed
            )
            for message in self._loaded.pop(name, ()):
                store.restore(message)
        return store

    def _changed(self, vpn: str, topic: str, message: Message | None) -> None:
        if self.durable is not None:
            self.durable.changed(vpn, topic, message)

    # --- RetainedMessages -----------------------------------------------------------

    def check(self, vpn: Vpn, topic: str, size: int) -> None:
        self.store(vpn).check(topic, size)

    def keep(self, vpn: Vpn, message: Message) -> None:
        self.store(vpn).keep(message)

    async def flush(self) -> None:
        if self.durable is not None:
            await self.durable.flush()

    # --- subscriptions ---------------------------------------------------------------

    def subscribed(self, session: Session, subscription: Subscription) -> None:
        """Give a new subscription the values it matches, right after it took effect."""
        if subscription.is_shared or session.stash.get(OWN_RETAINED, False):
            return  # shared subscriptions get no retained values (as in MQTT)
        store = self.stores.get(session.vpn.name)
        if store is None or not len(store):
            return
        found = store.matching(subscription.filter)
        if session.no_local:
            found = [m for m in found if m.sender != session.client_name]
        deliver = session.deliver
        for message in found:
            deliver(message)
        store.delivered += len(found)


SERVICE: StashKey[RetainedService] = StashKey()
OWN_RETAINED: StashKey[bool] = StashKey()
"""Set ``True`` in ``session.stash`` for a session whose protocol hands out retained
values itself (an MQTT connection does, by each subscription's retain handling)."""


def service_of(node: Node) -> RetainedService:
    """The node's retained service; :class:`~meshbus.ConfigurationError` without it."""
    service = node.retained
    assert isinstance(service, RetainedService)
    return service


@hookimpl
def meshbus_configure(node: Node) -> None:
    service = RetainedService(node)
    node.stash[SERVICE] = service
    node.provide_retained(service)


@hookimpl
def meshbus_vpn_created(vpn: Vpn) -> None:
    vpn.node.stash[SERVICE].store(vpn)


@hookimpl
def meshbus_vpn_removed(vpn: Vpn) -> None:
    vpn.node.stash[SERVICE].stores.pop(vpn.name, None)


@hookimpl
def meshbus_subscription_added(session: Session, subscription: Subscription) -> None:
    session.node.stash[SERVICE].subscribed(session, subscription)


@hookimpl
def meshbus_lifespan(node: Node) -> AbstractAsyncContextManager[None]:
    return _running(node)


@asynccontextmanager
async def _running(node: Node) -> AsyncIterator[None]:
    service = node.stash[SERVICE]
    if node.data_dir is None:
        yield
        return
    durable = DurableRetained(node.data_dir / "retained.sqlite")
    loaded = await durable.load()
    for name, messages in loaded.items():
        store = service.stores.get(name)
        if store is None:
            service._loaded[name] = messages  # restored when the VPN is created
        else:
            for message in messages:
                store.restore(message)
    service.durable = durable
    await node.task_group.start(durable.run, name="meshbus retained writer")
    try:
        yield
    finally:
        service.durable = None
        await durable.flush()


@hookimpl(trylast=True)
def meshbus_link_pipeline(link: Link, pipeline: LinkPipeline) -> None:
    # A bridge carries retained values across as its mappings say (their
    # preserve_retained); what comes in still flagged is kept here too. Routing links
    # (DMR) only carry the flag: a node that saw a value pass would serve it stale.
    if link.kind not in ("bridge", "mqtt"):
        return
    service = link.vpn.node.stash[SERVICE]
    store = service.store(link.vpn)

    def keep_retained(envelope: Envelope) -> bool:
        message = envelope.message
        if message.options.retain:
            try:
                store.keep(message)
            except PublishRejectedError as exc:
                log.warning("link %s: %s", link.name, exc)
        return True

    pipeline.add_ingress("retained", keep_retained)


@hookimpl
def meshbus_vpn_statistics(vpn: Vpn) -> dict[str, Any] | None:
    store = vpn.node.stash[SERVICE].stores.get(vpn.name)
    if store is None:
        return None
    s = store.statistics()
    if not (s.topics or s.kept or s.cleared or s.refused):
        return None  # nothing retained here, ever: nothing to show
    return {
        "retained": {
            "topics": s.topics,
            "bytes": s.size,
            "kept": s.kept,
            "cleared": s.cleared,
            "refused": s.refused,
            "delivered": s.delivered,
        }
    }


def configure_retained(vpn: Vpn, limits: RetainedLimits) -> None:
    """Set the limits of ``vpn``'s retained values (values kept already stay)."""
    service = service_of(vpn.node)
    service.limits[vpn.name] = limits
    service.store(vpn).limits = limits


def _read_limits(
    reader: ConfigReader, raw: object, path: str, context: ConfigContext
) -> RetainedLimits | None:
    if not isinstance(raw, dict):
        reader.report(path, "must be a table (max_topics, max_bytes)")
        return None
    return reader.attrs_value(RetainedLimits, raw, path)


def _configure_limits(vpn: Vpn, limits: RetainedLimits) -> None:
    configure_retained(vpn, limits)


SECTION = ConfigSection(
    "retained",
    "vpn",
    _read_limits,
    configure=_configure_limits,
    summary="limits of the VPN's retained values: max_topics, max_bytes",
)


@hookimpl
def meshbus_config_sections(sections: ConfigSections) -> None:
    sections.add(SECTION, plugin="retained")
