"""Reloading a running node's configuration file (``meshbus run`` on SIGHUP).

:func:`reload_node` changes a running node from the configuration it was started with
to a configuration read again from the file, without a restart, where that can be
done while clients are connected:

* each VPN's client profiles, ACL profiles and usernames (added, changed, removed:
  new logins follow the new tables, open sessions keep the login they had);
* what the plugins' tables can change while running (their
  :attr:`~meshbus.ConfigSection.reload`): bridges added, removed or changed and their
  remote subscriptions; queues added and their subscriptions; MQTT listeners opened,
  closed or reopened; and so on.

Everything else (the node's name, data folder, cluster and plugins, the listeners, the
metrics endpoint, the set of VPNs and their authentication, a plugin table without
``reload``) takes a restart. A reload that would change any of those is refused as a
whole, with every such key listed, and the node keeps running as it was: the check
comes before anything is applied.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from meshbus import ConfigSection, ConfigurationError, MeshbusError, Node, Vpn
from meshbus._profiles import hash_password

from ._config_model import NodeConfig, VpnConfig, _placed
from ._config_values import _join

__all__ = ["reload_node"]

log = logging.getLogger("meshbus.config")

_Apply = Callable[[], Awaitable[None]]

#: NodeConfig fields a running node cannot change, and the keys of the file they come from.
_RESTART_ONLY = (
    ("name", "node.name"),
    ("data_dir", "node.data_dir"),
    ("cluster", "node.cluster"),
    ("plugins", "node.plugins"),
    ("block", "node.block"),
    ("listeners", "listeners"),
    ("metrics", "metrics"),
)

_TAKES = "and that takes a restart of the node"
_RESTART = f"changed, {_TAKES}"


async def reload_node(node: Node, running: NodeConfig, new: NodeConfig) -> list[str]:
    """Change ``node``, started from ``running``, to what ``new`` configures.

    :param running: the configuration the node runs with (what it was started with, or
        what the last reload applied).
    :param new: the configuration read again (from the same file, with the same
        command-line overrides).
    :returns: one line per key changed (``"vpns.default.users.alice: changed"``);
        empty when nothing differs.
    :raises ConfigurationError: the change needs a restart or was refused; its
        ``problems`` list every reason (``"FILE: key: why"``), and nothing was changed.
        Or, rarely, a step the checks passed failed as it was applied: the message
        says how many steps were applied before it.
    """
    source = new.source
    problems: list[str] = []
    changes: list[str] = []
    steps: list[_Apply] = []
    for field, key in _RESTART_ONLY:
        if getattr(running, field) != getattr(new, field):
            problems.append(f"{source}: {key}: {_RESTART}")
    before = {vpn.name: vpn for vpn in running.vpns}
    after = {vpn.name: vpn for vpn in new.vpns}
    for name in before:
        if name not in after:
            problems.append(f"{source}: {_join('vpns', name)}: removed, {_TAKES}")
    for name in after:
        if name not in before:
            problems.append(f"{source}: {_join('vpns', name)}: added, {_TAKES}")
    for name in (name for name in after if name in before):
        old, now = before[name], after[name]
        path = _join("vpns", name)
        if old.authentication != now.authentication:
            problems.append(f"{source}: {path}.authentication: {_RESTART}")
            continue
        vpn = node.vpn(name)
        access = _AccessChange(vpn, old, now, path)
        problems += [f"{source}: {problem}" for problem in access.problems]
        if access.changes:
            changes += access.changes
            steps.append(access.apply)
        found = _section_steps(vpn, old.sections, now.sections, path, source)
        problems += found[0]
        changes += found[1]
        steps += found[2]
    found = _section_steps(node, running.sections, new.sections, "", source)
    problems += found[0]
    changes += found[1]
    steps += found[2]
    if problems:
        count = len(problems)
        raise ConfigurationError(
            f"reload of {source} refused, nothing changed: "
            f"{count} problem{'' if count == 1 else 's'}",
            problems,
        )
    for done, step in enumerate(steps):
        try:
            await step()
        except MeshbusError as exc:  # what the checks could not foresee
            raise ConfigurationError(
                f"reload of {source} stopped part way: {done} of {len(steps)} steps applied",
                [f"{source}: {exc}"],
            ) from exc
    for change in changes:
        log.info("reloaded %s: %s", source, change)
    return changes


def _section_steps(
    target: Any,
    old: tuple[tuple[ConfigSection, Any], ...],
    new: tuple[tuple[ConfigSection, Any], ...],
    path: str,
    source: str,
) -> tuple[list[str], list[str], list[_Apply]]:
    """The problems, change lines and steps that take a target's plugin tables from
    ``old`` to ``new``."""
    problems: list[str] = []
    changes: list[str] = []
    steps: list[_Apply] = []
    was = {section.name: (section, value) for section, value in old}
    now = {section.name: (section, value) for section, value in new}
    for name in [*now, *(name for name in was if name not in now)]:
        section = (now.get(name) or was[name])[0]
        before = was.get(name, (None, None))[1]
        after = now.get(name, (None, None))[1]
        if before == after:
            continue
        key = _join(path, name)
        if section.reload is None:
            problems.append(f"{source}: {key}: {_RESTART}")
            continue
        try:
            steps.append(section.reload(target, before, after))
        except ConfigurationError as exc:
            problems += _placed(exc, source, key)
            continue
        changes.append(f"{key}: changed")
    return problems, changes, steps


class _AccessChange:
    """What takes a VPN's profiles and usernames from one configuration to another."""

    def __init__(self, vpn: Vpn, old: VpnConfig, new: VpnConfig, path: str) -> None:
        self.vpn = vpn
        self.problems: list[str] = []
        self.changes: list[str] = []
        self.client_profiles = _delta(old.client_profiles, new.client_profiles)
        self.acl_profiles = _delta(old.acl_profiles, new.acl_profiles)
        self.users = _delta(old.users, new.users)
        for table, (put, gone) in (
            ("client_profiles", self.client_profiles),
            ("acl_profiles", self.acl_profiles),
            ("users", self.users),
        ):
            before = {item.name for item in getattr(old, table)}
            for item in put:
                what = "changed" if item.name in before else "added"
                self.changes.append(f"{path}.{_join(table, item.name)}: {what}")
            self.changes += [f"{path}.{_join(table, name)}: removed" for name in gone]
        self._check_profiles_in_use(new, path)

    def _check_profiles_in_use(self, new: VpnConfig, path: str) -> None:
        """A profile the file no longer has may still be named by a username added
        through the API (the file's own usernames were checked when it was read)."""
        configured = {user.name for user in new.users}
        gone_users = set(self.users[1])
        for table, gone, field in (
            ("client_profiles", self.client_profiles[1], "client_profile"),
            ("acl_profiles", self.acl_profiles[1], "acl_profile"),
        ):
            for profile in gone:
                if profile == "default":
                    continue  # the built-in one comes back
                holders = sorted(
                    user.name
                    for user in self.vpn.users.values()
                    if getattr(user, field) == profile
                    and user.name not in configured
                    and user.name not in gone_users
                )
                if holders:
                    self.problems.append(
                        f"{path}.{_join(table, profile)}: removed, but username(s) "
                        f"{', '.join(map(repr, holders))} added while the node runs "
                        "still name it"
                    )

    async def apply(self) -> None:
        vpn = self.vpn
        put_users, gone_users = self.users
        # Hashing is slow on purpose: never on the event loop (SPEC 6).
        hashes = {
            user.name: await anyio.to_thread.run_sync(hash_password, user.password)
            for user in put_users
            if user.password is not None
        }
        for profile in self.client_profiles[0]:
            vpn.add_client_profile(profile)
        for acl in self.acl_profiles[0]:
            vpn.add_acl_profile(acl)
        for user in put_users:
            user.add_to(vpn, password_hash=hashes.get(user.name))
        for name in gone_users:
            vpn.remove_user(name)
        for name in self.client_profiles[1]:
            vpn.remove_client_profile(name)
        for name in self.acl_profiles[1]:
            vpn.remove_acl_profile(name)


def _delta(old: tuple[Any, ...], new: tuple[Any, ...]) -> tuple[list[Any], list[str]]:
    """What to add or replace (the new items that differ), and the names to remove."""
    before = {item.name: item for item in old}
    after = {item.name: item for item in new}
    put = [item for name, item in after.items() if before.get(name) != item]
    gone = [name for name in before if name not in after]
    return put, gone
