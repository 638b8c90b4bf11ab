"""Per-VPN message pipeline: what plugins contribute, compiled to plain callables.

A *router* is ``fn(envelope) -> int``: it delivers the message to whatever it
knows about (sessions, shares, endpoints, links) and returns how many
deliveries it made. The VPN calls every enabled router for every publish, in
the order they were added, without going through pluggy.

A router with nothing to do (a plugin whose feature nobody uses yet) can be
switched off with :meth:`meshbus.Vpn.enable_router`, so an idle plugin costs a
publish nothing; with a single enabled router the VPN calls it directly.
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
        self._enabled: dict[str, bool] = {}

    def add_router(self, name: str, router: Router, *, enabled: bool = True) -> None:
        """Add a router under a unique ``name`` (the plugin's name is a good choice).

        :param enabled: whether it starts switched on (see :meth:`meshbus.Vpn.enable_router`).
        """
        if name in self._routers:
            raise PluginError(f"a router named {name!r} is already in the pipeline", name)
        if not callable(router):
            raise PluginError(f"router {name!r} is not callable: {router!r}", name)
        self._routers[name] = router
        self._enabled[name] = enabled

    def enable(self, name: str, enabled: bool) -> bool:
        """Switch a router on or off; return whether anything changed."""
        if name not in self._routers:
            raise PluginError(f"no router named {name!r} in the pipeline", name)
        changed = self._enabled[name] != enabled
        self._enabled[name] = enabled
        return changed

    def is_enabled(self, name: str) -> bool:
        """Whether the router called ``name`` runs per message."""
        return self._enabled[name]

    def enabled_names(self) -> frozenset[str]:
        """The names of the routers that run per message."""
        return frozenset(name for name, on in self._enabled.items() if on)

    @property
    def names(self) -> tuple[str, ...]:
        """Router names in call order."""
        return tuple(self._routers)

    def compile(self) -> Router:
        """One callable that runs every enabled router and returns the total deliveries."""
        routers = tuple(r for name, r in self._routers.items() if self._enabled[name])
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
