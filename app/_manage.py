"""``meshbus show`` and ``meshbus queue``: the management API of a running node.

Both log in like ``pub`` and ``sub`` (the same connection options) with a username
that has the management role, and call the node's ``management`` service through
:class:`meshbus.transports.RemoteManagement`. ``show`` prints a view as a table, or
as the service's JSON with ``--json``; ``queue`` acts on a queue of the VPN it
logged in to.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from meshbus.errors import MeshbusError
from meshbus.transports import RemoteManagement

from ._clients import _check_text, _columns, _connection_options, _session, links_table
from ._eventloop import run as run_on_loop

__all__ = ["VIEWS", "add_parsers", "run"]

VIEWS = ("node", "connections", "subscriptions", "queues", "links", "listeners")
"""What ``meshbus show`` shows."""

_ACTIONS = ("create", "delete", "purge", "ingress", "egress")


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``show`` and ``queue`` to the ``meshbus`` command."""
    show = commands.add_parser(
        "show", help="show a running node's state (needs the management role)"
    )
    show.add_argument("view", choices=VIEWS, help="what to show")
    _connection_options(show)
    options = show.add_argument_group("view")
    options.add_argument(
        "--only-vpn",
        metavar="VPN",
        help="only this VPN's connections, subscriptions, queues or links (default: every VPN)",
    )
    options.add_argument("--client", help="subscriptions: only this client name's")
    options.add_argument("--topic", help="subscriptions: only filters containing this text")
    options.add_argument(
        "--limit", type=int, default=1000, help="subscriptions: at most N rows (default: 1000)"
    )
    options.add_argument("--json", action="store_true", help="print the node's answer as JSON")

    queue = commands.add_parser(
        "queue", help="create, delete, purge or switch a queue (needs the management role)"
    )
    queue.add_argument("action", choices=_ACTIONS, help="what to do, in the VPN of --vpn")
    queue.add_argument("name", help="the queue")
    queue.add_argument(
        "state", nargs="?", choices=("on", "off"), help="ingress and egress: on or off"
    )
    _connection_options(queue)
    settings = queue.add_argument_group("create")
    settings.add_argument(
        "-s",
        "--subscription",
        action="append",
        default=[],
        metavar="FILTER",
        help="a topic filter the queue attracts (repeatable)",
    )
    settings.add_argument("--access-type", choices=("exclusive", "non-exclusive"))
    settings.add_argument("--max-messages", type=int, metavar="N", help="quota in messages")
    settings.add_argument("--max-bytes", type=int, metavar="N", help="quota in payload bytes")
    settings.add_argument("--max-redelivery", type=int, metavar="N")
    settings.add_argument("--dead-message-queue", metavar="QUEUE")
    settings.add_argument("--respect-ttl", action="store_true", default=None)
    queue.add_argument("--json", action="store_true", help="print the node's answer as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``show`` or ``queue``; print errors as one line and return 1."""
    try:
        _check_text(args)
        _check_text(args, _OWN_TEXT)
        if args.command == "queue":
            _check_queue_args(args)
        run_on_loop(_show if args.command == "show" else _queue, args)
    except MeshbusError as exc:
        print(f"meshbus {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
    return 0


_OWN_TEXT = {
    "only_vpn": "--only-vpn",
    "client": "--client",
    "topic": "--topic",
    "name": "NAME",
    "subscription": "--subscription",
    "dead_message_queue": "--dead-message-queue",
}


def _check_queue_args(args: argparse.Namespace) -> None:
    switching = args.action in ("ingress", "egress")
    if switching and args.state is None:
        raise MeshbusError(f"queue {args.action} needs 'on' or 'off'")
    if not switching and args.state is not None:
        raise MeshbusError(f"queue {args.action} takes no {args.state!r}")
    if args.action != "create" and _settings(args):
        raise MeshbusError(f"queue settings are for 'queue create', not 'queue {args.action}'")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    given = {
        "subscriptions": args.subscription or None,
        "access_type": args.access_type,
        "max_messages": args.max_messages,
        "max_bytes": args.max_bytes,
        "max_redelivery": args.max_redelivery,
        "dead_message_queue": args.dead_message_queue,
        "respect_ttl": args.respect_ttl,
    }
    return {key: value for key, value in given.items() if value is not None}


async def _show(args: argparse.Namespace) -> None:
    async with _session(args) as session:
        manage = RemoteManagement(session)
        vpn = args.only_vpn
        if args.view == "node":
            answer = await manage.node()
        elif args.view == "connections":
            answer = await manage.connections(vpn)
        elif args.view == "subscriptions":
            answer = await manage.subscriptions(
                vpn, client=args.client, topic=args.topic, limit=args.limit
            )
        elif args.view == "queues":
            answer = await manage.queues(vpn)
        elif args.view == "links":
            answer = await manage.links(vpn)
        else:
            answer = await manage.listeners()
    if args.json:
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(TABLES[args.view](answer)))


async def _queue(args: argparse.Namespace) -> None:
    async with _session(args) as session:
        manage = RemoteManagement(session)
        name, action = args.name, args.action
        if action == "create":
            answer = await manage.create_queue(name, **_settings(args))
            said = f"queue {name} in VPN {answer['vpn']}: {_queue_state(answer)}"
        elif action == "delete":
            answer = await manage.delete_queue(name)
            said = f"deleted queue {name}"
        elif action == "purge":
            answer = await manage.purge_queue(name)
            said = f"purged {answer['purged']} message(s) from queue {name}"
        else:
            on = args.state == "on"
            answer = await manage.enable_queue(name, **{action: on})
            said = f"queue {name}: {_queue_state(answer)}"
    if args.json:
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    else:
        print(said)


def _queue_state(stats: dict[str, Any]) -> str:
    ingress = "on" if stats["ingress_enabled"] else "off"
    egress = "on" if stats["egress_enabled"] else "off"
    return f"{stats['messages']} message(s), ingress {ingress}, egress {egress}"


# --- tables ----------------------------------------------------------------------------------


def node_table(node: dict[str, Any]) -> list[str]:
    """The lines of ``meshbus show node``."""
    memory, cpu, rates, totals = node["memory"], node["cpu"], node["rates"], node["totals"]
    rss = _size(memory["rss_bytes"]) if memory["rss_bytes"] is not None else "unknown"
    peak = memory["peak_rss_bytes"]
    if rates["published_per_second"] is None:
        rate = "not measured yet"
    else:
        rate = (
            f"{rates['published_per_second']:.1f} published/s, "
            f"{rates['delivered_per_second']:.1f} delivered/s "
            f"(over {rates['window']:.1f} s)"
        )
    rows = [
        ("node", f"{node['name']} (id {node['node_id']}, cluster {node['cluster'] or '-'})"),
        ("version", node["version"]),
        ("uptime", _duration(node["uptime"]) if node["uptime"] is not None else "-"),
        ("memory", f"rss {rss}" + (f" (peak {_size(peak)})" if peak is not None else "")),
        ("cpu", f"user {cpu['user_seconds']:.2f} s, system {cpu['system_seconds']:.2f} s"),
        ("rates", rate),
        (
            "totals",
            f"{totals['sessions']} session(s), {totals['published']} published, "
            f"{totals['delivered']} delivered, {totals['discarded']} discarded, "
            f"{totals['denied']} denied, {totals['unmatched']} unmatched, "
            f"{totals['login_failures']} failed login(s)",
        ),
        ("vpns", ", ".join(node["vpns"])),
        (
            "management",
            f"{node['management']['calls']} call(s), {node['management']['refused']} refused",
        ),
    ]
    return [f"{key:<11} {value}" for key, value in rows]


def connections_table(answer: dict[str, Any]) -> list[str]:
    """The lines of ``meshbus show connections``."""
    rows = [
        ("VPN", "CLIENT", "USERNAME", "ADDRESS", "SUBS", "EGRESS", "DISCARDED", "IN", "OUT", "FOR")
    ]
    now = time.time()
    for c in answer["connections"]:
        remote = c["transport"] is not None
        rows.append(
            (
                c["vpn"],
                c["client_name"],
                c["username"],
                c["address"] if remote else "(in process)",
                str(c["subscriptions"]),
                f"{c['egress_messages']}/{_size(c['egress_bytes'])}",
                str(c["discarded"]),
                _size(c["bytes_received"]) if remote else "-",
                _size(c["bytes_sent"]) if remote else "-",
                _duration(now - c["connected_since"]) if remote else "-",
            )
        )
    return _columns(rows) if len(rows) > 1 else ["no connections"]


def subscriptions_table(answer: dict[str, Any]) -> list[str]:
    """The lines of ``meshbus show subscriptions``."""
    rows = [("VPN", "CLIENT", "SUBSCRIPTION")]
    rows += [(s["vpn"], s["client_name"], s["subscription"]) for s in answer["subscriptions"]]
    lines = _columns(rows) if len(rows) > 1 else ["no subscriptions"]
    if answer["truncated"]:
        lines.append(f"({len(rows) - 1} of {answer['total']} shown: see --limit)")
    return lines


def queues_table(answer: dict[str, Any]) -> list[str]:
    """The lines of ``meshbus show queues``."""
    if not answer["available"]:
        return [f"no queues: {answer['reason']}"]
    rows = [
        (
            "VPN",
            "NAME",
            "KIND",
            "MESSAGES",
            "BYTES",
            "QUOTA",
            "FLOWS",
            "IN-FLIGHT",
            "REDELIVERED",
            "DMQ",
            "INGRESS",
            "EGRESS",
        )
    ]
    for q in answer["queues"]:
        quota = "/".join(
            (
                str(q["max_messages"]) if q["max_messages"] is not None else "-",
                _size(q["max_bytes"]) if q["max_bytes"] is not None else "-",
            )
        )
        rows.append(
            (
                q["vpn"],
                q["name"],
                q["kind"],
                str(q["messages"]),
                _size(q["bytes"]),
                quota,
                str(q["flows"]),
                str(q["in_flight"]),
                str(q["redelivered"]),
                q["dead_message_queue"] or "-",
                "on" if q["ingress_enabled"] else "off",
                "on" if q["egress_enabled"] else "off",
            )
        )
    return _columns(rows) if len(rows) > 1 else ["no queues"]


def links_view_table(answer: dict[str, Any]) -> list[str]:
    """The lines of ``meshbus show links``: as ``meshbus stats --links`` prints them."""
    links: dict[str, dict[str, Any]] = {}
    for row in answer["links"]:
        links.setdefault(row["vpn"], {})[row["name"]] = row
    plugins = {vpn: {"dmr": figures} for vpn, figures in answer["routing"].items()}
    return links_table({"links": links, "plugins": plugins})


def listeners_table(answer: dict[str, Any]) -> list[str]:
    """The lines of ``meshbus show listeners``."""
    rows = [("URL", "ACCEPTED", "OPEN", "LOGINS", "REFUSED", "FAILED", "TURNED-AWAY", "IN", "OUT")]
    for s in answer["listeners"]:
        rows.append(
            (
                s["url"],
                str(s["accepted"]),
                str(s["open"]),
                str(s["logins"]),
                str(s["refused"]),
                str(s["failed"]),
                str(s["turned_away"]),
                _size(s["bytes_received"]),
                _size(s["bytes_sent"]),
            )
        )
    return _columns(rows) if len(rows) > 1 else ["no listeners"]


TABLES: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "node": node_table,
    "connections": connections_table,
    "subscriptions": subscriptions_table,
    "queues": queues_table,
    "links": links_view_table,
    "listeners": listeners_table,
}


def _size(n: int) -> str:
    """Bytes for people: ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    """``42s``, ``5m03s``, ``2h05m``, ``3d04h``."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
