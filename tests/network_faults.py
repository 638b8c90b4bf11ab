"""The link faults of a chaos run on a memory network (``tests/plugins/*/test_*_chaos.py``):
what it broke between which two nodes, and how everything is healed at the end."""

from __future__ import annotations

from typing import Any

from meshbus.transports import MemoryNetwork

Pair = tuple[str, str]

KINDS = ("cut", "partition", "half-open", "delay")
"""The faults :meth:`LinkFaults.apply` puts on a pair (``delay`` takes the seconds too)."""


class LinkFaults:
    """Faults put on the paths between pairs of nodes, remembered until healed."""

    def __init__(self, network: MemoryNetwork) -> None:
        self.network = network
        self.partitioned: set[Pair] = set()
        self.lossy: set[Pair] = set()
        self.delayed: set[Pair] = set()

    def broken(self) -> list[Pair]:
        """The pairs with a fault on them, in order."""
        return sorted(self.partitioned | self.lossy | self.delayed)

    def apply(self, kind: str, args: tuple[Any, ...]) -> str:
        """Put fault ``kind`` (one of :data:`KINDS`) on the pair ``args[:2]``; the step's
        text."""
        net = self.network
        pair: Pair = (args[0], args[1])
        if kind == "cut":
            net.cut(*pair)
        elif kind == "partition":
            self.partitioned.add(pair)
            net.partition(*pair)
        elif kind == "half-open":
            self.lossy.add(pair)
            net.half_open(*pair)
        else:
            self.delayed.add(pair)
            net.delay(*pair, args[2])
        return " ".join([kind, *map(str, args)])

    def heal(self, a: str, b: str) -> None:
        net = self.network
        net.heal(a, b)
        if (a, b) in self.lossy:
            # Healing a half-open path does not bring back what it lost: a real stream
            # would never go on after a hole. Its connections end (as keepalive would
            # end them); new ones work.
            net.cut(a, b)
        self.partitioned.discard((a, b))
        self.lossy.discard((a, b))
        self.delayed.discard((a, b))

    def heal_all(self) -> None:
        for a, b in self.broken():
            self.heal(a, b)
