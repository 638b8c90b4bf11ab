"""Node configuration files (TOML): what ``meshbus run CONFIG`` serves.

A file describes one node: its plugins, its listeners and its Message VPNs with
their profiles, users, queues and topic endpoints. ``examples/edge-node.toml``
is a commented example. The schema (every section is optional, and so is
every key not marked required)::

    [node]
    name = "edge-1"              # default "meshbus"
    data_dir = "meshbus-data"    # default "meshbus-data" beside the file (the spool lives here)
    plugins = ["direct", "shared", "eliding", "guaranteed"]   # default meshbus.DEFAULT_PLUGINS
    block = []                   # plugin names never to load

    [[listeners]]                # default: one plain TCP listener on 127.0.0.1:55555
    name = "plain"               # keys: the fields of meshbus.transports.ListenerSettings
    host = "127.0.0.1"           # (host, port, compression, keepalive, keepalive_timeout,
    port = 55555                 #  handshake_timeout, max_frame_size, name)
    [listeners.tls]              # makes it a TLS listener; its port defaults to 55443
    certificate = "certs/server.pem"      # required
    private_key = "certs/server-key.pem"  # required
    ca = "certs/ca.pem"                   # required with require_client_certificate
    require_client_certificate = false
    minimum_version = "TLSv1.2"           # or "TLSv1.3"
    ciphers = "ECDHE+AESGCM"              # OpenSSL cipher list for TLS 1.2

    [vpns.NAME]                  # default: one VPN "default" with authentication "none"
    authentication = "basic"     # "none" | "basic" | "client-certificate"
    [vpns.NAME.client_profiles.PROFILE]   # keys: the fields of meshbus.ClientProfile
    [vpns.NAME.acl_profiles.PROFILE]      # keys: the fields of meshbus.AclProfile
    [vpns.NAME.users.USERNAME]            # password, client_profile, acl_profile,
                                          # subscription_manager, enabled (Vpn.add_user)
    [vpns.NAME.queues.QUEUE]              # keys: the fields of QueueSettings (subscriptions,
                                          # access_type, max_messages, ...)
    [vpns.NAME.topic_endpoints.ENDPOINT]  # the same but subscriptions (given at bind)

Rules:

* The allowed keys and their types come from the attrs classes named above, and
  their own validators judge the values, so the file takes exactly what the
  Python API takes (enums by value: ``access_type = "non-exclusive"``).
* Relative paths (``data_dir``, TLS files) are relative to the file's folder.
* ``${ENV:NAME}`` in any string value (also inside a longer one, as in
  ``"${ENV:HOME}/data"``) is replaced by the environment variable ``NAME``; the
  result is still a string. ``$${`` writes a literal ``${``. Keys are never expanded.
* With a ``[vpns]`` table the node has exactly the VPNs it lists: the built-in
  ``"default"`` VPN, open to anyone, is kept only when listed. Each VPN still has
  its built-in ``"default"`` profiles and username; a table of that name replaces them.
* A user of a VPN with basic authentication needs a ``password`` (unless it is
  disabled); queues and topic endpoints need the ``guaranteed`` plugin.

The whole file is checked before anything is built, and every problem is reported
at once: :func:`load_config` raises one :class:`~meshbus.ConfigurationError`
whose ``problems`` hold one line each, ``"FILE: key.path: why"``.
"""

from __future__ import annotations

import difflib
import enum
import functools
import importlib
import json
import logging
import os
import re
import tomllib
import typing
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import UnionType
from typing import Any

import attrs

from ._node import DEFAULT_PLUGINS, Node
from ._plugins import available_plugins
from ._profiles import AclProfile, ClientProfile, check_identity
from ._vpn import AUTHENTICATION_SCHEMES
from .errors import ConfigurationError, StateError

__all__ = [
    "DEFAULT_DATA_DIR",
    "NodeConfig",
    "UserConfig",
    "VpnConfig",
    "default_config",
    "load_config",
    "parse_config",
]

log = logging.getLogger("meshbus.config")

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
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_PLACEHOLDER = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_ENV_PLACEHOLDER = re.compile(r"ENV:([A-Za-z_][A-Za-z0-9_]*)\Z")
_TOML_POSITION = re.compile(r"(.*) \(at (?:line (\d+), column (\d+)|end of document)\)\Z", re.S)
_VALIDATION_ERRORS = (ConfigurationError, TypeError, ValueError)


# The settings of listeners and queues live in meshbus.transports and in the guaranteed
# plugin; they are imported by name when needed, so the core keeps no import-time
# dependency on them (mypy checks sdk/ on its own: these classes are Any to it).


def _transport_settings() -> Any:
    return importlib.import_module("meshbus.transports._settings")


def _queue_settings_class() -> Any:
    return importlib.import_module("meshbus.plugins.guaranteed._settings").QueueSettings


# --- the parsed configuration ------------------------------------------------------------


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
    enabled: bool = True
    """Disabled usernames cannot log in."""


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
    queues: tuple[Any, ...] = ()
    """``QueueSettings`` of the queues to provision."""
    topic_endpoints: tuple[Any, ...] = ()
    """``QueueSettings`` of the topic endpoints to provision."""


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
    plugins: tuple[str, ...] | None = None
    """Plugin names to load; ``None`` for :data:`meshbus.DEFAULT_PLUGINS`."""
    block: tuple[str, ...] = ()
    """Plugin names never to load."""
    listeners: tuple[Any, ...] = ()
    """``meshbus.transports.ListenerSettings`` of each listener."""
    vpns: tuple[VpnConfig, ...] = ()
    """The node's VPNs: it has no others."""

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
                name=self.name, plugins=self.plugins, block=self.block, data_dir=self.data_dir
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
                    vpn.add_user(
                        user.name,
                        password=user.password,
                        client_profile=user.client_profile,
                        acl_profile=user.acl_profile,
                        subscription_manager=user.subscription_manager,
                        enabled=user.enabled,
                    )
                except ConfigurationError as exc:
                    problems.append(f"{where}.{_join('users', user.name)}: {exc}")
        if problems:
            raise _failure(self.source, problems)
        return node

    async def provision(self, node: Node) -> None:
        """Create the queues and topic endpoints in a node made by :meth:`build_node`.

        Call it inside ``async with node:``, before clients connect: the guaranteed
        service takes queues only once its store is open. Queues that exist with the
        same settings are left as they are, so calling it twice is harmless.

        :raises ConfigurationError: listing every queue or endpoint refused.
        :raises StateError: the node is not running.
        """
        if not any(vpn.queues or vpn.topic_endpoints for vpn in self.vpns):
            return
        if not node.running:
            raise StateError("provision() needs a running node: call it in 'async with node:'")
        problems: list[str] = []
        service: Any = node.guaranteed
        for config in self.vpns:
            where = f"{self.source}: {_join('vpns', config.name)}"
            for queue in config.queues:
                settings = attrs.asdict(queue, recurse=False)
                del settings["name"]
                try:
                    service.create_queue(queue.name, vpn=config.name, **settings)
                except (ConfigurationError, StateError) as exc:
                    problems.append(f"{where}.{_join('queues', queue.name)}: {exc}")
            for endpoint in config.topic_endpoints:
                settings = attrs.asdict(endpoint, recurse=False)
                del settings["name"], settings["subscriptions"]
                path = f"{where}.{_join('topic_endpoints', endpoint.name)}"
                create = getattr(service, "create_topic_endpoint", None)
                if create is None:
                    problems.append(f"{path}: the guaranteed service has no topic endpoints")
                    continue
                try:
                    create(endpoint.name, vpn=config.name, **settings)
                except (ConfigurationError, StateError) as exc:
                    problems.append(f"{path}: {exc}")
        if problems:
            raise _failure(self.source, problems)


# --- entry points ----------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> NodeConfig:
    """Read and validate a TOML configuration file.

    :param path: the file; relative paths in it are relative to its folder.
    :param environ: where ``${ENV:NAME}`` placeholders are looked up (default
        :data:`os.environ`).
    :raises ConfigurationError: the file cannot be read, is not TOML, or breaks
        the schema; ``problems`` lists every problem found.
    """
    source = os.fspath(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise _failure(source, [f"{source}: cannot read the file: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise _failure(source, [f"{source}: not UTF-8 text: {exc}"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _failure(source, [f"{source}: {_toml_error(exc)}"]) from None
    config = parse_config(
        data, source=source, environ=environ, base_dir=Path(path).absolute().parent
    )
    log.info(
        "configuration %s loaded: node %r, VPNs %s, %d listener(s)",
        source,
        config.name,
        ", ".join(repr(vpn.name) for vpn in config.vpns),
        len(config.listeners),
    )
    return config


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str = "<config>",
    environ: Mapping[str, str] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> NodeConfig:
    """Validate a configuration already read (as :func:`tomllib.load` returns it).

    :param source: names the configuration in problems.
    :param environ: where ``${ENV:NAME}`` placeholders are looked up (default
        :data:`os.environ`).
    :param base_dir: what relative paths are relative to (default: the current folder).
    :raises ConfigurationError: listing every problem found.
    """
    checker = _Checker(
        source,
        os.environ if environ is None else environ,
        Path.cwd() if base_dir is None else Path(base_dir).absolute(),
    )
    config = checker.node_config(data)
    if config is None or checker.problems:
        raise _failure(source, checker.problems)
    return config


def default_config(cwd: str | os.PathLike[str] | None = None) -> NodeConfig:
    """What ``meshbus run`` serves without a file: one VPN ``"default"`` open to
    all, one plain TCP listener on 127.0.0.1:55555, data in ``cwd/meshbus-data``."""
    return parse_config({}, source="<defaults>", environ={}, base_dir=cwd)


def _failure(source: str, problems: list[str]) -> ConfigurationError:
    count = len(problems)
    return ConfigurationError(
        f"invalid configuration {source}: {count} problem{'' if count == 1 else 's'}", problems
    )


def _toml_error(exc: tomllib.TOMLDecodeError) -> str:
    match = _TOML_POSITION.match(str(exc))
    if match is None:
        return f"invalid TOML: {exc}"
    message, line, column = match.groups()
    where = "end of file" if line is None else f"line {line}, column {column}"
    return f"{where}: invalid TOML: {message}"


# --- checking ------------------------------------------------------------------------------


class _Bad:
    """Stands for a value already reported as wrong (a missing environment variable)."""

    def __repr__(self) -> str:
        return "<bad value>"


_BAD = _Bad()


class _Invalid(Exception):
    """A value is wrong: ``why`` (``None`` when already reported), at ``path + suffix``."""

    def __init__(self, why: str | None, suffix: str = "") -> None:
        super().__init__(why)
        self.why = why
        self.suffix = suffix


def _key(name: str) -> str:
    """A key as TOML writes it in a dotted path: bare when it can be, else quoted."""
    return name if _BARE_KEY.match(name) else json.dumps(name, ensure_ascii=False)


def _join(path: str, key: str) -> str:
    return f"{path}.{_key(key)}" if path else _key(key)


def _describe(value: object) -> str:
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"{type(value).__name__.replace('int', 'integer')} {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _suggest(word: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _choice(value: object, choices: Collection[str]) -> str:
    listed = ", ".join(repr(c) for c in choices)
    hint = _suggest(value, choices) if isinstance(value, str) else ""
    return f"expected one of {listed}, got {_describe(value)}{hint}"


@functools.cache
def _field_types(cls: Any) -> dict[str, Any]:
    """The type of each field an attrs class takes in ``__init__``, resolved."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints.get(field.name, Any) for field in attrs.fields(cls) if field.init}


def _reason(exc: BaseException, cls: Any, key: str | None) -> str:
    """An attrs validator's message without the field name it starts with (the path has it)."""
    text = str(exc)
    if key is not None:
        for prefix in (f"{cls.__name__}.{key} ", f"queue setting {key} ", f"{key} "):
            if text.startswith(prefix):
                return text[len(prefix) :]
    return text


class _Checker:
    """Walks a parsed document once, converting values and collecting every problem."""

    def __init__(self, source: str, environ: Mapping[str, str], base_dir: Path) -> None:
        self.source = source
        self.environ = environ
        self.base_dir = base_dir
        self.problems: list[str] = []
        # What the VPN sections are checked against (set from the other sections).
        self.has_guaranteed = True
        self.verifies_clients = False

    def report(self, path: str, why: str) -> None:
        self.problems.append(f"{self.source}: {path}: {why}" if path else f"{self.source}: {why}")

    # --- environment placeholders ------------------------------------------------------

    def expand(self, value: object, path: str) -> object:
        if isinstance(value, str):
            return self._expand_text(value, path) if "${" in value else value
        if isinstance(value, list):
            return [self.expand(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, dict):
            return {key: self.expand(item, _join(path, key)) for key, item in value.items()}
        return value

    def _expand_text(self, text: str, path: str) -> object:
        failed = False

        def substitute(match: re.Match[str]) -> str:
            nonlocal failed
            token = match.group(0)
            if token == "$${":
                return "${"
            if token == "${":
                self.report(path, "'${' without a closing '}' (write $${ for a literal '${')")
            else:
                name = _ENV_PLACEHOLDER.match(match.group(1))
                if name is None:
                    self.report(
                        path,
                        f"unknown placeholder {token!r}: write ${{ENV:NAME}} for an "
                        "environment variable, or $${ for a literal '${'",
                    )
                else:
                    value = self.environ.get(name.group(1))
                    if value is not None:
                        return value
                    self.report(path, f"environment variable {name.group(1)!r} is not set")
            failed = True
            return ""

        expanded = _PLACEHOLDER.sub(substitute, text)
        return _BAD if failed else expanded

    # --- values ------------------------------------------------------------------------

    def convert(self, value: object, hint: Any) -> Any:
        """``value`` as the type ``hint`` names; raise :class:`_Invalid` if it is not one."""
        if value is _BAD:
            raise _Invalid(None)
        if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
            # TOML has no null: an optional field is given its value or left out.
            options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
            if len(options) != 1:
                return value  # a union this loader does not know: the validator judges
            hint = options[0]
        if hint is bool:
            if isinstance(value, bool):
                return value
            raise _Invalid(f"expected a boolean, got {_describe(value)}")
        if hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise _Invalid(f"expected an integer, got {_describe(value)}")
        if hint is float:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return value
            raise _Invalid(f"expected a number, got {_describe(value)}")
        if hint is str:
            if isinstance(value, str):
                return value
            raise _Invalid(f"expected a string, got {_describe(value)}")
        if hint is Path:
            if isinstance(value, str) and value:
                return self.base_dir / Path(value).expanduser()
            raise _Invalid(f"expected a file path (a non-empty string), got {_describe(value)}")
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            choices = [member.value for member in hint]
            if isinstance(value, str) and value in choices:
                return hint(value)
            raise _Invalid(_choice(value, choices))
        args = typing.get_args(hint)
        if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
            if not isinstance(value, list):
                raise _Invalid(f"expected an array, got {_describe(value)}")
            items = []
            for i, item in enumerate(value):
                try:
                    items.append(self.convert(item, args[0]))
                except _Invalid as exc:
                    raise _Invalid(exc.why, f"[{i}]{exc.suffix}") from None
            return tuple(items)
        return value  # a type this loader does not know: the class's validator judges it

    def value(self, raw: object, hint: Any, path: str) -> Any:
        """:meth:`convert`, reporting a problem and returning ``None`` when it fails."""
        try:
            return self.convert(raw, hint)
        except _Invalid as exc:
            if exc.why is not None:
                self.report(path + exc.suffix, exc.why)
            return None

    def table(self, raw: object, path: str) -> dict[str, Any] | None:
        if raw is _BAD:
            return None
        if not isinstance(raw, dict):
            self.report(path, f"expected a table, got {_describe(raw)}")
            return None
        return raw

    def keys(self, table: Mapping[str, Any], path: str, allowed: Collection[str]) -> bool:
        """Report every key of ``table`` not in ``allowed``; whether there was none."""
        clean = True
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, list(allowed), n=1)
                if close:
                    why = f"unknown key (did you mean {close[0]!r}?)"
                else:
                    why = f"unknown key (expected one of: {', '.join(allowed)})"
                self.report(_join(path, key), why)
                clean = False
        return clean

    def named_tables(
        self,
        raw: object,
        path: str,
        build: Callable[[str, dict[str, Any], str], Any],
    ) -> tuple[Any, ...]:
        """Build one object per sub-table of ``raw`` (``[path.NAME]``), skipping bad ones."""
        if raw is None:
            return ()
        tables = self.table(raw, path)
        built = []
        for name, item in (tables or {}).items():
            item_path = _join(path, name)
            table = self.table(item, item_path)
            if table is not None:
                made = build(name, table, item_path)
                if made is not None:
                    built.append(made)
        return tuple(built)

    def attrs_value(
        self,
        cls: Any,
        table: Mapping[str, Any],
        path: str,
        *,
        name: str | None = None,
        exclude: Collection[str] = (),
        extra: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> Any:
        """Make ``cls(name, **table)`` from a table whose keys are the class's fields.

        Each key is converted and then checked by the class's own validators on its
        own, so a problem is reported at the key that has it. ``extra`` holds keys the
        caller handled (``None`` when they failed); ``defaults`` replace the class's.
        """
        handled = extra or {}
        fields = {
            key: hint
            for key, hint in _field_types(cls).items()
            if key not in exclude
            and key not in handled
            and not (name is not None and key == "name")
        }
        clean = self.keys({k: v for k, v in table.items() if k not in handled}, path, list(fields))
        clean = clean and all(v is not None for v in handled.values())
        # A known good name, so the probes below fail only for the key they test.
        head = () if name is None else ("probe",)
        kwargs: dict[str, Any] = {}
        for key, raw in table.items():
            if key not in fields:
                continue
            converted = self.value(raw, fields[key], _join(path, key))
            if converted is None or not self._probe(cls, head, key, converted, path):
                clean = False
            else:
                kwargs[key] = converted
        if name is not None:
            try:
                cls(name)
            except _VALIDATION_ERRORS as exc:
                self.report(path, _reason(exc, cls, None))
                return None
        if not clean:
            return None
        args = () if name is None else (name,)
        try:
            return cls(*args, **{**(defaults or {}), **kwargs, **handled})
        except _VALIDATION_ERRORS as exc:
            self.report(path, _reason(exc, cls, None))
            return None

    def _probe(self, cls: Any, head: tuple[str, ...], key: str, value: Any, path: str) -> bool:
        """Run the class's checks on one key; report at the item of a list that fails."""
        try:
            cls(*head, **{key: value})
        except _VALIDATION_ERRORS as exc:
            where = _join(path, key)
            found = False
            for i, item in enumerate(value if isinstance(value, tuple) else ()):
                try:
                    cls(*head, **{key: (item,)})
                except _VALIDATION_ERRORS as item_exc:
                    self.report(f"{where}[{i}]", _reason(item_exc, cls, key))
                    found = True
            if not found:
                self.report(where, _reason(exc, cls, key))
            return False
        return True

    # --- sections ----------------------------------------------------------------------

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
