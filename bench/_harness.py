"""Shared helpers for the bench scripts: payloads, best-of-N timing, one-line output.

Timed sections read the thread's CPU time (the machine is shared, and nothing in
the timed sections blocks); each figure is the best of several interleaved rounds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable

clock = time.thread_time


def payloads(count: int, size: int = 100) -> list[bytes]:
    """``count`` distinct payload objects of ``size`` random bytes."""
    blob = os.urandom(size * count)
    return [blob[i * size : (i + 1) * size] for i in range(count)]


async def best_rates(
    impls: dict[str, Callable[[], Awaitable[float]]], messages: int, rounds: int
) -> dict[str, float]:
    """Run each implementation ``rounds`` times, interleaved with rotating order;
    each returns its elapsed seconds for ``messages`` messages. Best rate per name."""
    best: dict[str, float] = {}
    names = list(impls)
    for _ in range(1):  # warm-up, not recorded
        for name in names:
            await impls[name]()
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            rate = messages / await impls[name]()
            best[name] = max(best.get(name, 0.0), rate)
    return best


def verdict(ok: bool) -> str:
    return "OK" if ok else "MISS"
