"""The plugin's tables of the node configuration file (SPEC 4)::

    [spool]
    durability = "full"                   # or "relaxed": see ._durability
    [vpns.NAME.queues.QUEUE]              # keys: the fields of QueueSettings
    subscriptions = ["orders/>"]          # (subscriptions, access_type, max_messages, ...)
    [vpns.NAME.topic_endpoints.ENDPOINT]  # the same but subscriptions (given at bind)

Read through :func:`~meshbus.hookspecs.meshbus_config_sections` and created when the node
runs; a dead message queue must name a queue of the same VPN. A reload of the file
creates the endpoints it adds and changes queues' subscriptions.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Sequence
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

from ._durability import set_spool_durability
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


def _reload(
    vpn: Vpn,
    old: Sequence[QueueSettings] | None,
    new: Sequence[QueueSettings] | None,
    kind: str,
) -> Callable[[], Awaitable[None]]:
    """A reload of the file: endpoints it adds are created, a queue's subscriptions
    follow what the file added and removed. Any other change to an endpoint (its
    settings, or its removal: a reload never deletes one with its messages) takes a
    restart."""
    service: Any = vpn.node.guaranteed
    before = {each.name: each for each in old or ()}
    after = {each.name: each for each in new or ()}
    queues = kind == "queues"
    problems = [
        f"{name}: removed, and that takes a restart (a reload deletes no {kind[:-1]})"
        for name in before
        if name not in after
    ]
    steps: list[Callable[[], Awaitable[None]]] = []
    for name, settings in after.items():
        previous = before.get(name)
        if previous == settings:
            continue
        existing = service.find_queue(vpn.name, name if queues else "#te/" + name)
        if previous is None or existing is None:  # new, or deleted through the API
            if existing is not None and existing.settings != settings:
                problems.append(f"{name}: exists in the VPN with other settings")
            else:
                steps.append(functools.partial(_provision, vpn, [settings], kind))
        elif queues and attrs.evolve(previous, subscriptions=settings.subscriptions) == settings:
            steps.append(functools.partial(_resubscribe, vpn, previous, settings))
        else:
            what = "settings other than subscriptions" if queues else "settings"
            problems.append(f"{name}: {what} changed, and that takes a restart")
    if problems:
        raise ConfigurationError(f"{len(problems)} {kind} cannot change", problems)

    async def apply() -> None:
        for step in steps:
            await step()

    return apply


async def _resubscribe(vpn: Vpn, old: QueueSettings, new: QueueSettings) -> None:
    service: Any = vpn.node.guaranteed
    for subscription in new.subscriptions:
        if subscription not in old.subscriptions:
            service.add_subscription(new.name, subscription, vpn=vpn.name)
    for subscription in old.subscriptions:
        if subscription not in new.subscriptions:
            service.remove_subscription(new.name, subscription, vpn=vpn.name)


def _read_spool(reader: ConfigReader, raw: object, path: str, context: ConfigContext) -> Any:
    table = reader.table(raw, path)
    if table is None or not reader.keys(table, path, ("durability",)):
        return None
    durability = table.get("durability", "full")
    where = reader.join(path, "durability")
    if durability not in ("full", "relaxed"):
        reader.report(where, f"must be 'full' or 'relaxed', not {durability!r}")
        return None
    return durability


def _configure_spool(node: Any, durability: Any) -> None:
    set_spool_durability(node, durability)


SECTIONS = (
    ConfigSection(
        "spool",
        "node",
        _read_spool,
        configure=_configure_spool,
        summary="the guaranteed-message spool: durability ('full' or 'relaxed')",
    ),
    ConfigSection(
        "queues",
        "vpn",
        _read_queues,
        provision=_provision_queues,
        reload=functools.partial(_reload, kind="queues"),
        summary="queues of the VPN, by name: the fields of QueueSettings",
    ),
    ConfigSection(
        "topic_endpoints",
        "vpn",
        _read_topic_endpoints,
        provision=_provision_topic_endpoints,
        reload=functools.partial(_reload, kind="topic endpoints"),
        summary="topic endpoints of the VPN, by name: the fields of QueueSettings "
        "but subscriptions",
    ),
)
"""The tables this plugin reads."""
