"""Bridges (SPEC 7, 9): a plant's VPN bridged to its office VPN on the same node, and
to a cloud node over TCP, with mapped topics, a queue drained across, and a loop of
two bridges that still delivers each message once.

Run it: ``python examples/bridges.py``. Everything runs in this process; the cloud
node listens on a free TCP port of 127.0.0.1.
"""

from __future__ import annotations

import anyio
import attrs

from meshbus import ClientProfile, LinkState, Node
from meshbus.plugins.bridge import BridgeSettings, TopicMapping, open_bridge
from meshbus.transports import ListenerSettings, start_server


def allow_bridges(node: Node) -> None:
    """Let the node's default users log in as bridges (their profile must allow it)."""
    vpn = node.vpn()
    profile = vpn.client_profiles["default"]
    vpn.add_client_profile(attrs.evolve(profile, allow_bridge_connections=True))


async def main() -> None:
    async with (
        Node(name="plant", node_id="plant-7") as plant,
        Node(name="cloud", node_id="cloud") as cloud,
    ):
        # 1. Two VPNs of one node: office gets the plant's alarms, renamed on the way.
        office = plant.create_vpn("office")
        # The bridge logs in to the office VPN as its 'default' username, whose client
        # profile must let bridges in, as a remote VPN's must (SPEC 7).
        office.add_client_profile(ClientProfile("default", allow_bridge_connections=True))
        to_office = open_bridge(
            plant.vpn(),
            BridgeSettings(
                "to-office",
                remote_vpn="office",  # no remotes: a VPN of this node, joined in-process
                topics=[
                    TopicMapping(
                        "machines/*/alarm",
                        mode="PUB",
                        destination="${site}/alarms/{2}",
                        excludes=["machines/test-rig/alarm"],
                    )
                ],
                variables={"site": "plant-7"},
            ),
        )
        clerk = office.open_session(client_name="clerk")
        clerk.subscribe("plant-7/>")
        press = plant.connect(client_name="press-3")
        press.publish("machines/press-3/alarm", b"overheated")
        press.publish("machines/test-rig/alarm", b"ignore me")
        alarm = clerk.receive_nowait()
        assert alarm is not None
        print(f"office got {alarm.topic}: {alarm.payload.decode()} (hop count {alarm.hop_count})")
        print(f"excluded on the way: {to_office.statistics().dropped}")

        # 2. Another node over TCP: commands come down, and the plant's queue of
        #    readings for the cloud is drained into the cloud's own queue.
        allow_bridges(plant)
        server = await start_server(plant, ListenerSettings(port=0))
        plant.guaranteed.create_queue("for-cloud", subscriptions=["readings/>"])
        cloud.guaranteed.create_queue("readings", subscriptions=["readings/>"])
        to_plant = open_bridge(
            cloud.vpn(),
            BridgeSettings(
                "to-plant-7",
                remotes=[server.url],
                subscriptions=["status/>"],
                queues=["for-cloud"],
            ),
        )
        with anyio.fail_after(10):
            await to_plant.wait_for(LinkState.IN_SYNC)
        print(f"cloud bridge to the plant: {to_plant.state.value}")
        board = cloud.connect(client_name="board")
        board.subscribe("status/>")
        plant.connect(client_name="line-1").publish("status/line-1", b"running")
        meter = plant.connect(client_name="meter")
        for i in range(3):
            await meter.send(f"readings/{i}", b"%d kWh" % (40 + i))
        flow = await cloud.connect(client_name="historian").bind("readings")
        with anyio.fail_after(10):
            status = await board.receive()
            print(f"cloud board got {status.topic}: {status.payload.decode()}")
            for _ in range(3):
                reading = await flow.receive()
                flow.ack(reading)
                print(f"cloud queue got {reading.topic}: {reading.payload.decode()}")
        left = plant.guaranteed.queue("for-cloud")
        with anyio.fail_after(10):  # acknowledged to the plant once spooled in the cloud
            while left.usage()[0]:
                await anyio.sleep(0.01)
        print(f"plant's queue for the cloud holds {left.usage()[0]}")

        # 3. The shape that loops two brokers without loop prevention: a bridge each
        #    way, both wanting everything. Each message is delivered once per reader.
        cloud_server = await start_server(cloud, ListenerSettings(port=0))
        allow_bridges(cloud)
        everything = BridgeSettings("everything", remotes=[cloud_server.url], subscriptions=[">"])
        back = open_bridge(plant.vpn(), everything)
        to_plant.add_subscription("news/>")
        with anyio.fail_after(10):
            await back.wait_for(LinkState.IN_SYNC)
        reader = plant.connect(client_name="reader")
        reader.subscribe("news/>")
        cloud.connect(client_name="editor").publish("news/today", b"bridged both ways")
        with anyio.fail_after(10):
            news = await reader.receive()
        await anyio.sleep(0.1)  # time for a copy a loop would bring
        extra = len(list(iter(reader.receive_nowait, None)))
        print(f"plant reader got {news.topic} once (extra copies: {extra})")


if __name__ == "__main__":
    anyio.run(main)
