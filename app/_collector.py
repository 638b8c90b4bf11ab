"""The garbage collector settings of a standalone node's process (``meshbus run``).

A node makes several container objects for every message it moves (the message,
the entries of the batches it reads and writes, a link's queue entry). Reference
counting frees nearly all of them at once, but each one still counts toward the
collector's first threshold, which is 700 by default: the node then ran a
collection every hundred or so messages, each one walking the young objects of
the moment. On the project's benchmark machine (1.5 million messages, publisher
and subscriber on their own processes) a first threshold of 50,000 took one node
from about 410k to about 490k messages a second, and two bridged nodes from about
145k to about 175k; 10,000 gave less (about 440k) and 100,000 no more (about 460k).

Freezing what start-up made (modules, configuration, plugins) also keeps those
objects out of every later full collection.

Only the node's own process is tuned this way. An application that embeds meshbus
owns its collector; docs/reference/cli.rst shows it the two calls that do the same.
"""

from __future__ import annotations

import gc

__all__ = ["NODE_THRESHOLDS", "tune_collector"]

NODE_THRESHOLDS = (50_000, 20, 20)
"""The collector's thresholds in a ``meshbus run`` process (see the module's text)."""


def tune_collector() -> None:
    """Freeze what the process has made so far and set :data:`NODE_THRESHOLDS`."""
    gc.freeze()
    gc.set_threshold(*NODE_THRESHOLDS)
