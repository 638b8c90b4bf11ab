"""The section readers of node configuration files (see :mod:`meshbus._config`).

:class:`_Checker` walks a parsed document once, section by section (``[node]``,
``[[listeners]]`` with their ``tls`` table, ``[vpns.NAME]`` with its profiles, users,
queues and topic endpoints), checks what spans keys and sections (plugin names,
clashing listeners, profile and dead message queue references) and returns the
:class:`~meshbus._config_model.NodeConfig`, or ``None`` with every problem collected.
Value conversion and ``${ENV:NAME}`` expansion come from :mod:`meshbus._config_values`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._config_model import NodeConfig, UserConfig, VpnConfig
from ._config_values import _BAD, _choice, _describe, _join, _suggest, _ValueChecker
from ._node import DEFAULT_PLUGINS
from ._plugins import available_plugins
from ._profiles import AclProfile, ClientProfile, check_identity
from ._vpn import AUTHENTICATION_SCHEMES
from .errors import ConfigurationError

DEFAULT_DATA_DIR = "meshbus-data"
"""Folder name of the data directory when ``node.data_dir`` is not given."""

_NODE_KEYS = ("name", "data_dir", "plugins", "block")
_VPN_KEYS = (
    "authentication",
    "client_profiles",
    "acl_profiles",
    "users",
    "queues",
    "topic_endpoints",
)
_TLS_CLIENT_ONLY = frozenset({"server_hostname", "check_hostname"})
_TLS_FILES = ("ca", "certificate", "private_key")
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


# The settings of listeners and queues live in meshbus.transports and in the guaranteed
# plugin; they are imported by name when needed, so the core keeps no import-time
# dependency on them (mypy checks sdk/ on its own: these classes are Any to it).


def _transport_settings() -> Any:
    return importlib.import_module("meshbus.transports._settings")


def _queue_settings_class() -> Any:
    return importlib.import_module("meshbus.plugins.guaranteed._settings").QueueSettings


class _Checker(_ValueChecker):
    """Walks a parsed document once, converting values and collecting every problem."""

    def __init__(self, source: str, environ: Mapping[str, str], base_dir: Path) -> None:
        super().__init__(source, environ, base_dir)
        # What the VPN sections are checked against (set from the other sections).
        self.has_guaranteed = True
        self.verifies_clients = False

    def node_config(self, data: object) -> NodeConfig | None:
        document = self.table(self.expand(data, ""), "")
        if document is None:
            return None
        self.keys(document, "", ("node", "listeners", "vpns"))
        node = self.table(document.get("node", {}), "node") or {}
        self.keys(node, "node", _NODE_KEYS)
        name = self.node_name(node)
        data_dir = self.data_dir(node)
        plugins, block = self.plugins(node)
        listeners = self.listeners(document.get("listeners"))
        loaded = [p for p in (DEFAULT_PLUGINS if plugins is None else plugins) if p not in block]
        self.has_guaranteed = "guaranteed" in loaded
        raw = document.get("listeners")
        self.verifies_clients = isinstance(raw, list) and any(
            isinstance(item, dict) and isinstance(item.get("tls"), dict) and "ca" in item["tls"]
            for item in raw
        )
        vpns = self.vpns(document.get("vpns"))
        if self.problems or name is None or data_dir is None:
            return None
        return NodeConfig(
            source=self.source,
            name=name,
            data_dir=data_dir,
            plugins=plugins,
            block=block,
            listeners=listeners,
            vpns=vpns,
        )

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
        module = _transport_settings()
        if raw is None:
            return (module.ListenerSettings(),)
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
                defaults["port"] = module.DEFAULT_TLS_PORT
            settings = self.attrs_value(
                module.ListenerSettings, table, path, extra=extra, defaults=defaults
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
        table = self.table(raw, path)
        if table is None:
            return None
        missing = [key for key in ("certificate", "private_key") if key not in table]
        if table.get("require_client_certificate") is True and "ca" not in table:
            missing.append("ca")
        for key in missing:
            why = " (require_client_certificate = true)" if key == "ca" else ""
            self.report(path, f"missing required key {key!r}{why}")
        settings = self.attrs_value(
            _transport_settings().TlsSettings, table, path, exclude=_TLS_CLIENT_ONLY
        )
        if settings is None:
            return None
        usable = not missing
        for key in _TLS_FILES:
            file: Path | None = getattr(settings, key)
            if file is not None and not file.is_file():
                what = "not a file" if file.exists() else "no such file"
                self.report(_join(path, key), f"{what}: {file}")
                usable = False
        if usable:  # every file is there: check that they hold a certificate and its key
            try:
                settings.server_context()
            except ConfigurationError as exc:
                self.report(path, str(exc))
                return None
        return settings if usable else None

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
        self.keys(table, path, _VPN_KEYS)
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
        queues, endpoints = self.endpoints(table, path, name)
        if self.problems:
            return None
        return VpnConfig(
            name=name,
            authentication=str(authentication),
            client_profiles=client_profiles,
            acl_profiles=acl_profiles,
            users=users,
            queues=queues,
            topic_endpoints=endpoints,
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

    def endpoints(
        self, vpn: Mapping[str, Any], path: str, vpn_name: str
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        present = [key for key in ("queues", "topic_endpoints") if key in vpn]
        if not present:
            return (), ()
        for key in present:
            if not self.has_guaranteed:
                self.report(
                    f"{path}.{key}",
                    f"{key.replace('_', ' ')} need the 'guaranteed' plugin, which is not "
                    "loaded (see node.plugins and node.block)",
                )
        settings = _queue_settings_class()
        raw_queues = vpn.get("queues")
        queue_names = set(raw_queues) if isinstance(raw_queues, dict) else set()

        def check_dmq(table: Mapping[str, Any], where: str) -> None:
            dmq = table.get("dead_message_queue")
            if isinstance(dmq, str) and dmq not in queue_names:
                self.report(
                    _join(where, "dead_message_queue"),
                    f"no queue named {dmq!r} in VPN {vpn_name!r}{_suggest(dmq, queue_names)}",
                )

        def queue(name: str, table: dict[str, Any], where: str) -> Any:
            check_dmq(table, where)
            return self.attrs_value(settings, table, where, name=name)

        def endpoint(name: str, table: dict[str, Any], where: str) -> Any:
            check_dmq(table, where)
            if "subscriptions" in table:
                self.report(
                    _join(where, "subscriptions"),
                    "a topic endpoint takes no subscriptions: its consumer gives one at bind",
                )
                return None
            return self.attrs_value(
                settings,
                table,
                where,
                name=name,
                exclude=("subscriptions",),
                # As GuaranteedService.create_topic_endpoint defaults it, as brokers do.
                defaults={"reject_msg_to_sender_on_discard": False},
            )

        return (
            self.named_tables(vpn.get("queues"), f"{path}.queues", queue),
            self.named_tables(vpn.get("topic_endpoints"), f"{path}.topic_endpoints", endpoint),
        )
