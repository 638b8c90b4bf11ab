"""Per-VPN message pipeline: what plugins contribute, compiled to plain callables.

A *router* is ``fn(envelope) -> int``: it delivers the message to whatever it
knows about (sessions, shares, endpoints, links) and returns how many
deliveries it made. The VPN calls every router for every publish, in the
order they were added, without going through pluggy.
"""

from __future__ import annotations

from collections.abc import Callable

from ._messages import Envelope
from .errors import PluginError

__all__ = ["Pipeline", "Router"]

Router = Callable[[Envelope], int]


class Pipeline:
    """Collects routers during :func:`~meshbus.hookspecs.meshbus_vpn_pipeline`."""

    def __init__(self) -> None:
        self._routers: dict[str, Router] = {}

    def add_router(self, name: str, router: Router) -> None:
        """Add a router under a unique ``name`` (the plugin's name is a good choice)."""
        if name in self._routers:
            raise PluginError(f"a router named {name!r} is already in the pipeline", name)
        if not callable(router):
            raise PluginError(f"router {name!r} is not callable: {router!r}", name)
        self._routers[name] = router

    @property
    def names(self) -> tuple[str, ...]:
        """Router names in call order."""
        return tuple(self._routers)

    def compile(self) -> Router:
        """One callable that runs every router and returns the total deliveries."""
        routers = tuple(self._routers.values())
        if not routers:
            return _no_route
        if len(routers) == 1:
            return routers[0]

        def route_all(envelope: Envelope) -> int:
            total = 0
            for router in routers:
                total += router(envelope)
            return total

        return route_all


def _no_route(envelope: Envelope) -> int:
    return 0
