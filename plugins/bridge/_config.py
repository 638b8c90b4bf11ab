"""The plugin's table of the node configuration file (SPEC 7)::

    [[vpns.NAME.bridges]]
    name = "to-cloud"
    remotes = ["tcp://cloud-1:55555", "tcp://cloud-2:55555"]   # none: a VPN of this node
    remote_vpn = "default"
    username = "plant-7"
    password = "${ENV:BRIDGE_PASSWORD}"
    subscriptions = ["commands/>"]
    hop_count_limit = 1
    variables = { site = "plant-7" }

    [[vpns.NAME.bridges.topics]]
    filter = "machines/*/alarm"
    mode = "PUB"
    destination = "${site}/alarms/{2}"

Everything is checked with the rest of the file, mappings compiled (every problem
listed at its key); the bridges open once the node runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from meshbus import ConfigContext, ConfigReader, ConfigSection, ConfigurationError, Vpn

from ._bridge import BRIDGE, BridgeSettings, open_bridge
from ._mapping import TopicMapping, directions

__all__ = ["SECTIONS"]

_OWN = ("remotes", "variables", "topics")
_NOT_IN_FILE = ("tls", "backoff")


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
    allowed = [f.name for f in attrs.fields(BridgeSettings) if f.name not in _NOT_IN_FILE]
    if not reader.keys(table, where, allowed):
        table = {k: v for k, v in table.items() if k in allowed}
    extra: dict[str, Any] = {}
    remotes = table.get("remotes", [])
    extra["remotes"] = reader.value(remotes, tuple[str, ...], reader.join(where, "remotes"))
    variables = table.get("variables", {})
    variables_at = reader.join(where, "variables")
    found = reader.table(variables, variables_at)
    if found is not None:
        checked = {k: reader.value(v, str, reader.join(variables_at, k)) for k, v in found.items()}
        extra["variables"] = None if None in checked.values() else checked
    else:
        extra["variables"] = None
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
    settings = reader.attrs_value(
        BridgeSettings,
        {k: v for k, v in table.items() if k not in _OWN and k != "name"},
        where,
        name=name,
        exclude=_NOT_IN_FILE,
        extra=extra,
    )
    return settings if mapped else None


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
        summary="bridges from the VPN: the fields of BridgeSettings, mappings in [[...topics]]",
    ),
)
"""The tables this plugin reads."""
