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

    [metrics]                    # a Prometheus endpoint with /healthz and /readyz (default:
    listen = "127.0.0.1:9464"    # none); keys: the fields of MetricsSettings (listen,
                                 # request_timeout, max_connections, max_request_size);
                                 # needs the 'metrics' extra (prometheus_client)

    [vpns.NAME]                  # default: one VPN "default" with authentication "none"
    authentication = "basic"     # "none" | "basic" | "client-certificate"
    [vpns.NAME.client_profiles.PROFILE]   # keys: the fields of meshbus.ClientProfile
    [vpns.NAME.acl_profiles.PROFILE]      # keys: the fields of meshbus.AclProfile
    [vpns.NAME.users.USERNAME]            # password, client_profile, acl_profile,
                                          # subscription_manager, management, enabled
                                          # (Vpn.add_user)
    [vpns.NAME.queues.QUEUE]              # the guaranteed plugin's tables: the fields of
                                          # QueueSettings (subscriptions, access_type, ...)
    [vpns.NAME.topic_endpoints.ENDPOINT]  # the same but subscriptions (given at bind)

    [TABLE] and [vpns.NAME.TABLE]         # any table a loaded plugin declares
                                          # (meshbus_config_sections)

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
  disabled). A plugin's table needs the plugin loaded (``queues`` and
  ``topic_endpoints`` are the ``guaranteed`` plugin's); the plugin checks it.

The whole file is checked before anything is built, and every problem is reported
at once: :func:`load_config` raises one :class:`~meshbus.ConfigurationError`
whose ``problems`` hold one line each, ``"FILE: key.path: why"``.

This module holds the entry points (:func:`load_config`, :func:`parse_config`,
:func:`default_config`); the parsed configuration is in :mod:`meshbus.app._config_model`,
the section readers in :mod:`meshbus.app._config_schema` and the value checks and
``${ENV:NAME}`` expansion they share in :mod:`meshbus.app._config_values`.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._config_model import NodeConfig, UserConfig, VpnConfig
from ._config_schema import DEFAULT_DATA_DIR, _Checker
from ._config_values import _failure

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

_TOML_POSITION = re.compile(r"(.*) \(at (?:line (\d+), column (\d+)|end of document)\)\Z", re.S)


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


def _toml_error(exc: tomllib.TOMLDecodeError) -> str:
    match = _TOML_POSITION.match(str(exc))
    if match is None:
        return f"invalid TOML: {exc}"
    message, line, column = match.groups()
    where = "end of file" if line is None else f"line {line}, column {column}"
    return f"{where}: invalid TOML: {message}"
