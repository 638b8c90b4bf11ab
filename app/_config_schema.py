"""The section readers of node configuration files (see :mod:`meshbus.app._config`).

:class:`_Checker` walks a parsed document once, section by section (``[node]``,
``[[listeners]]`` with their ``tls`` table, ``[vpns.NAME]`` with its profiles and
users, and the tables plugins declare: the ``guaranteed`` plugin's queues and topic
endpoints, say), checks what spans keys and sections (plugin names, clashing
listeners, profile references) and returns the :class:`~meshbus.app._config_model.NodeConfig`,
or ``None`` with every problem collected. Value conversion and ``${ENV:NAME}``
expansion come from :mod:`meshbus.app._config_values`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshbus import (
    DEFAULT_PLUGINS,
    AclProfile,
    ClientProfile,
    ConfigContext,
    ConfigSection,
    ConfigSections,
    ConfigurationError,
    PluginManager,
    available_plugins,
)
from meshbus._plugins import compose
from meshbus._profiles import check_identity
from meshbus._vpn import AUTHENTICATION_SCHEMES
from meshbus.transports import (
    DEFAULT_TLS_PORT,
    ListenerSettings,
    MetricsSettings,
    read_listener_tls_table,
)
from meshbus.transports._metrics import prometheus_missing

from ._config_model import NodeConfig, UserConfig, VpnConfig
from ._config_values import _BAD, _choice, _describe, _join, _suggest, _ValueChecker

DEFAULT_DATA_DIR = "meshbus-data"
"""Folder name of the data directory when ``node.data_dir`` is not given."""

_NODE_KEYS = ("name", "cluster", "data_dir", "plugins", "block")
_VPN_KEYS = ("authentication", "client_profiles", "acl_profiles", "users")
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def plugin_sections(names: tuple[str, ...]) -> ConfigSections:
    """The configuration tables the plugins called ``names`` declare (installed plugins,
    by entry-point name)."""
    plugins = PluginManager()
    compose(plugins, names, autoload=False, blocked=())
    return plugins.config_sections()


def _names(node: object, key: str) -> tuple[str, ...] | None:
    """``node[key]`` if it is a list of names, else ``None`` (reported elsewhere)."""
    value = node.get(key) if isinstance(node, dict) else None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return None


@functools.cache
def _section_owners() -> dict[tuple[str, str], str]:
    """Which installed plugin declares each table, for a file naming one that is not loaded."""
    owners: dict[tuple[str, str], str] = {}
    for name in sorted(available_plugins()):
        try:
            sections = plugin_sections((name,))
        except ConfigurationError:
            continue  # a plugin that cannot load on its own: its tables stay unknown
        for section in sections:
            owners.setdefault((section.scope, section.name), name)
    return owners


class _Checker(_ValueChecker):
    """Walks a parsed document once, converting values and collecting every problem."""

    def __init__(self, source: str, environ: Mapping[str, str], base_dir: Path) -> None:
        super().__init__(source, environ, base_dir)
        # What the VPN sections are checked against (set from the other sections).
        self.verifies_clients = False
        self.loaded: tuple[str, ...] = ()
        self.sections = ConfigSections()

    def node_config(self, data: object) -> NodeConfig | None:
        document = self.table(self.expand(data, ""), "")
        if document is None:
            return None
        raw_node = document.get("node", {})
        self.loaded = self.loaded_plugins(_names(raw_node, "plugins"), _names(raw_node, "block"))
        self.section_keys(document, "", "node", ("node", "listeners", "vpns", "metrics"))
        node = self.table(raw_node, "node") or {}
        self.keys(node, "node", _NODE_KEYS)
        name = self.node_name(node)
        cluster = self.node_cluster(node)
        data_dir = self.data_dir(node)
        plugins, block = self.plugins(node)
        listeners = self.listeners(document.get("listeners"))
        raw = document.get("listeners")
        self.verifies_clients = isinstance(raw, list) and any(
            isinstance(item, dict) and isinstance(item.get("tls"), dict) and "ca" in item["tls"]
            for item in raw
        )
        vpns = self.vpns(document.get("vpns"))
        metrics = self.metrics(document.get("metrics"))
        sections = self.read_sections(document, "", "node", None)
        if self.problems or name is None or data_dir is None:
            return None
        return NodeConfig(
            source=self.source,
            name=name,
            cluster=cluster,
            data_dir=data_dir,
            plugins=plugins,
            block=block,
            listeners=listeners,
            vpns=vpns,
            sections=sections,
            metrics=metrics,
        )

    # --- plugins' tables ---------------------------------------------------------------

    def loaded_plugins(
        self, plugins: tuple[str, ...] | None, block: tuple[str, ...] | None
    ) -> tuple[str, ...]:
        """The plugins the node will load, as far as the file names them correctly (what
        is wrong with the lists is reported with ``[node]``), and the tables they
        declare (in :attr:`sections`)."""
        known = set(available_plugins())
        wanted = DEFAULT_PLUGINS if plugins is None else plugins
        block = block or ()
        loaded = tuple(
            dict.fromkeys(p for p in wanted if p not in block and p in known)  # reported
        )
        try:
            self.sections = plugin_sections(loaded)
        except ConfigurationError as exc:
            self.report("node.plugins", str(exc))
        return loaded

    def section_keys(
        self, table: Mapping[str, Any], path: str, scope: str, own: tuple[str, ...]
    ) -> None:
        """Report keys of ``table`` that neither the core nor a loaded plugin reads; say
        which plugin reads a key when it is one that is not loaded."""
        allowed = (*own, *self.sections.names(scope))
        unread = {key: value for key, value in table.items() if key not in allowed}
        owners = _section_owners() if unread else {}
        for key in list(unread):
            owner = owners.get((scope, key))
            if owner is not None:
                del unread[key]
                self.report(
                    _join(path, key),
                    f"{key.replace('_', ' ')} need the {owner!r} plugin, which is not "
                    "loaded (see node.plugins and node.block)",
                )
        self.keys(unread, path, allowed)

    def _reported_at(self, path: str) -> bool:
        """Whether a problem was found in the table at ``path`` already (a placeholder
        that could not be filled in, found before its plugin read the table)."""
        prefix = f"{self.source}: {path}"
        return any(p.startswith((prefix + ".", prefix + "[", prefix + ":")) for p in self.problems)

    def read_sections(
        self, table: Mapping[str, Any], path: str, scope: str, vpn: str | None
    ) -> tuple[tuple[ConfigSection, Any], ...]:
        """Each plugin table present in ``table``, read by its plugin."""
        context = ConfigContext(parent=table, vpn=vpn, plugins=self.loaded)
        read: list[tuple[ConfigSection, Any]] = []
        for section in self.sections:
            if section.scope != scope or section.name not in table:
                continue
            where = _join(path, section.name)
            before = len(self.problems)
            try:
                value = section.read(self, table[section.name], where, context)
            except ConfigurationError as exc:  # a reader that raises rather than reports
                for problem in exc.problems:
                    self.report(where, problem)
                continue
            if value is None and len(self.problems) == before and not self._reported_at(where):
                self.report(where, "the plugin that reads it refused it without saying why")
            elif value is not None:
                read.append((section, value))
        return tuple(read)

    def node_name(self, node: Mapping[str, Any]) -> str | None:
        name = self.value(node.get("name", "meshbus"), str, "node.name")
        if name is not None:
            try:
                # It starts every generated client name, which must be one topic level.
                check_identity("node name", name)
            except ConfigurationError as exc:
                self.report("node.name", str(exc))
                return None
        return name  # type: ignore[no-any-return]

    def node_cluster(self, node: Mapping[str, Any]) -> str | None:
        if "cluster" not in node:
            return None
        cluster = self.value(node["cluster"], str, "node.cluster")
        if cluster is not None:
            try:
                check_identity("cluster name", cluster)
            except ConfigurationError as exc:
                self.report("node.cluster", str(exc))
                return None
        return cluster  # type: ignore[no-any-return]

    def data_dir(self, node: Mapping[str, Any]) -> Path | None:
        path: Path | None = self.value(
            node.get("data_dir", DEFAULT_DATA_DIR), Path, "node.data_dir"
        )
        if path is not None and path.exists() and not path.is_dir():
            self.report("node.data_dir", f"not a directory: {path}")
        return path

    def plugins(self, node: Mapping[str, Any]) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
        known = sorted(set(available_plugins()) | set(DEFAULT_PLUGINS))
        lists: dict[str, tuple[str, ...]] = {}
        for key in ("plugins", "block"):
            if key not in node:
                continue
            names = self.value(node[key], tuple[str, ...], f"node.{key}")
            if names is None:
                continue
            for i, name in enumerate(names):
                where = f"node.{key}[{i}]"
                if name not in known:
                    self.report(
                        where,
                        f"unknown plugin {name!r}{_suggest(name, known)}; "
                        f"installed: {', '.join(known)}",
                    )
                elif name in names[:i]:
                    self.report(where, f"plugin {name!r} is listed twice")
                elif key == "block" and name in lists.get("plugins", ()):
                    self.report(where, f"plugin {name!r} is also in node.plugins: keep one")
            lists[key] = names
        return lists.get("plugins"), lists.get("block", ())

    def listeners(self, raw: object) -> tuple[Any, ...]:
        if raw is None:
            return (ListenerSettings(),)
        if raw is _BAD:
            return ()
        if not isinstance(raw, list):
            self.report(
                "listeners", f"expected an array of tables ([[listeners]]), got {_describe(raw)}"
            )
            return ()
        built: list[tuple[int, Any]] = []
        for i, item in enumerate(raw):
            path = f"listeners[{i}]"
            table = self.table(item, path)
            if table is None:
                continue
            extra: dict[str, Any] = {}
            defaults: dict[str, Any] = {}
            if "tls" in table:
                extra["tls"] = self.tls(table["tls"], f"{path}.tls")
                defaults["port"] = DEFAULT_TLS_PORT
            settings = self.attrs_value(
                ListenerSettings, table, path, extra=extra, defaults=defaults
            )
            if settings is not None:
                self.listener_clashes(i, settings, built)
                built.append((i, settings))
        return tuple(settings for _, settings in built)

    def listener_clashes(self, index: int, settings: Any, others: list[tuple[int, Any]]) -> None:
        """Report the first earlier listener with the same name, and with the same port."""
        path = f"listeners[{index}]"
        for other_index, other in others:
            if settings.name and settings.name == other.name:
                self.report(
                    f"{path}.name", f"{settings.name!r} is already used by listeners[{other_index}]"
                )
                break
        for other_index, other in others:
            if settings.port == 0 or settings.port != other.port:
                continue
            port = f"port {settings.port} on {settings.host}"
            if settings.host == other.host:
                self.report(f"{path}.port", f"{port} is already used by listeners[{other_index}]")
                break
            if settings.host in _WILDCARD_HOSTS or other.host in _WILDCARD_HOSTS:
                self.report(
                    f"{path}.port", f"{port} overlaps listeners[{other_index}] on {other.host}"
                )
                break

    def tls(self, raw: object, path: str) -> Any:
        return read_listener_tls_table(self, raw, path)

    def metrics(self, raw: object) -> Any:
        """The ``[metrics]`` table: the keys of ``MetricsSettings``; ``None`` without one."""
        if raw is None:
            return None
        table = self.table(raw, "metrics")
        if table is None:
            return None
        settings = self.attrs_value(MetricsSettings, table, "metrics")
        missing = prometheus_missing()
        if missing is not None:
            self.report("metrics", missing)
        return settings

    def vpns(self, raw: object) -> tuple[VpnConfig, ...]:
        if raw is None:
            return (VpnConfig("default"),)
        vpns = self.named_tables(raw, "vpns", self.vpn)
        if raw == {}:
            self.report("vpns", "no VPN is configured: add a [vpns.NAME] table")
        return vpns

    def vpn(self, name: str, table: dict[str, Any], path: str) -> VpnConfig | None:
        if not name or "/" in name:
            self.report(path, "a VPN name must be non-empty and without '/'")
        self.section_keys(table, path, "vpn", _VPN_KEYS)
        authentication = table.get("authentication", "none")
        if authentication is not _BAD and authentication not in AUTHENTICATION_SCHEMES:
            self.report(f"{path}.authentication", _choice(authentication, AUTHENTICATION_SCHEMES))
        elif authentication == "client-certificate" and not self.verifies_clients:
            self.report(
                f"{path}.authentication",
                "'client-certificate' needs a TLS listener with a 'ca' to verify "
                "client certificates",
            )
        client_profiles = self.named_tables(
            table.get("client_profiles"),
            f"{path}.client_profiles",
            lambda n, t, p: self.attrs_value(ClientProfile, t, p, name=n),
        )
        acl_profiles = self.named_tables(
            table.get("acl_profiles"),
            f"{path}.acl_profiles",
            lambda n, t, p: self.attrs_value(AclProfile, t, p, name=n),
        )
        users = self.named_tables(
            table.get("users"),
            f"{path}.users",
            lambda n, t, p: self.user(n, t, p, name, table, authentication),
        )
        sections = self.read_sections(table, path, "vpn", name)
        if self.problems:
            return None
        return VpnConfig(
            name=name,
            authentication=str(authentication),
            client_profiles=client_profiles,
            acl_profiles=acl_profiles,
            users=users,
            sections=sections,
        )

    def user(
        self,
        name: str,
        table: dict[str, Any],
        path: str,
        vpn_name: str,
        vpn: Mapping[str, Any],
        authentication: object,
    ) -> UserConfig | None:
        for key, kind in (("client_profile", "client profile"), ("acl_profile", "ACL profile")):
            wanted = table.get(key)
            defined = vpn.get(f"{key}s")
            known = {"default", *(defined if isinstance(defined, dict) else ())}
            if isinstance(wanted, str) and wanted not in known:
                self.report(
                    _join(path, key),
                    f"no {kind} named {wanted!r} in VPN {vpn_name!r}{_suggest(wanted, known)}",
                )
        if (
            authentication == "basic"
            and "password" not in table
            and table.get("enabled", True) is not False
        ):
            self.report(
                path,
                f"missing required key 'password' (VPN {vpn_name!r} uses basic authentication)",
            )
        return self.attrs_value(UserConfig, table, path, name=name)  # type: ignore[no-any-return]
