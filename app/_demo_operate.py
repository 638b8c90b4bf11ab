"""The demo's operations section: what an operator sees of a running node.

A management user reads the node through its management API over TCP (what
``meshbus show`` and ``meshbus queue`` do), a slow consumer is logged as it starts
discarding, a changed configuration file is applied to a running node (what
``meshbus run`` does on SIGHUP) and, with the ``metrics`` extra, Prometheus scrapes
the node and the readiness probe answers.
"""

from __future__ import annotations

import importlib.util
import logging

import anyio

from meshbus import ClientProfile, Node

from ._config import NodeConfig


class _Printed(logging.Handler):
    """Prints the node's warnings among the demo's lines."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"  log {record.levelname}: {record.getMessage()}")


async def _get(port: int, path: str) -> tuple[int, str]:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(f"GET {path} HTTP/1.1\r\nHost: demo\r\n\r\n".encode())
        answer = b""
        try:
            while True:
                answer += await stream.receive()
        except anyio.EndOfStream:
            pass
    head, _, body = answer.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def operate_demo() -> None:
    from meshbus.transports import ListenerSettings, RemoteManagement, connect, start_server

    print("\n== Operating a node: management API, slow-consumer log, config reload, metrics")
    handler = _Printed(logging.WARNING)
    session_log = logging.getLogger("meshbus.session")
    session_log.addHandler(handler)
    try:
        async with Node(name="edge") as node:
            vpn = node.vpn()
            vpn.add_user("ops", management=True)
            vpn.add_client_profile(ClientProfile("small", egress_max_messages=5))
            vpn.add_user("dashboard", client_profile="small")
            node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
            server = await start_server(node, ListenerSettings(port=0))
            dashboard = node.connect(username="dashboard", client_name="dashboard")
            dashboard.subscribe("ticks")
            producer = node.connect(client_name="erp")
            for i in range(8):  # the dashboard reads none of them: it falls behind
                producer.publish("ticks", str(i))
            for i in range(3):
                await producer.send(f"orders/{i}", f"order {i}")

            async with connect(server.url, username="ops") as ops:
                manage = RemoteManagement(ops)
                about = await manage.node()
                print(f"  node {about['name']!r}, meshbus {about['version']}, VPNs {about['vpns']}")
                rows = (await manage.connections())["connections"]
                slow = next(r for r in rows if r["client_name"] == "dashboard")
                print(
                    f"  {len(rows)} connections; 'dashboard' has {slow['egress_messages']}"
                    f" waiting and {slow['discarded']} discarded"
                )
                (queue,) = (await manage.queues())["queues"]
                print(f"  queue {queue['name']!r} holds {queue['messages']} message(s)")
                purged = await manage.purge_queue("orders")
                print(f"  purged {purged['purged']} message(s) from 'orders' as user 'ops'")

            await _reload_demo()
            if importlib.util.find_spec("prometheus_client") is None:
                print("  metrics: skipped: pip install 'meshbus[metrics]' to see it")
                return
            from meshbus.transports import serve_metrics

            endpoint = await serve_metrics(node, "127.0.0.1:0", listeners=1)
            status, text = await _get(endpoint.port, "/metrics")
            wanted = ("meshbus_node_discarded_total", 'meshbus_queue_messages{kind="queue"')
            for line in text.splitlines():
                if line.startswith(wanted):
                    print(f"  scraped: {line}")
            status, text = await _get(endpoint.port, "/readyz")
            print(f"  /readyz: {status} {text.strip()}")
    finally:
        session_log.removeHandler(handler)


_FILE = """
[vpns.default.queues.orders]
subscriptions = ["orders/>"]
"""


async def _reload_demo() -> None:
    """What ``meshbus run`` does on SIGHUP: the file read again, applied to the
    running node, or refused whole."""
    import tempfile
    import tomllib

    from meshbus import ConfigurationError

    from ._config import parse_config
    from ._config_reload import reload_node

    def read(text: str, folder: str) -> NodeConfig:
        return parse_config(tomllib.loads(text), source="edge.toml", environ={}, base_dir=folder)

    with tempfile.TemporaryDirectory() as folder:
        running = read(_FILE, folder)
        node = running.build_node()
        async with node:
            await running.provision(node)
            edited = _FILE.replace('["orders/>"]', '["orders/>", "returns/>"]')
            edited += '[vpns.default.users.night-shift]\nacl_profile = "default"\n'
            for change in await reload_node(node, running, read(edited, folder)):
                print(f"  reload (SIGHUP): {change}")
            (orders,) = node.guaranteed.queue_statistics()
            subscriptions = orders.subscriptions
            print(f"  queue 'orders' now subscribes to {list(subscriptions)}, no restart")
            try:
                await reload_node(node, running, read('[node]\nname = "x"\n' + _FILE, folder))
            except ConfigurationError as exc:
                print(f"  reload refused, nothing changed: {exc.problems[0]}")
