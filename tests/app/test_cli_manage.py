"""``meshbus show`` and ``meshbus queue`` against a running node.

Most tests run the command in a worker thread (its own event loop, as from a shell)
against a node of the test's loop listening on TCP; the last one runs ``meshbus run``
and the commands as processes of their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import orjson
import pytest

from meshbus import Node
from meshbus.app._cli import main
from meshbus.transports import ListenerSettings, Management, start_server
from tests.test_e2e import NODE, Process, Setup, Start

pytestmark = pytest.mark.anyio

PASSWORD = "ops-secret"


class Cli:
    """Runs ``meshbus`` commands against one node, as ``ops`` unless told otherwise."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url
        self.capsys = capsys

    async def __call__(self, *args: str, user: str = "ops") -> tuple[int, str, str]:
        """Exit status, standard output and standard error of ``meshbus ARGS``."""
        login = ["--url", self.url, "--vpn", "shop", "-u", user, "-P", PASSWORD]
        status = await anyio.to_thread.run_sync(main, [*args, *login])
        out, err = self.capsys.readouterr()
        return status, out, err

    async def json(self, *args: str) -> dict[str, object]:
        status, out, err = await self(*args, "--json")
        assert (status, err) == (0, ""), err
        answer = orjson.loads(out)
        assert isinstance(answer, dict)
        return answer


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    async with Node(name="cli-node") as running:
        shop = running.create_vpn("shop", authentication="basic")
        shop.add_user("ops", password=PASSWORD, management=True)
        shop.add_user("clerk", password=PASSWORD)
        running.guaranteed.create_queue("orders", vpn="shop", subscriptions=["orders/>"])
        yield running


@pytest.fixture
async def cli(node: Node, capsys: pytest.CaptureFixture[str]) -> Cli:
    server = await start_server(node, ListenerSettings(port=0))
    return Cli(server.url, capsys)


async def test_show_node(node: Node, cli: Cli) -> None:
    status, out, err = await cli("show", "node")
    assert (status, err) == (0, "")
    lines = dict(line.split(None, 1) for line in out.splitlines())
    assert lines["node"].startswith(f"cli-node (id {node.node_id}, cluster -)")
    assert lines["vpns"] == "default, shop"
    assert lines["memory"].startswith("rss ")
    assert "published/s" in lines["rates"]
    shown = await cli.json("show", "node")
    assert shown["name"] == "cli-node"
    assert shown["management"] == {"calls": 1, "refused": 0}  # this call is counted after


async def test_show_connections_and_subscriptions(node: Node, cli: Cli) -> None:
    app = await node.login("shop", username="clerk", password=PASSWORD, client_name="app")
    for topic in ("orders/new", "orders/paid", "stock/>"):
        app.subscribe(topic)
    status, out, err = await cli("show", "connections", "--only-vpn", "shop")
    assert (status, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == [
        "VPN", "CLIENT", "USERNAME", "ADDRESS", "SUBS", "EGRESS", "DISCARDED", "IN", "OUT", "FOR",
    ]  # fmt: skip
    assert rows[0].split()[:5] == ["shop", "app", "clerk", "(in", "process)"]
    own = rows[1].split()  # the command's own session
    assert own[2] == "ops"
    assert own[3].startswith("127.0.0.1:")
    answer = await cli.json("show", "connections")
    first = answer["connections"][0]  # type: ignore[index]
    assert (first["client_name"], first["transport"]) == ("app", None)

    status, out, _ = await cli("show", "subscriptions", "--topic", "orders", "--limit", "1")
    assert status == 0
    assert out.splitlines() == [
        "VPN   CLIENT  SUBSCRIPTION",
        "shop  app     orders/new",
        "(1 of 2 shown: see --limit)",
    ]
    answer = await cli.json("show", "subscriptions", "--client", "app")
    assert answer["total"] == 3


async def test_show_queues_links_and_listeners(node: Node, cli: Cli) -> None:
    await (await node.login("shop", username="clerk", password=PASSWORD)).send(
        "orders/1", b"x" * 2048
    )
    status, out, _ = await cli("show", "queues")
    assert status == 0
    header, row = out.splitlines()
    assert header.split()[:6] == ["VPN", "NAME", "KIND", "MESSAGES", "BYTES", "QUOTA"]
    assert row.split() == [
        "shop", "orders", "queue", "1", "2.0", "KiB", "-/-", "0", "0", "0", "-", "on", "on",
    ]  # fmt: skip
    assert (await cli.json("show", "queues")) == Management(node).queues()

    status, out, _ = await cli("show", "links")
    assert (status, out) == (0, "no links\n")

    status, out, _ = await cli("show", "listeners")
    header, row = out.splitlines()
    assert header.split()[:3] == ["URL", "ACCEPTED", "OPEN"]
    assert row.split()[0] == cli.url
    listeners = await cli.json("show", "listeners")
    assert listeners["listeners"][0]["logins"] >= 4  # type: ignore[index]


async def test_queue_actions(node: Node, cli: Cli) -> None:
    status, out, err = await cli("queue", "create", "audit", "-s", "audit/>", "--max-messages", "5")
    assert (status, out, err) == (
        0,
        "queue audit in VPN shop: 0 message(s), ingress on, egress on\n",
        "",
    )
    session = await node.login("shop", username="clerk", password=PASSWORD)
    await session.send("audit/1", b"a")
    await session.send("audit/2", b"b")
    assert await cli("queue", "purge", "audit") == (0, "purged 2 message(s) from queue audit\n", "")
    status, out, _ = await cli("queue", "ingress", "audit", "off")
    assert out == "queue audit: 0 message(s), ingress off, egress on\n"
    answer = await cli.json("queue", "egress", "audit", "off")
    assert (answer["ingress_enabled"], answer["egress_enabled"]) == (False, False)
    assert await cli("queue", "delete", "audit") == (0, "deleted queue audit\n", "")
    assert [q["name"] for q in Management(node).queues("shop")["queues"]] == ["orders"]

    status, _, err = await cli("queue", "purge", "audit")
    assert (status, err) == (1, "meshbus queue: error: no queue 'audit' in VPN 'shop'\n")
    status, _, err = await cli("queue", "ingress", "orders")
    assert (status, err) == (1, "meshbus queue: error: queue ingress needs 'on' or 'off'\n")
    status, _, err = await cli("queue", "purge", "orders", "--max-messages", "3")
    assert status == 1
    assert err == "meshbus queue: error: queue settings are for 'queue create', not 'queue purge'\n"
    status, _, err = await cli("queue", "create", "bad", "--max-messages", "-1")
    assert (status, err.startswith("meshbus queue: error: queue setting max_messages")) == (1, True)


@pytest.mark.parametrize(
    "args",
    [
        ["show", view]
        for view in ("node", "connections", "subscriptions", "queues", "links", "listeners")
    ]
    + [["queue", "purge", "orders"], ["queue", "egress", "orders", "off"]],
)
async def test_a_user_without_the_management_role_is_refused(
    node: Node, cli: Cli, args: list[str]
) -> None:
    status, out, err = await cli(*args, user="clerk")
    assert (status, out) == (1, "")
    assert err == (
        f"meshbus {args[0]}: error: manage denied for user 'clerk': the management role is needed\n"
    )
    assert Management(node).node()["management"]["refused"] == 1
    assert node.vpn("shop").statistics().denied == 1
    assert Management(node).queues("shop")["queues"][0]["egress_enabled"] is True


# --- against ``meshbus run`` ----------------------------------------------------------------


@pytest.fixture
def start(tmp_path: Path) -> Iterator[tuple[Setup, Start]]:
    setup = Setup(tmp_path, "tcp")
    started: list[Process] = []

    def start(args: list[str]) -> Process:
        started.append(Process(args, setup.folder, setup.env, setup.node))
        return started[-1]

    try:
        yield setup, start
    finally:
        for process in started:
            process.close()


@pytest.mark.slow  # about 3 s: a node and a command per view
def test_every_view_of_a_meshbus_run_node(start: tuple[Setup, Start]) -> None:
    setup, begin = start
    setup.start_node(begin)  # alice has the management role in VPN plant
    for view in ("node", "connections", "subscriptions", "queues", "links", "listeners"):
        shown = setup.command("show", view, *setup.options())
        assert shown.returncode == 0, (view, shown.stderr)
        assert shown.stdout.strip(), view
    answer = orjson.loads(setup.command("show", "node", "--json", *setup.options()).stdout)
    assert answer["name"] == NODE
    queues = orjson.loads(setup.command("show", "queues", "--json", *setup.options()).stdout)
    assert [(q["vpn"], q["name"]) for q in queues["queues"]] == [("plant", "alarms")]
    purged = setup.command("queue", "purge", "alarms", *setup.options())
    assert (purged.returncode, purged.stdout) == (0, "purged 0 message(s) from queue alarms\n")
