"""Dynamic message routing (SPEC 8): two clusters, joined by their gateways.

Cluster ``eu`` has nodes ``eu-1`` and ``eu-2`` (its gateway); cluster ``us`` has
``us-1`` (its gateway). Each node tells its neighbours what its clients want; a
publish goes once over each link whose far side wants it; a reply finds its way back
to the requester's node; guaranteed messages wait for a node that is away.

Run it: ``python examples/dmr_mesh.py``. The three nodes run in this process and talk
over TCP on free ports of 127.0.0.1.
"""

from __future__ import annotations

import anyio
import attrs

from meshbus import Node
from meshbus.plugins.dmr import DmrSettings, Peer, start_dmr
from meshbus.transports import ListenerSettings, start_server

CLUSTERS = {"eu-1": "eu", "eu-2": "eu", "us-1": "us"}


def allow_links(node: Node) -> None:
    """Let the nodes' default users open routing links (their profile must allow it)."""
    vpn = node.vpn()
    vpn.add_client_profile(
        attrs.evolve(vpn.client_profiles["default"], allow_bridge_connections=True)
    )


async def main() -> None:
    nodes = {name: Node(name=name, cluster=cluster) for name, cluster in CLUSTERS.items()}
    async with nodes["eu-1"], nodes["eu-2"], nodes["us-1"]:
        urls = {}
        for name, node in nodes.items():
            allow_links(node)
            server = await start_server(node, ListenerSettings(port=0))
            urls[name] = server.url
        peers = {
            "eu-1": [Peer("eu-2", urls["eu-2"])],
            "eu-2": [Peer("eu-1", urls["eu-1"]), Peer("us-1", urls["us-1"], cluster="us")],
            "us-1": [Peer("eu-2", urls["eu-2"], cluster="eu")],
        }
        with anyio.fail_after(10):
            routers = {
                name: await start_dmr(node, DmrSettings(peers[name]), wait=False)
                for name, node in nodes.items()
            }
            for router in routers.values():
                await router.wait_in_sync()

        # Three clients on eu-1 want the same topic: one advertisement per link.
        clients = [nodes["eu-1"].connect(client_name=f"desk-{i}") for i in range(3)]
        for client in clients:
            client.subscribe("fx/eur-usd")
        with anyio.fail_after(10):  # until us-1 knows (through eu-2)
            while "fx/eur-usd" not in routers["us-1"].neighbour("eu-2").learned["d"]:
                await anyio.sleep(0.01)
        print("us-1 learned from eu-2:", sorted(routers["us-1"].neighbour("eu-2").learned["d"]))

        # A publish in us reaches the three desks in eu: one copy over each link.
        nodes["us-1"].connect(client_name="feed").publish("fx/eur-usd", b"1.0842")
        with anyio.fail_after(10):
            got = [await client.receive() for client in clients]
        print("desks got:", [m.payload.decode() for m in got])
        sent = routers["us-1"].neighbour("eu-2").out
        relayed = routers["eu-2"].neighbour("eu-1").out
        assert sent is not None
        assert relayed is not None
        print(
            "copies: us-1 -> eu-2:",
            sent.statistics().forwarded,
            "eu-2 -> eu-1:",
            relayed.statistics().forwarded,
        )

        # Request/reply across both clusters, the reply routed to the requester's node.
        pricer = nodes["us-1"].connect(client_name="pricer")
        pricer.subscribe("quote/request")
        with anyio.fail_after(10):
            while "quote/request" not in routers["eu-1"].neighbour("eu-2").learned["fd"]:
                await anyio.sleep(0.01)
        trader = nodes["eu-1"].connect(client_name="trader")
        trader.subscribe("inbox/trader")
        trader.publish("quote/request", b"EUR 1m", reply_to="inbox/trader")
        with anyio.fail_after(10):
            request = await pricer.receive()
            pricer.publish(request.reply_to, b"1.0843 for " + request.payload)
            reply = await trader.receive()
        print("trader got:", reply.payload.decode())
        print("eu-1 is", routers["eu-1"].state)


if __name__ == "__main__":
    anyio.run(main)
