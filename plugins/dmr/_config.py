"""The plugin's table of the node configuration file (SPEC 8)::

    [node]
    name = "n1"
    cluster = "eu"                    # the node's cluster: dynamic routing needs one

    [dmr]
    peers = { n2 = "tcp://10.0.0.2:55555", n3 = "tcp://10.0.0.3:55555" }
    external = { us1 = { cluster = "us", url = "tls://us1.example:55443" } }  # gateways
    vpns = ["default"]
    username = "dmr"
    password = "${ENV:DMR_PASSWORD}"
    tls = { ca = "mesh-ca.pem" }      # for tls:// peers; paths relative to the file
    backoff = { initial = 0.5, maximum = 5.0, jitter = 0.2 }
    sync_timeout = 5.0

``peers`` are the other nodes of the cluster, by node name; ``external`` the gateway of
each other cluster this node (then a gateway) links to, at most one per cluster. Once
the node runs, routing starts, and ``meshbus run`` opens its listeners after the node
is in sync with the neighbours it can reach (or ``sync_timeout`` passed). A reload of
the file (SIGHUP) adds and removes peers while the node runs; any other change to the
table takes a restart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from meshbus import ConfigContext, ConfigReader, ConfigSection, ConfigurationError, Node
from meshbus.transports import Remote, read_backoff_table, read_tls_table

from ._dmr import dmr_of, start_dmr
from ._settings import DmrSettings, Peer

__all__ = ["SECTIONS"]

_OWN = ("peers", "external", "tls", "backoff")


def _read_url(reader: ConfigReader, raw: object, where: str) -> str | None:
    url = reader.value(raw, str, where)
    if url is None:
        return None
    try:
        Remote(url)  # checks the URL
    except ConfigurationError as exc:
        reader.report(where, str(exc))
        return None
    return url  # type: ignore[no-any-return]


def _read_peers(reader: ConfigReader, table: dict[str, Any], where: str) -> list[Peer] | None:
    peers: list[Peer] = []
    failed = False
    internal = reader.table(table.get("peers", {}), reader.join(where, "peers"))
    for name, raw in (internal or {}).items():
        at = reader.join(reader.join(where, "peers"), name)
        url = _read_url(reader, raw, at)
        if url is None:
            failed = True
            continue
        try:
            peers.append(Peer(name, url))
        except ConfigurationError as exc:
            reader.report(at, str(exc))
            failed = True
    external = reader.table(table.get("external", {}), reader.join(where, "external"))
    for name, raw in (external or {}).items():
        at = reader.join(reader.join(where, "external"), name)
        entry = reader.table(raw, at)
        if entry is None or not reader.keys(entry, at, ("cluster", "url")):
            failed = True
            continue
        url = _read_url(reader, entry.get("url"), reader.join(at, "url"))
        cluster = reader.value(entry.get("cluster"), str, reader.join(at, "cluster"))
        if url is None or cluster is None:
            failed = True
            continue
        try:
            peers.append(Peer(name, url, cluster=cluster))
        except ConfigurationError as exc:
            reader.report(at, str(exc))
            failed = True
    if internal is None or external is None or failed:
        return None
    return peers


def _read(
    reader: ConfigReader, raw: object, path: str, context: ConfigContext
) -> DmrSettings | None:
    table = reader.table(raw, path)
    if table is None:
        return None
    allowed = [f.name for f in attrs.fields(DmrSettings) if f.name != "peers"] + list(_OWN)
    if not reader.keys(table, path, allowed):
        table = {k: v for k, v in table.items() if k in allowed}
    peers = _read_peers(reader, table, path)
    extra: dict[str, Any] = {}
    failed = peers is None
    if "tls" in table:
        extra["tls"] = tls = read_tls_table(reader, table["tls"], reader.join(path, "tls"))
        failed = failed or tls is None
    if "backoff" in table:
        at = reader.join(path, "backoff")
        extra["backoff"] = backoff = read_backoff_table(reader, table["backoff"], at)
        failed = failed or backoff is None
    if failed:
        return None
    try:
        return reader.attrs_value(
            DmrSettings,
            {k: v for k, v in table.items() if k not in _OWN},
            path,
            exclude=("tls", "backoff"),
            extra={"peers": peers, **extra},
        )
    except ConfigurationError as exc:  # two external links to one cluster, say
        reader.report(path, str(exc))
        return None


def _configure(node: Node, settings: DmrSettings) -> None:
    settings.check(node.name, node.cluster)


async def _provision(node: Node, settings: DmrSettings) -> None:
    running = dmr_of(node)
    if running is not None:
        if running.settings != settings:
            raise ConfigurationError("dynamic routing runs already, with other settings")
        return
    await start_dmr(node, settings)


def _reload(
    node: Node, old: DmrSettings | None, new: DmrSettings | None
) -> Callable[[], Awaitable[None]]:
    """A reload of the file: peers added are dialled, peers removed are let go, a peer
    whose URL or cluster changed is both. Anything else takes a restart."""
    dmr = dmr_of(node)
    if old is None or new is None or dmr is None:
        why = "starting or stopping dynamic routing takes a restart of the node"
        raise ConfigurationError(why, [f"peers: {why}"])
    problems = [
        f"{field.name}: changed, and that takes a restart of the node"
        for field in attrs.fields(DmrSettings)
        if field.name != "peers" and getattr(old, field.name) != getattr(new, field.name)
    ]
    try:
        new.check(node.name, node.cluster)
    except ConfigurationError as exc:
        problems.append(f"peers: {exc}")
    if problems:
        raise ConfigurationError(f"{len(problems)} problems", problems)
    before = {peer.name: peer for peer in old.peers}
    after = {peer.name: peer for peer in new.peers}
    gone = [name for name, peer in before.items() if after.get(name) != peer]
    come = [peer for name, peer in after.items() if before.get(name) != peer]

    async def apply() -> None:
        for name in gone:
            await dmr.remove_peer(name, "removed from the configuration")
        for peer in come:
            dmr.add_peer(peer)

    return apply


SECTIONS = (
    ConfigSection(
        "dmr",
        "node",
        _read,
        configure=_configure,
        provision=_provision,
        reload=_reload,
        summary="dynamic routing: peers, external (gateways), vpns, username, tls, backoff",
    ),
)
"""The tables this plugin reads."""
