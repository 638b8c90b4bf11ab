"""The hooks of the ``mqtt`` plugin: listeners from the configuration file, sessions
that end with the node, and statistics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import attrs

from meshbus import (
    ConfigContext,
    ConfigReader,
    ConfigSection,
    ConfigSections,
    Node,
    Vpn,
    hookimpl,
)
from meshbus.transports import read_listener_tls_table

from ._listener import LISTENERS, REGISTRY, MqttListener, start_mqtt_listener
from ._sessions import SessionRegistry
from ._settings import DEFAULT_MQTTS_PORT, MqttListenerSettings

__all__ = ["SECTION", "listeners_of"]


def listeners_of(node: Node) -> list[MqttListener]:
    """The MQTT listeners the node runs."""
    return list(node.stash.get(LISTENERS, []))


@hookimpl
def meshbus_configure(node: Node) -> None:
    node.stash[REGISTRY] = SessionRegistry(node)


@hookimpl
def meshbus_lifespan(node: Node) -> AbstractAsyncContextManager[None]:
    return _running(node)


@asynccontextmanager
async def _running(node: Node) -> AsyncIterator[None]:
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            for listener in reversed(node.stash.get(LISTENERS, [])):
                await listener.aclose()
            node.stash[LISTENERS] = []
            await node.stash[REGISTRY].close()


@hookimpl
def meshbus_vpn_statistics(vpn: Vpn) -> dict[str, Any] | None:
    listeners = [x for x in listeners_of(vpn.node) if x.settings.vpn == vpn.name]
    if not listeners:
        return None
    registry = vpn.node.stash[REGISTRY]
    sessions = [s for s in registry.sessions.values() if s.vpn == vpn.name]
    return {
        "mqtt": {
            "listeners": {x.url: attrs.asdict(x.statistics()) for x in listeners},
            "sessions": len(sessions),
            "offline_sessions": sum(1 for s in sessions if s.connection is None),
            "expired_sessions": registry.expired,
        }
    }


def _read(
    reader: ConfigReader, raw: object, path: str, context: ConfigContext
) -> tuple[MqttListenerSettings, ...] | None:
    table = reader.table(raw, path)
    if table is None or not reader.keys(table, path, ("listeners",)):
        return None
    items = table.get("listeners", [])
    where = reader.join(path, "listeners")
    if not isinstance(items, list):
        reader.report(where, "expected an array of tables ([[mqtt.listeners]])")
        return None
    built: list[MqttListenerSettings] = []
    failed = False
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        entry = reader.table(item, at)
        if entry is None:
            failed = True
            continue
        extra: dict[str, Any] = {}
        defaults: dict[str, Any] = {}
        if "tls" in entry:
            extra["tls"] = tls = read_listener_tls_table(
                reader, entry["tls"], reader.join(at, "tls")
            )
            defaults["port"] = DEFAULT_MQTTS_PORT
            failed = failed or tls is None
        settings = reader.attrs_value(
            MqttListenerSettings, entry, at, extra=extra, defaults=defaults
        )
        if settings is None:
            failed = True
            continue
        clash = next(
            (b for b in built if b.port and b.port == settings.port and b.host == settings.host),
            None,
        )
        if clash is not None:
            reader.report(reader.join(at, "port"), f"{settings.host}:{settings.port} is used twice")
            failed = True
        built.append(settings)
    return None if failed else tuple(built)


def _configure(node: Node, settings: tuple[MqttListenerSettings, ...]) -> None:
    known = set(node.vpns)
    for each in settings:
        if each.vpn not in known:
            from meshbus import ConfigurationError

            raise ConfigurationError(
                f"an MQTT listener names VPN {each.vpn!r}, which is not configured",
                [f"listeners: no VPN named {each.vpn!r}"],
            )


async def _provision(node: Node, settings: tuple[MqttListenerSettings, ...]) -> None:
    for each in settings:
        await start_mqtt_listener(node, each)


SECTION = ConfigSection(
    "mqtt",
    "node",
    _read,
    configure=_configure,
    provision=_provision,
    summary="MQTT listeners: [[mqtt.listeners]] with host, port, vpn, tls and limits",
)


@hookimpl
def meshbus_config_sections(sections: ConfigSections) -> None:
    sections.add(SECTION, plugin="mqtt")
