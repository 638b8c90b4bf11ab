"""A node's writer to a remote session keeps up with bursts larger than one batch.

A reader can hand a session's egress more messages in one turn than one delivery
batch holds: a compressed connection's inflate step carries several times what a
plain read does. The writer must then take everything waiting into its next write;
one batch per turn falls behind, the egress buffer fills, and the node discards
messages a consumer that keeps up should have had.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel

from meshbus import ClientProfile, Node
from meshbus.transports import MemoryNetwork, connect, start_server

BURST = 5000  # more than a delivery batch (4096), less than one write's bound
ROUNDS = 40
# The subscriber's egress, in messages: room for two bursts, so a turn the scheduler
# gives out of order loses nothing, while a writer that falls behind by a message per
# turn overflows it well before the last round.
LIMIT = 12_000


async def test_bursts_larger_than_a_batch_are_written_without_discards() -> None:
    network = MemoryNetwork()
    async with Node(name="n") as node:
        vpn = node.vpn()
        vpn.add_client_profile(ClientProfile("dash", egress_max_messages=LIMIT))
        vpn.add_user("dash", client_profile="dash")
        await start_server(node, listener=network.listen("node"))
        async with connect(
            network.connectable("node"), username="dash", max_buffered_messages=BURST * ROUNDS
        ) as remote:
            remote.subscribe("burst/>")
            await remote.confirm()
            publisher = node.connect(client_name="publisher")
            for _ in range(ROUNDS):
                for _i in range(BURST):
                    publisher.publish("burst/a", b"x")
                # One turn for the others, as a reader of a connection gives between
                # two reads: the writer writes, the client reads.
                await anyio.lowlevel.checkpoint()
            received = 0
            with anyio.move_on_after(30):
                while received < BURST * ROUNDS - vpn.statistics().discarded:
                    await remote.receive()
                    received += 1
            assert (vpn.statistics().discarded, received) == (0, BURST * ROUNDS)
