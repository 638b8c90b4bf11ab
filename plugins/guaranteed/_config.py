"""The plugin's tables of the node configuration file (SPEC 4)::

    [vpns.NAME.queues.QUEUE]              # keys: the fields of QueueSettings
    subscriptions = ["orders/>"]          # (subscriptions, access_type, max_messages, ...)
    [vpns.NAME.topic_endpoints.ENDPOINT]  # the same but subscriptions (given at bind)

Read through :func:`~meshbus.hookspecs.meshbus_config_sections` and created when the node
runs; a dead message queue must name a queue of the same VPN.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import attrs

from meshbus import (
    ConfigContext,
    ConfigReader,
    ConfigSection,
    ConfigurationError,
    StateError,
    Vpn,
)

from ._settings import QueueSettings

__all__ = ["SECTIONS"]


def _queue_names(table: object) -> set[str]:
    return set(table) if isinstance(table, dict) else set()


def _check_dmq(
    reader: ConfigReader, table: dict[str, Any], where: str, queues: Collection[str], vpn: str
) -> None:
    dmq = table.get("dead_message_queue")
    if isinstance(dmq, str) and dmq not in queues:
        reader.report(
            reader.join(where, "dead_message_queue"),
            f"no queue named {dmq!r} in VPN {vpn!r}{reader.suggest(dmq, queues)}",
        )


def _read_queues(
    reader: ConfigReader, raw: object, path: str, context: ConfigContext
) -> tuple[QueueSettings, ...] | None:
    names = _queue_names(raw)
    vpn = context.vpn or ""

    def queue(name: str, table: dict[str, Any], where: str) -> QueueSettings | None:
        _check_dmq(reader, table, where, names, vpn)
        return reader.attrs_value(QueueSettings, table, where, name=name)

    return _all_or_none(raw, reader.named_tables(raw, path, queue))


def _read_topic_endpoints(
    reader: ConfigReader, raw: object, path: str, context: ConfigContext
) -> tuple[QueueSettings, ...] | None:
    names = _queue_names(context.parent.get("queues"))
    vpn = context.vpn or ""

    def endpoint(name: str, table: dict[str, Any], where: str) -> QueueSettings | None:
        _check_dmq(reader, table, where, names, vpn)
        if "subscriptions" in table:
            reader.report(
                reader.join(where, "subscriptions"),
                "a topic endpoint takes no subscriptions: its consumer gives one at bind",
            )
            return None
        return reader.attrs_value(
            QueueSettings,
            table,
            where,
            name=name,
            exclude=("subscriptions",),
            # As GuaranteedService.create_topic_endpoint defaults it, as brokers do.
            defaults={"reject_msg_to_sender_on_discard": False},
        )

    return _all_or_none(raw, reader.named_tables(raw, path, endpoint))


def _all_or_none(raw: object, read: tuple[QueueSettings, ...]) -> tuple[QueueSettings, ...] | None:
    # Only whole tables are applied; what was left out was reported.
    return read if isinstance(raw, dict) and len(read) == len(raw) else None


async def _provision(vpn: Vpn, settings: Sequence[QueueSettings], kind: str) -> None:
    service: Any = vpn.node.guaranteed
    create = service.create_queue if kind == "queues" else service.create_topic_endpoint
    problems = []
    for each in settings:
        values = attrs.asdict(each, recurse=False)
        del values["name"]
        if kind != "queues":
            del values["subscriptions"]
        try:
            create(each.name, vpn=vpn.name, **values)
        except (ConfigurationError, StateError) as exc:
            problems.append(f"{each.name}: {exc}")
    if problems:
        raise ConfigurationError(f"{len(problems)} {kind} refused", problems)


async def _provision_queues(vpn: Vpn, settings: Sequence[QueueSettings]) -> None:
    await _provision(vpn, settings, "queues")


async def _provision_topic_endpoints(vpn: Vpn, settings: Sequence[QueueSettings]) -> None:
    await _provision(vpn, settings, "topic endpoints")


SECTIONS = (
    ConfigSection(
        "queues",
        "vpn",
        _read_queues,
        provision=_provision_queues,
        summary="queues of the VPN, by name: the fields of QueueSettings",
    ),
    ConfigSection(
        "topic_endpoints",
        "vpn",
        _read_topic_endpoints,
        provision=_provision_topic_endpoints,
        summary="topic endpoints of the VPN, by name: the fields of QueueSettings "
        "but subscriptions",
    ),
)
"""The tables this plugin reads."""
