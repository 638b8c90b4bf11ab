"""Bridges changed by a configuration reload (SPEC 7: remote subscriptions change
while running, from the API and from a reload).

A bridge the reloaded file adds is opened; one it no longer has is closed (what its
link had taken is written first); one whose remote subscriptions alone changed gets
them without reconnecting: what the file added is asked of the remote, what it removed
is withdrawn, and subscriptions added through the API stay. A bridge with any other
setting changed is closed and opened again with the new settings: its remote queues
give back what it had not acknowledged, so no guaranteed message is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import attrs

from meshbus import ConfigurationError, Vpn

from ._bridge import BRIDGE, Bridge, BridgeSettings, open_bridge, same_node_refusal
from ._mapping import directions

__all__ = ["reload_bridges"]

log = logging.getLogger("meshbus.bridge")


def reload_bridges(
    vpn: Vpn,
    old: Sequence[BridgeSettings] | None,
    new: Sequence[BridgeSettings] | None,
) -> Callable[[], Awaitable[None]]:
    """Check the change from the ``old`` bridges of ``vpn`` to the ``new`` ones, and
    return what makes it.

    :raises ConfigurationError: a bridge cannot be opened as the new file says (a
        same-node remote VPN that does not exist, a name another link of the VPN has,
        subscriptions over the VPN's topic limits); nothing was changed.
    """
    before = {each.name: each for each in old or ()}
    after = {each.name: each for each in new or ()}
    problems: list[str] = []
    steps: list[Callable[[], Awaitable[None]]] = []
    for name in before.keys() - after.keys():
        running = _running(vpn, name)
        if running is not None:
            steps.append(_closer(running))
    for name, settings in after.items():
        if before.get(name) == settings:
            continue
        running = _running(vpn, name)
        why = _cannot_open(vpn, settings, running)
        if why:
            problems.append(f"{name}: {why}")
            continue
        previous = before.get(name)
        if (
            running is not None
            and previous is not None
            and attrs.evolve(previous, subscriptions=settings.subscriptions) == settings
        ):
            steps.append(_resubscriber(running, previous, settings))
        else:
            steps.append(_opener(vpn, settings, running))
    if problems:
        raise ConfigurationError(f"{len(problems)} bridges refused", problems)

    async def apply() -> None:
        for step in steps:
            await step()

    return apply


def _running(vpn: Vpn, name: str) -> Bridge | None:
    link = vpn.links.get(f"bridge/{name}")
    return None if link is None else link.stash.get(BRIDGE, None)


def _cannot_open(vpn: Vpn, settings: BridgeSettings, running: Bridge | None) -> str:
    """Why ``settings`` could not be opened in ``vpn`` (``""``: it can)."""
    name = f"bridge/{settings.name}"
    if running is None and vpn.links.get(name) is not None:
        return f"the VPN has another link called {name!r}"
    if not settings.remotes:
        why = same_node_refusal(vpn, settings)
        if why:
            return why
    try:
        directions(
            settings.topics,
            {**settings.variables, "bridge.name": settings.name},
            subscriptions=settings.subscriptions,
            limits=vpn.topic_limits,
        )
    except ConfigurationError as exc:
        return "; ".join(exc.problems) or str(exc)
    return ""


def _closer(bridge: Bridge) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        log.info("bridge %r: removed from the configuration, closing", bridge.settings.name)
        await bridge.aclose("removed from the configuration")

    return close


def _resubscriber(
    bridge: Bridge, old: BridgeSettings, new: BridgeSettings
) -> Callable[[], Awaitable[None]]:
    async def resubscribe() -> None:
        added = [f for f in new.subscriptions if f not in old.subscriptions]
        removed = [f for f in old.subscriptions if f not in new.subscriptions]
        for topic_filter in added:
            bridge.add_subscription(topic_filter)
        for topic_filter in removed:
            bridge.remove_subscription(topic_filter)
        bridge.settings = new
        log.info(
            "bridge %r: remote subscriptions added %s, removed %s",
            new.name,
            added or "none",
            removed or "none",
        )

    return resubscribe


def _opener(
    vpn: Vpn, settings: BridgeSettings, running: Bridge | None
) -> Callable[[], Awaitable[None]]:
    async def reopen() -> None:
        if running is not None:
            log.info("bridge %r: settings changed, reconnecting", settings.name)
            await running.aclose("settings changed by a reload")
        else:
            log.info("bridge %r: added by a reload, opening", settings.name)
        open_bridge(vpn, settings)

    return reopen
