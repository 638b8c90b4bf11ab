"""The plugin's table of the node configuration file (SPEC 7)::

    [[vpns.NAME.bridges]]
    name = "to-cloud"
    remotes = ["tcp://cloud-1:55555", { url = "tls://cloud-2:55443", username = "plant-7b" }]
    # ... none: a VPN of this node; a table: a remote with its own username, password,
    # tls and compression
    remote_vpn = "default"
    username = "plant-7"
    password = "${ENV:BRIDGE_PASSWORD}"
    subscriptions = ["commands/>"]
    hop_count_limit = 1
    variables = { site = "plant-7" }
    fail_back_interval = 30.0
    tls = { ca = "cloud-ca.pem" }                 # for tls:// remotes; paths relative to the file
    backoff = { initial = 1.0, maximum = 120.0, jitter = 0.2 }

    # ... or to an MQTT broker: mqtt:// and mqtts:// remotes, and how to speak to it
    remotes = ["mqtt://broker-1:1883", { url = "mqtts://broker-2:8883", username = "edge" }]
    mqtt = { protocol = 5, client_id = "edge-7", qos = 1, keepalive = 60 }

    [[vpns.NAME.bridges.topics]]
    filter = "machines/*/alarm"
    mode = "PUB"
    destination = "${site}/alarms/{2}"

Everything is checked with the rest of the file, mappings compiled (every problem
listed at its key); the bridges open once the node runs. A reload of the file opens,
closes or changes them while the node runs (:mod:`._reload`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from meshbus import ConfigContext, ConfigReader, ConfigSection, ConfigurationError, Vpn
from meshbus.plugins.mqtt import MqttBridgeOptions, MqttRemote, is_mqtt_url
from meshbus.transports import Remote, read_backoff_table, read_tls_table, validate_compression

from ._bridge import BRIDGE, BridgeSettings, open_bridge
from ._mapping import TopicMapping, directions
from ._reload import reload_bridges

__all__ = ["SECTIONS"]

_OWN = ("remotes", "variables", "topics", "tls", "backoff", "mqtt")


def _read_remotes(reader: ConfigReader, raw: object, where: str) -> tuple[Any, ...] | None:
    """``remotes``: URLs, or tables of a ``url`` with its own ``username``, ``password``,
    ``tls`` and ``compression``."""
    if not isinstance(raw, list):
        reader.report(where, "expected an array of URLs or tables with a url")
        return None
    remotes: list[Any] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            url = reader.value(item, str, at)
            if url is not None:
                try:
                    MqttRemote(url) if is_mqtt_url(url) else Remote(url)  # checks the URL
                except ConfigurationError as exc:
                    reader.report(at, str(exc))
                    url = None
            remotes.append(url)
            continue
        if not reader.keys(
            item, at, ("url", "username", "password", "tls", "compression", "window")
        ):
            remotes.append(None)
            continue
        url = item.get("url")
        if not isinstance(url, str):
            reader.report(reader.join(at, "url"), "every remote table needs a url (a string)")
            remotes.append(None)
            continue
        values: dict[str, Any] = {}
        for key, hint in (
            ("username", str),
            ("password", str),
            ("compression", bool | str),
            ("window", int),
        ):
            if key in item:
                values[key] = reader.value(item[key], hint, reader.join(at, key))
        if "compression" in values:
            try:
                validate_compression(values["compression"])
            except ConfigurationError as exc:
                reader.report(reader.join(at, "compression"), str(exc))
                values["compression"] = None
        if "tls" in item:
            values["tls"] = read_tls_table(reader, item["tls"], reader.join(at, "tls"))
        if None in values.values():
            remotes.append(None)
            continue
        try:
            if is_mqtt_url(url):
                if "compression" in values or "window" in values:
                    raise ConfigurationError("an MQTT broker takes no compression or window")
                remotes.append(MqttRemote(url, **values))
            else:
                remotes.append(Remote(url, **values))
        except ConfigurationError as exc:
            reader.report(reader.join(at, "url"), str(exc))
            remotes.append(None)
    return None if None in remotes else tuple(remotes)


def _read_mapping(reader: ConfigReader, raw: object, where: str) -> TopicMapping | None:
    table = reader.table(raw, where)
    if table is None:
        return None
    topic_filter = table.get("filter")
    if not isinstance(topic_filter, str):
        reader.report(reader.join(where, "filter"), "every mapping needs a filter (a string)")
        return None
    rest = {k: v for k, v in table.items() if k != "filter"}
    return reader.attrs_value(TopicMapping, rest, where, name=topic_filter)


def _read_bridge(
    reader: ConfigReader, raw: object, where: str, names: set[str]
) -> BridgeSettings | None:
    table = reader.table(raw, where)
    if table is None:
        return None
    allowed = [f.name for f in attrs.fields(BridgeSettings)]
    if not reader.keys(table, where, allowed):
        table = {k: v for k, v in table.items() if k in allowed}
    extra: dict[str, Any] = {}
    extra["remotes"] = _read_remotes(
        reader, table.get("remotes", []), reader.join(where, "remotes")
    )
    variables = table.get("variables", {})
    variables_at = reader.join(where, "variables")
    found = reader.table(variables, variables_at)
    if found is not None:
        checked = {k: reader.value(v, str, reader.join(variables_at, k)) for k, v in found.items()}
        extra["variables"] = None if None in checked.values() else checked
    else:
        extra["variables"] = None
    failed = False  # a table read with problems (reported at its keys)
    if "tls" in table:
        extra["tls"] = tls = read_tls_table(reader, table["tls"], reader.join(where, "tls"))
        failed = tls is None
    if "backoff" in table:
        at = reader.join(where, "backoff")
        extra["backoff"] = backoff = read_backoff_table(reader, table["backoff"], at)
        failed = failed or backoff is None
    if "mqtt" in table:
        at = reader.join(where, "mqtt")
        found = reader.table(table["mqtt"], at)
        options = None if found is None else reader.attrs_value(MqttBridgeOptions, found, at)
        extra["mqtt"] = options
        failed = failed or options is None
    topics = table.get("topics", [])
    topics_at = reader.join(where, "topics")
    if isinstance(topics, list):
        mappings = [_read_mapping(reader, t, f"{topics_at}[{i}]") for i, t in enumerate(topics)]
        extra["topics"] = None if None in mappings else tuple(mappings)
    else:
        reader.report(topics_at, "expected an array of tables ([[...topics]])")
        extra["topics"] = None
    name = table.get("name")
    if not isinstance(name, str):
        reader.report(reader.join(where, "name"), "every bridge needs a name (a string)")
        return None
    if name in names:
        reader.report(reader.join(where, "name"), f"another bridge is called {name!r}")
        return None
    names.add(name)
    mapped = True
    if extra["topics"] is not None and extra["variables"] is not None:
        try:
            directions(extra["topics"], {**extra["variables"], "bridge.name": name})
        except ConfigurationError as exc:
            mapped = False
            for problem in exc.problems:
                reader.report(topics_at, problem)
    for key in ("tls", "backoff", "mqtt"):
        if extra.get(key, 0) is None:
            del extra[key]  # reported already: read the rest for their problems
    settings = reader.attrs_value(
        BridgeSettings,
        {k: v for k, v in table.items() if k not in _OWN and k != "name"},
        where,
        name=name,
        exclude=("tls", "backoff", "mqtt"),
        extra=extra,
    )
    return settings if mapped and not failed else None


def _read_bridges(
    reader: ConfigReader, raw: object, path: str, context: ConfigContext
) -> tuple[BridgeSettings, ...] | None:
    if not isinstance(raw, list):
        reader.report(path, "expected an array of tables ([[vpns.NAME.bridges]])")
        return None
    names: set[str] = set()
    read = [_read_bridge(reader, each, f"{path}[{i}]", names) for i, each in enumerate(raw)]
    if None in read:
        return None
    return tuple(b for b in read if b is not None)


async def _provision(vpn: Vpn, settings: Sequence[BridgeSettings]) -> None:
    problems = []
    for each in settings:
        link = vpn.links.get(f"bridge/{each.name}")
        running = None if link is None else link.stash.get(BRIDGE, None)
        if running is not None and running.settings == each:
            continue  # provisioned before: nothing changes
        try:
            open_bridge(vpn, each)
        except ConfigurationError as exc:
            problems.append(f"{each.name}: {exc}")
    if problems:
        raise ConfigurationError(f"{len(problems)} bridges refused", problems)


SECTIONS = (
    ConfigSection(
        "bridges",
        "vpn",
        _read_bridges,
        provision=_provision,
        reload=reload_bridges,
        summary="bridges from the VPN: the fields of BridgeSettings, mappings in [[...topics]]",
    ),
)
"""The tables this plugin reads."""
