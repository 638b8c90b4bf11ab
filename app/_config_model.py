"""The parsed node configuration: :class:`NodeConfig` and its :class:`VpnConfig`
and :class:`UserConfig`, as :func:`meshbus._config.load_config` returns them, and how
a node is built and provisioned from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from meshbus import (
    AclProfile,
    ClientProfile,
    ConfigSection,
    ConfigurationError,
    Node,
    StateError,
)
from meshbus._profiles import check_identity

from ._config_values import _failure, _join


def _username(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    check_identity("username", value)


def _password(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigurationError("password must be a non-empty string")


@attrs.frozen
class UserConfig:
    """A client username to create with :meth:`meshbus.Vpn.add_user`."""

    name: str = attrs.field(validator=_username)
    """The username clients log in with."""
    password: str | None = attrs.field(default=None, validator=_password, repr=False)
    """Plain password (hashed by ``add_user``); ``None``: no password can log in."""
    client_profile: str = "default"
    """Name of its client profile."""
    acl_profile: str = "default"
    """Name of its ACL profile."""
    subscription_manager: bool = False
    """Whether its sessions may manage other sessions' subscriptions."""
    management: bool = False
    """Whether its sessions may read the whole node's statistics."""
    enabled: bool = True
    """Disabled usernames cannot log in."""

    def add_to(self, vpn: Any, **credentials: str | None) -> None:
        """Add this username to ``vpn`` (or replace the one of that name), with
        ``password=`` (hashed on the calling thread) or ``password_hash=``.

        :raises ConfigurationError: a profile it names is not in ``vpn``.
        """
        vpn.add_user(
            self.name,
            client_profile=self.client_profile,
            acl_profile=self.acl_profile,
            subscription_manager=self.subscription_manager,
            management=self.management,
            enabled=self.enabled,
            **credentials,
        )


@attrs.frozen
class VpnConfig:
    """One Message VPN of a :class:`NodeConfig`."""

    name: str
    """The VPN's name."""
    authentication: str = "none"
    """``"none"``, ``"basic"`` or ``"client-certificate"`` (see :class:`meshbus.Vpn`)."""
    client_profiles: tuple[ClientProfile, ...] = ()
    """Client profiles to add (besides the built-in ``"default"``)."""
    acl_profiles: tuple[AclProfile, ...] = ()
    """ACL profiles to add (besides the built-in ``"default"``)."""
    users: tuple[UserConfig, ...] = ()
    """Client usernames to add."""
    sections: tuple[tuple[ConfigSection, Any], ...] = ()
    """The plugins' tables of this VPN (queues, bridges, ...) and what they read there."""

    def section(self, name: str) -> Any:
        """What the plugin table ``name`` of this VPN holds, or ``None``."""
        return _section(self.sections, name)


@attrs.frozen
class NodeConfig:
    """A validated node configuration, as :func:`load_config` returns it.

    Build the node, then provision it once it runs::

        config = load_config("edge.toml")
        node = config.build_node()
        async with node:
            await config.provision(node)
            ...
    """

    source: str
    """Where it came from (the file name as given), used in every problem reported."""
    data_dir: Path
    """Durable state of the node (absolute)."""
    name: str = "meshbus"
    """The node's name."""
    cluster: str | None = None
    """The cluster the node is in (dynamic routing), or ``None``."""
    plugins: tuple[str, ...] | None = None
    """Plugin names to load; ``None`` for :data:`meshbus.DEFAULT_PLUGINS`."""
    block: tuple[str, ...] = ()
    """Plugin names never to load."""
    listeners: tuple[Any, ...] = ()
    """``meshbus.transports.ListenerSettings`` of each listener."""
    vpns: tuple[VpnConfig, ...] = ()
    """The node's VPNs: it has no others."""
    sections: tuple[tuple[ConfigSection, Any], ...] = ()
    """The plugins' node-wide tables and what they read there."""
    metrics: Any = None
    """``meshbus.transports.MetricsSettings`` of the metrics endpoint (the ``[metrics]``
    table), or ``None`` for none."""

    def section(self, name: str) -> Any:
        """What the node-wide plugin table ``name`` holds, or ``None``."""
        return _section(self.sections, name)

    def vpn(self, name: str) -> VpnConfig:
        """The configuration of the VPN called ``name``."""
        for vpn in self.vpns:
            if vpn.name == name:
                return vpn
        raise KeyError(name)

    def build_node(self) -> Node:
        """Make the node with its plugins, VPNs, profiles and users (not started).

        Queues and topic endpoints need a running node: see :meth:`provision`.

        :raises ConfigurationError: something the checks could not foresee was
            refused (a plugin failed to import, a scheme the VPN does not support).
        """
        try:
            node = Node(
                name=self.name,
                cluster=self.cluster,
                plugins=self.plugins,
                block=self.block,
                data_dir=self.data_dir,
            )
        except ConfigurationError as exc:
            raise _failure(self.source, [f"{self.source}: node.plugins: {exc}"]) from exc
        problems: list[str] = []
        # Recreated as configured, or dropped: an unlisted, unauthenticated VPN
        # would let anyone who reaches a listener in.
        node.remove_vpn("default")
        for config in self.vpns:
            where = f"{self.source}: {_join('vpns', config.name)}"
            try:
                vpn = node.create_vpn(config.name, authentication=config.authentication)
            except (ConfigurationError, StateError) as exc:
                problems.append(f"{where}.authentication: {exc}")
                continue
            for client_profile in config.client_profiles:
                vpn.add_client_profile(client_profile)
            for acl_profile in config.acl_profiles:
                vpn.add_acl_profile(acl_profile)
            for user in config.users:
                try:
                    user.add_to(vpn, password=user.password)
                except ConfigurationError as exc:
                    problems.append(f"{where}.{_join('users', user.name)}: {exc}")
            problems += self._apply(config.sections, vpn, _join("vpns", config.name))
        problems += self._apply(self.sections, node, "")
        if problems:
            raise _failure(self.source, problems)
        return node

    def _apply(
        self, sections: tuple[tuple[ConfigSection, Any], ...], target: Any, path: str
    ) -> list[str]:
        """Each section's ``configure``: what went wrong, as problems."""
        problems: list[str] = []
        for section, value in sections:
            if section.configure is None:
                continue
            try:
                section.configure(target, value)
            except ConfigurationError as exc:
                problems += _placed(exc, self.source, _join(path, section.name))
        return problems

    async def provision(self, node: Node) -> None:
        """Apply what needs a running node (queues, topic endpoints, the plugins' tables)
        to a node made by :meth:`build_node`.

        Call it inside ``async with node:``, before clients connect: the guaranteed
        service takes queues only once its store is open. Calling it twice is
        harmless (queues that exist with the same settings are left as they are).

        :raises ConfigurationError: listing every problem.
        :raises StateError: the node is not running.
        """
        steps: list[tuple[Any, Any, Any, str]] = [
            (section, value, node.vpn(config.name), _join("vpns", config.name))
            for config in self.vpns
            for section, value in config.sections
            if section.provision is not None
        ]
        steps += [
            (section, value, node, "") for section, value in self.sections if section.provision
        ]
        if not steps:
            return
        if not node.running:
            raise StateError("provision() needs a running node: call it in 'async with node:'")
        problems: list[str] = []
        for section, value, target, path in steps:
            assert section.provision is not None
            try:
                await section.provision(target, value)
            except ConfigurationError as exc:
                problems += _placed(exc, self.source, _join(path, section.name))
        if problems:
            raise _failure(self.source, problems)


def _section(sections: tuple[tuple[ConfigSection, Any], ...], name: str) -> Any:
    for section, value in sections:
        if section.name == name:
            return value
    return None


def _placed(exc: ConfigurationError, source: str, path: str) -> list[str]:
    """A section's problems (``"orders: why"``) placed in the file
    (``"FILE: vpns.x.queues.orders: why"``)."""
    return [f"{source}: {path}.{problem}" for problem in exc.problems]
