"""The ``meshbus run`` command: serve a node from a configuration file until stopped.

::

    meshbus run [CONFIG] [--listen HOST:PORT ...] [--metrics HOST:PORT]
                [--log-level LEVEL] [--log-format text|json] [--log-file PATH]

Without ``CONFIG`` the node takes :func:`meshbus._config.default_config`: one VPN
``"default"`` open to all, a plain TCP listener on 127.0.0.1:55555 and its data in
``./meshbus-data``. ``--listen`` (repeatable) replaces the configured listeners with
plain TCP ones on those addresses (port 0 picks a free port). ``--metrics`` serves
the Prometheus endpoint with its health probes there (the ``[metrics]`` table's
``listen``; it needs the ``metrics`` extra), printed as ``meshbus run: node NAME
metrics on http://HOST:PORT/metrics`` before the listeners start.

It prints one line per listener, ``meshbus run: node NAME listening on
tcp://HOST:PORT`` (``tls://`` for TLS), then one per listener of a plugin (the
``mqtt://``, ``mqtts://``, ``ws://`` or ``wss://`` ones of ``[[mqtt.listeners]]``),
then serves until SIGINT
or SIGTERM, when it prints ``meshbus run: stopping (SIGTERM)``, closes the listeners
and stops the node.

On SIGHUP it reads CONFIG again and applies what changed and can change while the node
runs (:mod:`meshbus.app._config_reload`: profiles, usernames, bridges and their
subscriptions, new queues and queue subscriptions, MQTT listeners), printing a line
for each plugin listener that opened (``listening on``) or closed (``no longer
listening on``), then ``meshbus run: reloaded CONFIG: N changes``. A file that is
invalid, or changes something that takes a restart, is refused as a whole: every
reason goes to standard error, and the node runs on as before.
Once the listeners are up, the process tunes its garbage collector for a node's
many short-lived objects (:mod:`meshbus.app._collector`).

Exit status: 0 after a clean stop, 1 when the node or a listener fails to start or
stops on an error, 2 for an invalid configuration (every problem is printed to
standard error, and nothing is started).
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs

from meshbus import ConfigurationError, MeshbusError, Node, __version__
from meshbus.transports import ListenerSettings, MetricsSettings, serve_metrics, start_server
from meshbus.transports._metrics import prometheus_missing, split_address

from ._collector import tune_collector
from ._config import NodeConfig, default_config, load_config
from ._config_reload import reload_node
from ._eventloop import LOOPS
from ._eventloop import run as run_on_loop
from ._logging import FORMATS, configure_logging

__all__ = ["add_parser", "main", "parse_address", "run"]

log = logging.getLogger("meshbus.run")

_PREFIX = "meshbus run:"


def parse_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:PORT"`` for IPv6) as ``(host, port)``.

    :raises ValueError: it is not of that form, or the port is not 0 to 65535.
    """
    return split_address(text)


def _address(text: str) -> str:
    """An argparse ``type`` checking ``--listen`` values (kept as text for :func:`main`)."""
    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add the ``run`` command to the ``meshbus`` command's subparsers.

    The parsed arguments are for :func:`run`.

    :param subparsers: what :meth:`argparse.ArgumentParser.add_subparsers` returned.
    :returns: the parser of ``run``.
    """
    parser = subparsers.add_parser(
        "run",
        help="serve a node from a configuration file until SIGINT or SIGTERM",
        description="Serve a meshbus node: its VPNs, profiles, users and queues come "
        "from CONFIG (TOML; see examples/edge-node.toml), or the defaults without it.",
    )
    parser.add_argument(
        "config", nargs="?", metavar="CONFIG", help="the node's configuration file (TOML)"
    )
    parser.add_argument(
        "--listen",
        action="append",
        default=[],
        type=_address,
        metavar="HOST:PORT",
        help="listen for plain TCP here instead of the configured listeners (repeatable; "
        "port 0 picks a free port)",
    )
    parser.add_argument(
        "--metrics",
        type=_address,
        metavar="HOST:PORT",
        help="serve Prometheus metrics, /healthz and /readyz over HTTP here (instead of "
        "the [metrics] table's address; needs the 'metrics' extra)",
    )
    parser.add_argument(
        "--loop",
        default="auto",
        choices=LOOPS,
        help="event loop: auto (uvloop when installed, else asyncio), asyncio, uvloop or trio",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="what is logged (default: info)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=FORMATS,
        help="text lines, or one JSON object per line (default: text)",
    )
    parser.add_argument(
        "--log-file",
        metavar="PATH",
        help="append the log to this file instead of standard error (reopened when it "
        "is rotated away)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Carry out a ``meshbus run`` command parsed by a parser from :func:`add_parser`.

    :returns: the exit status (see :func:`main`).
    """
    try:
        configure_logging(args.log_level, args.log_format, args.log_file)
    except (OSError, ValueError) as exc:
        print(f"{_PREFIX} --log-file: cannot log there: {exc}", file=sys.stderr)
        return 2
    return main(args.config, args.listen, args.loop, metrics=args.metrics)


def main(
    config_path: str | None,
    listen: Sequence[str] = (),
    loop: str = "auto",
    *,
    metrics: str | None = None,
) -> int:
    """Serve the node ``config_path`` describes (the defaults for ``None``) until
    SIGINT or SIGTERM. Call it from the main thread: it runs its own event loop.

    :param listen: ``HOST:PORT`` addresses replacing the configured listeners.
    :param metrics: ``HOST:PORT`` of the metrics endpoint, replacing the configured one.
    :returns: the exit status: 0 after a clean stop, 1 when the node or a listener
        failed, 2 for an invalid configuration or ``--listen`` address.
    """
    try:
        addresses = [parse_address(text) for text in listen]
    except ValueError as exc:
        print(f"{_PREFIX} --listen: {exc}", file=sys.stderr)
        return 2
    if metrics is not None:
        try:
            parse_address(metrics)
        except ValueError as exc:
            print(f"{_PREFIX} --metrics: {exc}", file=sys.stderr)
            return 2
        missing = prometheus_missing()
        if missing is not None:
            print(f"{_PREFIX} --metrics: {missing}", file=sys.stderr)
            return 2
    load = functools.partial(_load, config_path, addresses, metrics)
    try:
        config = load()
        node = config.build_node()
    except ConfigurationError as exc:
        _print_problems(exc, config_path)
        return 2
    log.info("serving node %r from %s (meshbus %s)", node.name, config.source, __version__)
    log.info("plugins: %s", ", ".join(_describe_plugins(node)) or "none")
    try:
        return run_on_loop(_serve, config, node, load, loop=loop)
    except ConfigurationError as exc:  # a queue refused at provisioning
        _print_problems(exc, config.source)
        return 2
    except (MeshbusError, OSError) as exc:
        print(f"{_PREFIX} node {node.name} failed: {exc}", file=sys.stderr)
        return 1


def _load(
    config_path: str | None, addresses: Sequence[tuple[str, int]], metrics: str | None
) -> NodeConfig:
    """The configuration file (the defaults without one) with the command line's
    ``--listen`` and ``--metrics`` in place of its listeners and metrics address."""
    config = default_config(Path.cwd()) if config_path is None else load_config(config_path)
    if addresses:
        listeners = tuple(ListenerSettings(host=host, port=port) for host, port in addresses)
        config = attrs.evolve(config, listeners=listeners)
    if metrics is not None:
        settings = attrs.evolve(config.metrics or MetricsSettings(), listen=metrics)
        config = attrs.evolve(config, metrics=settings)
    return config


def _describe_plugins(node: Node) -> list[str]:
    """``NAME (MODULE)`` for each plugin the node loaded, by name."""
    described = []
    for name in sorted(node.plugins.names()):
        plugin = node.plugins.get(name)
        module = getattr(plugin, "__name__", None) or type(plugin).__module__
        described.append(name if module == name else f"{name} ({module})")
    return described


def _print_problems(exc: ConfigurationError, source: str | None) -> None:
    lines = [f"{_PREFIX} invalid configuration {source or '<defaults>'}:"]
    lines += [f"  {problem}" for problem in exc.problems]
    print("\n".join(lines), file=sys.stderr, flush=True)


async def _serve(config: NodeConfig, node: Node, load: Callable[[], NodeConfig]) -> int:
    # Opened first, so a signal that comes while the node starts is not lost.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with node:
            # Before provisioning and the listeners: probes see the node start.
            endpoint = await _serve_metrics(config, node)
            if endpoint is False:
                return 1
            await config.provision(node)
            servers: list[Any] = [] if endpoint is None else [endpoint]  # closed last
            try:
                for settings in config.listeners:
                    try:
                        server = await start_server(node, settings)
                    except (OSError, MeshbusError) as exc:
                        where, why = f"{settings.host}:{settings.port}", str(exc)
                        # The transports' errors already name the address.
                        why = why if where in why else f"cannot listen on {where}: {why}"
                        print(f"{_PREFIX} {why}", file=sys.stderr)
                        return 1
                    servers.append(server)
                    print(f"{_PREFIX} node {node.name} listening on {server.url}", flush=True)
                # Then the plugins' listeners (MQTT ...), started as the node was provisioned.
                urls = node.plugins.listening(node)
                for url in urls:
                    print(f"{_PREFIX} node {node.name} listening on {url}", flush=True)
                if not config.listeners and not urls:
                    log.warning("no listeners: only in-process sessions can reach the node")
                tune_collector()  # once started: what start-up made stays frozen
                log.debug(
                    "garbage collector: thresholds %s, %d start-up objects frozen",
                    gc.get_threshold(),
                    gc.get_freeze_count(),
                )
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        config = await _reload(node, config, load, [*servers, *_mqtt(node)])
                        continue
                    name = signal.Signals(signum).name
                    print(f"{_PREFIX} stopping ({name})", flush=True)
                    log.info("stopping node %r on %s", node.name, name)
                    break
            finally:
                with anyio.CancelScope(shield=True):
                    for server in reversed(servers):
                        await server.aclose()
    return 0


async def _reload(
    node: Node, running: NodeConfig, load: Callable[[], NodeConfig], listeners: list[Any]
) -> NodeConfig:
    """SIGHUP: read the file again and apply what changed (:func:`reload_node`), and
    read the TLS listeners' certificate files again (rotated in place, their paths do
    not change); the configuration the node runs with afterwards."""
    source = running.source
    if source == "<defaults>":
        print(f"{_PREFIX} SIGHUP: no configuration file to reload", file=sys.stderr, flush=True)
        return running
    secure = [x for x in listeners if getattr(x, "read_certificates", None) is not None]

    def read() -> tuple[NodeConfig, list[tuple[Any, Any]]]:
        new = load()
        contexts, problems = [], []
        for listener in secure:
            try:
                context = listener.read_certificates()
            except ConfigurationError as exc:
                problems.append(f"{source}: the listener on {listener.url}: {exc}")
                continue
            if context is not None:
                contexts.append((listener, context))
        if problems:
            raise ConfigurationError("its certificates cannot be read", problems)
        return new, contexts

    try:
        new, certificates = await anyio.to_thread.run_sync(read)
    except ConfigurationError as exc:
        _refused(f"reload of {source} refused, nothing changed: {exc}", exc.problems)
        return running
    listening = node.plugins.listening(node)
    try:
        changes = await reload_node(node, running, new)
    except ConfigurationError as exc:
        _refused(str(exc), exc.problems)
        return running
    now = node.plugins.listening(node)
    for url in listening:
        if url not in now:
            print(f"{_PREFIX} node {node.name} no longer listening on {url}", flush=True)
    for url in now:
        if url not in listening:
            print(f"{_PREFIX} node {node.name} listening on {url}", flush=True)
    for listener, context in certificates:
        listener.use_certificates(context)
    count = len(changes)
    said = f"{_PREFIX} reloaded {source}: {count} change{'' if count == 1 else 's'}"
    if certificates:
        said += f"; certificates read again for {len(certificates)} TLS listener(s)"
    print(said, flush=True)
    return new


def _mqtt(node: Node) -> list[Any]:
    """The node's MQTT listeners (none when the plugin is not loaded)."""
    if node.plugins.get("mqtt") is None:
        return []
    from meshbus.plugins.mqtt import listeners_of

    return listeners_of(node)


def _refused(why: str, problems: Sequence[str]) -> None:
    lines = [f"{_PREFIX} {why}:"] + [f"  {problem}" for problem in problems]
    print("\n".join(lines), file=sys.stderr, flush=True)
    log.warning("%s", why)


async def _serve_metrics(config: NodeConfig, node: Node) -> Any:
    """Start the configured metrics endpoint: it, ``None`` without one, ``False`` when
    it failed (printed)."""
    if config.metrics is None:
        return None
    try:
        endpoint = await serve_metrics(node, config.metrics, listeners=len(config.listeners))
    except MeshbusError as exc:
        print(f"{_PREFIX} cannot serve metrics: {exc}", file=sys.stderr)
        return False
    print(f"{_PREFIX} node {node.name} metrics on {endpoint.url}/metrics", flush=True)
    return endpoint
