"""The hooks of the ``mqtt`` plugin: listeners from the configuration file, sessions
that end with the node, and statistics."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import attrs

from meshbus import (
    ConfigContext,
    ConfigReader,
    ConfigSection,
    ConfigSections,
    ConfigurationError,
    Node,
    Vpn,
    hookimpl,
)
from meshbus.transports import DEFAULT_PORT, DEFAULT_TLS_PORT, read_listener_tls_table

from ._listener import (
    LISTENERS,
    REGISTRY,
    MqttListener,
    close_mqtt_listener,
    start_mqtt_listener,
)
from ._sessions import SessionRegistry
from ._settings import (
    DEFAULT_MQTT_PORT,
    DEFAULT_MQTTS_PORT,
    DEFAULT_WS_PORT,
    DEFAULT_WSS_PORT,
    MqttListenerSettings,
)

__all__ = ["SECTION", "listeners_of"]


def listeners_of(node: Node) -> list[MqttListener]:
    """The MQTT listeners the node runs."""
    listeners: list[MqttListener] = node.stash.get(LISTENERS, [])
    return list(listeners)


@hookimpl
def meshbus_configure(node: Node) -> None:
    node.stash[REGISTRY] = SessionRegistry(node)


@hookimpl
def meshbus_lifespan(node: Node) -> AbstractAsyncContextManager[None]:
    return _running(node)


@asynccontextmanager
async def _running(node: Node) -> AsyncIterator[None]:
    await node.stash[REGISTRY].restore()
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            listeners: list[MqttListener] = node.stash.get(LISTENERS, [])
            for listener in reversed(listeners):
                await listener.aclose()
            node.stash[LISTENERS] = []
            await node.stash[REGISTRY].close()


@hookimpl
def meshbus_listening(node: Node) -> list[str] | None:
    return [listener.url for listener in listeners_of(node)] or None


@hookimpl
def meshbus_vpn_removed(vpn: Vpn) -> None:
    registry = vpn.node.stash.get(REGISTRY, None)
    # Not when the node stops (vpn.removed is not set then): its sessions are kept.
    if registry is not None and vpn.removed:
        registry.vpn_removed(vpn.name)


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
            "waiting_wills": sum(1 for s in sessions if s.will is not None and not s.connection),
            "delayed_wills": registry.delayed_wills,
            # Share groups: each a meshbus shared subscription, or a queue ("queued").
            "share_groups": sum(1 for vpn_name, _ in registry.shares if vpn_name == vpn.name),
            "queued_share_groups": sum(
                1
                for (vpn_name, _), group in registry.shares.items()
                if vpn_name == vpn.name and group.queue is not None
            ),
        }
    }


def _read(
    reader: ConfigReader, raw: object, path: str, context: ConfigContext
) -> tuple[MqttListenerSettings, ...] | None:
    table = reader.table(raw, path)
    if table is None:
        return None
    failed = not reader.keys(table, path, ("listeners",))  # reported; read on for the rest
    items = table.get("listeners", [])
    where = reader.join(path, "listeners")
    if not isinstance(items, list):
        reader.report(where, "expected an array of tables ([[mqtt.listeners]])")
        return None
    taken = _node_ports(context.parent.get("listeners"))
    built: list[MqttListenerSettings] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        entry = reader.table(item, at)
        if entry is None:
            failed = True
            continue
        extra: dict[str, Any] = {}
        defaults: dict[str, Any] = {}
        websocket = entry.get("websocket") is True
        defaults["port"] = DEFAULT_WS_PORT if websocket else DEFAULT_MQTT_PORT
        if "tls" in entry:
            extra["tls"] = tls = read_listener_tls_table(
                reader, entry["tls"], reader.join(at, "tls")
            )
            defaults["port"] = DEFAULT_WSS_PORT if websocket else DEFAULT_MQTTS_PORT
            failed = failed or tls is None
        settings = reader.attrs_value(
            MqttListenerSettings, entry, at, extra=extra, defaults=defaults
        )
        if settings is None:
            failed = True
            continue
        clash = _clash(settings, [(b.host, b.port, "an MQTT listener") for b in built] + taken)
        if clash is not None:
            reader.report(reader.join(at, "port"), clash)
            failed = True
        built.append(settings)
    return None if failed else tuple(built)


_ANY_HOST = ("0.0.0.0", "::", "")


def _node_ports(raw: object) -> list[tuple[str, int, str]]:
    """Where the node's own listeners listen (as the file gives them)."""
    if raw is None:
        return [("127.0.0.1", DEFAULT_PORT, "the node's listener")]
    found = []
    for each in raw if isinstance(raw, list) else []:
        if isinstance(each, dict):
            port = each.get("port", DEFAULT_TLS_PORT if "tls" in each else DEFAULT_PORT)
            host = each.get("host", "127.0.0.1")
            if isinstance(port, int) and isinstance(host, str):
                found.append((host, port, "a node listener"))
    return found


def _clash(settings: MqttListenerSettings, others: list[tuple[str, int, str]]) -> str | None:
    """Why ``settings`` cannot listen beside ``others``: the same port on the same host,
    or on hosts that overlap (an address and a wildcard), or ``None``."""
    if not settings.port:
        return None  # a free port each: never the same
    for host, port, what in others:
        if _overlap(settings, host, port):
            return f"{settings.host}:{settings.port} is used twice ({what} listens there too)"
    return None


def _overlap(settings: MqttListenerSettings, host: str, port: int) -> bool:
    """Whether ``settings`` listens where ``host:port`` is: the same port on the same
    host, or on hosts that overlap (an address and a wildcard)."""
    if port != settings.port:
        return False
    return host == settings.host or host in _ANY_HOST or settings.host in _ANY_HOST


def _configure(node: Node, settings: tuple[MqttListenerSettings, ...]) -> None:
    known = set(node.vpns)
    for each in settings:
        if each.vpn not in known:
            raise ConfigurationError(
                f"an MQTT listener names VPN {each.vpn!r}, which is not configured",
                [f"listeners: no VPN named {each.vpn!r}"],
            )


async def _provision(node: Node, settings: tuple[MqttListenerSettings, ...]) -> None:
    for each in settings:
        await start_mqtt_listener(node, each)


def _reload(
    node: Node,
    old: tuple[MqttListenerSettings, ...] | None,
    new: tuple[MqttListenerSettings, ...] | None,
) -> Callable[[], Awaitable[None]]:
    """A reload of the file: listeners the file no longer has close (each MQTT 5
    client is told why; persistent sessions stay, for the clients to come back to
    another listener), new ones open, and a listener whose settings changed does
    both. Listeners opened through the API are left alone. Checked first: the VPNs
    exist, and a new listener's port is free (or freed by a listener that closes)."""
    after = list(new or ())
    gone, come = _minus(list(old or ()), after), _minus(after, list(old or ()))
    running = listeners_of(node)
    closing: list[MqttListener] = []
    for settings in gone:
        match = next((x for x in running if x.settings == settings and x not in closing), None)
        if match is not None:
            closing.append(match)
    problems = []
    unchecked = list(come)
    for i, settings in enumerate(after):
        if settings not in unchecked:
            continue
        unchecked.remove(settings)
        where = f"listeners[{i}]"
        if settings.vpn not in node.vpns:
            problems.append(f"{where}: no VPN named {settings.vpn!r}")
        freed = any(_overlap(x.settings, settings.host, settings.port) for x in closing)
        if settings.port and not freed:
            why = _bind_problem(settings.host, settings.port)
            if why is not None:
                problems.append(f"{where}.port: {settings.host}:{settings.port}: {why}")
    if problems:
        raise ConfigurationError(f"{len(problems)} problems", problems)

    async def apply() -> None:
        for listener in closing:
            await close_mqtt_listener(node, listener)
        for settings in come:
            await start_mqtt_listener(node, settings)

    return apply


def _minus(
    items: list[MqttListenerSettings], others: list[MqttListenerSettings]
) -> list[MqttListenerSettings]:
    """``items`` without ``others``, counted one by one (two equal listeners are two)."""
    left = list(others)
    kept = []
    for each in items:
        if each in left:
            left.remove(each)
        else:
            kept.append(each)
    return kept


def _bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (tried, then let go), or ``None``."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


SECTION = ConfigSection(
    "mqtt",
    "node",
    _read,
    configure=_configure,
    provision=_provision,
    reload=_reload,
    summary="MQTT listeners: [[mqtt.listeners]] with host, port, vpn, tls, websocket and limits",
)


@hookimpl
def meshbus_config_sections(sections: ConfigSections) -> None:
    sections.add(SECTION, plugin="mqtt")
