"""``meshbus pub``, ``sub`` and ``stats``: command-line clients of a running node."""

from __future__ import annotations

import argparse
import base64
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any

import orjson

from meshbus.errors import MeshbusError
from meshbus.transports import DEFAULT_PORT, RemoteSession, TlsSettings, connect

from ._eventloop import run as run_on_loop

__all__ = ["add_parsers", "run"]

DEFAULT_URL = f"tcp://127.0.0.1:{DEFAULT_PORT}"


def _connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--url",
        default=os.environ.get("MESHBUS_URL", DEFAULT_URL),
        help="tcp://HOST:PORT or tls://HOST:PORT (default: $MESHBUS_URL or %(default)s)",
    )
    group.add_argument("--vpn", default="default", help="Message VPN (default: %(default)s)")
    group.add_argument("-u", "--username", help="client username")
    group.add_argument(
        "-P", "--password", default=os.environ.get("MESHBUS_PASSWORD"), help="or $MESHBUS_PASSWORD"
    )
    group.add_argument("--client-name", help="client name (default: chosen by the node)")
    group.add_argument("--ca", help="PEM file of the CA to trust (tls://)")
    group.add_argument("--cert", help="client certificate PEM file (tls://)")
    group.add_argument("--key", help="client private key PEM file (tls://)")
    group.add_argument("--compression", action="store_true", help="compress the connection")


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``pub``, ``sub`` and ``stats`` to the ``meshbus`` command."""
    pub = commands.add_parser("pub", help="publish messages to a running node")
    _connection_options(pub)
    pub.add_argument("topic")
    pub.add_argument("message", nargs="?", help="payload ('-' or none: read stdin)")
    pub.add_argument("-f", "--file", help="read the payload from FILE ('-': stdin)")
    pub.add_argument(
        "-l", "--lines", action="store_true", help="one message per line of stdin or FILE"
    )
    pub.add_argument("-n", "--count", type=int, default=1, help="send the message N times")
    pub.add_argument(
        "-g", "--guaranteed", action="store_true", help="guaranteed (persistent) messages"
    )
    pub.add_argument("--header", action="append", default=[], metavar="KEY=VALUE")
    pub.add_argument(
        "-r",
        "--retain",
        action="store_true",
        help="keep it as the topic's last value for later subscribers (an empty MESSAGE clears it)",
    )
    pub.add_argument(
        "--ttl",
        type=float,
        metavar="SECONDS",
        help="time to live: the message expires SECONDS after it is published",
    )
    pub.add_argument(
        "-t",
        "--timestamps",
        action="store_true",
        help="have the node stamp direct messages with its clock (guaranteed ones always are)",
    )
    sub = commands.add_parser("sub", help="print messages from a running node")
    _connection_options(sub)
    sub.add_argument("subscriptions", nargs="*", help="topic filters (e.g. 'orders/>')")
    sub.add_argument("-q", "--queue", help="bind to this queue instead (guaranteed)")
    sub.add_argument("-C", "--count", type=int, default=0, help="exit after N messages")
    sub.add_argument("-F", "--format", choices=tuple(FORMATS), default="text", help="output format")
    sub.add_argument(
        "--reconnect",
        action="store_true",
        help="when the node goes away, reconnect (and say so on stderr) instead of exiting",
    )
    stats = commands.add_parser("stats", help="show a running node's statistics")
    _connection_options(stats)
    stats.add_argument(
        "--links",
        action="store_true",
        help="a table of the node's links and routing neighbours instead of everything",
    )


def _session(args: argparse.Namespace) -> RemoteSession:
    tls = None
    if args.ca or args.cert or args.key:
        tls = TlsSettings(ca=args.ca, certificate=args.cert, private_key=args.key)
    return connect(
        args.url,
        vpn=args.vpn,
        username=args.username,
        password=args.password,
        client_name=args.client_name,
        timestamps=getattr(args, "timestamps", False),
        tls=tls,
        compression=args.compression,
        reconnect=getattr(args, "reconnect", False),
    )


def run(args: argparse.Namespace) -> int:
    """Run ``pub``, ``sub`` or ``stats``; print errors as one line and return 1."""
    main = {"pub": _pub, "sub": _sub, "stats": _stats}[args.command]
    try:
        _check_text(args)
        run_on_loop(main, args)
    except MeshbusError as exc:
        print(f"meshbus {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # piped into `head` and the like: not an error
        sys.stderr.close()
    return 0


async def _pub(args: argparse.Namespace) -> None:
    headers = {}
    for item in args.header:
        key, sep, value = item.partition("=")
        if not sep:
            raise MeshbusError(f"--header needs KEY=VALUE, got {item!r}")
        headers[key] = value
    payloads = _payloads(args)
    async with _session(args) as session:
        for payload in payloads:
            if args.guaranteed:
                await session.send(
                    args.topic, payload, headers=headers or None, retain=args.retain, ttl=args.ttl
                )
            else:
                session.publish(
                    args.topic, payload, headers=headers or None, retain=args.retain, ttl=args.ttl
                )
        await session.confirm()
    print(f"published {len(payloads)} message(s) to {args.topic}", file=sys.stderr)


def _payloads(args: argparse.Namespace) -> list[bytes]:
    """What ``pub`` sends: the argument, the file or standard input, as bytes."""
    if args.message is not None and args.file is not None:
        raise MeshbusError("give a MESSAGE or --file, not both")
    if args.message is not None and args.message != "-":
        if args.lines:
            raise MeshbusError("--lines reads standard input or --file, not a MESSAGE")
        # The OS passes arguments as bytes and Python decodes them with surrogate
        # escapes: fsencode gives back the very bytes given, whether UTF-8 or not.
        return [os.fsencode(args.message)] * max(args.count, 1)
    path = args.file if args.file not in (None, "-") else None
    if path is None:
        return _read(sys.stdin.buffer, args)
    try:
        with open(path, "rb") as file:
            return _read(file, args)
    except OSError as exc:
        raise MeshbusError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read(source: IO[bytes], args: argparse.Namespace) -> list[bytes]:
    if args.lines:
        return [line.rstrip(b"\n") for line in source]
    return [source.read()] * max(args.count, 1)


# Options whose values go to the node as text (JSON strings): a name that is not
# UTF-8 (the OS hands it over with surrogate escapes) is refused here, naming it,
# rather than failing with a traceback deep in the encoder. Payloads are bytes, and
# file names are the OS's own, so neither is checked.
_TEXT_OPTIONS = {
    "topic": "TOPIC",
    "subscriptions": "FILTER",
    "queue": "--queue",
    "header": "--header",
    "url": "--url",
    "vpn": "--vpn",
    "username": "--username",
    "password": "--password",
    "client_name": "--client-name",
}


def _check_text(args: argparse.Namespace, options: dict[str, str] = _TEXT_OPTIONS) -> None:
    """Refuse arguments that are not UTF-8 text, naming the option (``options`` maps an
    argument's name to its spelling on the command line)."""
    for name, option in options.items():
        value = getattr(args, name, None)
        for each in value if isinstance(value, list) else [value]:
            if isinstance(each, str) and not each.isascii():
                try:
                    each.encode("utf-8")
                except UnicodeEncodeError:
                    raise MeshbusError(
                        f"{option} is not UTF-8 text: {os.fsencode(each)!r}"
                    ) from None


async def _sub(args: argparse.Namespace) -> None:
    if not args.subscriptions and not args.queue:
        raise MeshbusError("give at least one subscription, or --queue")
    if args.subscriptions and args.queue:
        raise MeshbusError("give subscriptions or --queue, not both")
    if args.reconnect:
        _report_reconnects()
    write = FORMATS[args.format]
    out = sys.stdout.buffer
    received = 0
    async with _session(args) as session:
        if args.queue:
            async with await session.bind(args.queue) as flow:
                print(f"bound to queue {args.queue}", file=sys.stderr)
                async for message in flow:
                    write(message, out)
                    out.flush()
                    flow.ack(message)
                    received += 1
                    if received == args.count:
                        return
        else:
            for subscription in args.subscriptions:
                session.subscribe(subscription)
            await session.confirm()
            print(f"subscribed to {', '.join(args.subscriptions)}", file=sys.stderr)
            async for message in session:
                write(message, out)
                out.flush()
                received += 1
                if received == args.count:
                    return
        # The messages stopped before COUNT: the node went away (or, for a queue, closed
        # the flow). Not a success, whatever the application side of the session saw.
        if session.lost is not None:
            raise session.lost
        raise MeshbusError(f"the node closed the flow of queue {args.queue!r}")


def _report_reconnects() -> None:
    """Show on stderr what the session logs as it loses, seeks and regains its node."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("meshbus sub: %(message)s"))
    logger = logging.getLogger("meshbus.transports")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _text(payload: bytes) -> str:
    # Bytes that are not UTF-8 are shown as \xNN escapes: visible, never replaced.
    return payload.decode("utf-8", "backslashreplace")


def _json(message: Any, out: IO[bytes]) -> None:
    try:
        payload, encoding = message.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(message.payload).decode("ascii"), "base64"
    record = {
        "topic": message.topic,
        "payload": payload,
        "payload_encoding": encoding,
        "sender": message.sender,
        "timestamp": message.timestamp,
        "headers": dict(message.headers),
        "delivery_mode": message.delivery_mode.value,
        "retained": message.retained,
        "expires_at": message.expires_at,
    }
    out.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))


def _raw(message: Any, out: IO[bytes]) -> None:
    out.write(message.payload)


def _line(payload: Callable[[bytes], str | bytes]) -> Callable[[Any, IO[bytes]], None]:
    def write(message: Any, out: IO[bytes]) -> None:
        shown = payload(message.payload)
        if isinstance(shown, str):
            shown = shown.encode("utf-8")
        out.write(b"%s %s\n" % (message.topic.encode("utf-8"), shown))

    return write


#: ``meshbus sub -F``: how each message is written to standard output (as bytes, so
#: what is shown does not depend on the locale).
FORMATS: dict[str, Callable[[Any, IO[bytes]], None]] = {
    "text": _line(_text),
    "json": _json,
    "raw": _raw,
    "hex": _line(bytes.hex),
    "base64": _line(base64.b64encode),
}


async def _stats(args: argparse.Namespace) -> None:
    async with _session(args) as session:
        stats = await session.node_statistics()
    if args.links:
        print("\n".join(links_table(stats)))
    else:
        print(orjson.dumps(stats, option=orjson.OPT_INDENT_2).decode())


def links_table(stats: dict[str, Any]) -> list[str]:
    """The lines of ``meshbus stats --links``: each link of each VPN (name, kind,
    state, peer, messages out and in, drops), then each routing neighbour."""
    rows = [("VPN", "LINK", "KIND", "STATE", "PEER", "OUT", "IN", "DROPPED")]
    for vpn, links in sorted(stats.get("links", {}).items()):
        for name, link in sorted(links.items()):
            dropped = sum(link.get("dropped", {}).values())
            rows.append(
                (
                    vpn,
                    name,
                    link["kind"],
                    link["state"],
                    link.get("peer_node") or "-",
                    str(link["forwarded"]),
                    str(link["received"]),
                    str(dropped),
                )
            )
    lines = _columns(rows) if len(rows) > 1 else ["no links"]
    for vpn, plugins in sorted(stats.get("plugins", {}).items()):
        routing = plugins.get("dmr")
        if not routing:
            continue
        lines.append("")
        lines.append(
            f"routing in VPN {vpn}: node {routing['node']} of cluster {routing['cluster']}, "
            f"{routing['state']}"
        )
        table = [("NEIGHBOUR", "KIND", "STATE", "INTEREST", "SENT", "UNREACHABLE")]
        for name, neighbour in sorted(routing["neighbours"].items()):
            interest = sum(neighbour["interest"].values())
            sent = neighbour.get("out", {}).get("messages", 0)
            unreachable = neighbour.get("out", {}).get("dropped", {}).get("unreachable", 0)
            table.append(
                (
                    name,
                    neighbour["kind"],
                    neighbour["state"],
                    str(interest),
                    str(sent),
                    str(unreachable),
                )
            )
        lines += _columns(table)
    return lines


def _columns(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
