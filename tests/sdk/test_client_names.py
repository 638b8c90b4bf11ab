"""Client names the node makes up never collide with names in use."""

from __future__ import annotations

from meshbus import Node


async def test_a_generated_client_name_skips_names_in_use(meshbus_node: Node) -> None:
    # What a remote session does after the node restarts: it logs in again asking for
    # the name the node generated before, which the fresh node's counter reaches later.
    kept = meshbus_node.connect(client_name="test-1")
    also_kept = meshbus_node.connect(client_name="test-2")
    fresh = meshbus_node.connect()
    assert fresh.client_name == "test-3"
    assert meshbus_node.connect().client_name == "test-4"
    for session in (kept, also_kept, fresh):
        session.close()
