"""How much a node's SQLite spool waits for the disk: the ``[spool]`` table, or
:func:`set_spool_durability` for a node built in Python.

``"full"`` (the default) fsyncs each commit before the publisher's ack, so an
acknowledged message survives a power loss. ``"relaxed"`` lets the operating system
write the log when it will: an acknowledged message still survives a crash of the
process (kill -9), not a crash of the machine, and commits cost no fsync. Brokers
that save their store on a schedule (mosquitto's ``autosave_interval``, NATS
JetStream's ``sync_interval``) promise less than either.
"""

from __future__ import annotations

from typing import Literal

from meshbus import ConfigurationError, Node, StashKey, StateError

__all__ = ["DURABILITY", "Durability", "set_spool_durability"]

Durability = Literal["full", "relaxed"]
DURABILITY: StashKey[Durability] = StashKey()


def set_spool_durability(node: Node, durability: Durability) -> None:
    """Choose the durability of ``node``'s SQLite spool (a node with a ``data_dir``);
    before the node starts.

    :raises ConfigurationError: neither ``"full"`` nor ``"relaxed"``.
    :raises StateError: the node runs already (its spool is open).
    """
    if durability not in ("full", "relaxed"):
        raise ConfigurationError(
            f"spool durability must be 'full' or 'relaxed', not {durability!r}"
        )
    if node.running:
        raise StateError("the spool's durability is chosen before the node starts")
    node.stash[DURABILITY] = durability
