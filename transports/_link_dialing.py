"""The dialling side of a :class:`~meshbus.transports.WireLink`: connect in order, serve,
reconnect with backoff, fail back.

:func:`~meshbus.transports.open_link` makes a link that dials; its
:meth:`WireLink.run` is :func:`dial`:
log in to the first target that takes the login (:class:`Dialer`), serve the link
over that connection until it ends, wait out the backoff (reset once a connection
stayed up for the link's ``stable_period``) and start again. While connected to a
target other than the first, a link with ``fail_back`` tries the better-ordered
ones on that period and moves to the first that takes the login.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio

from meshbus._links import LinkState
from meshbus.errors import AccessDeniedError, ProtocolError, StateError, TransportError

from . import _events as ev
from ._connection import Connection
from ._dialing import Dialer, Remote

if TYPE_CHECKING:
    from ._link import WireLink

__all__ = ["dial"]

log = logging.getLogger("meshbus.links")


async def dial(link: WireLink) -> None:
    """What :meth:`WireLink.run` does: dial the peer, serve the link over each connection,
    reconnect with backoff, and move back to a better-ordered target (fail-back)."""
    settings = link.settings
    if settings is None:
        raise StateError(f"link {link.name!r} was accepted: its peer dials it")
    node = link.vpn.node
    dialer = Dialer(settings, clock=node.clock)
    hello = settings.hello(None)
    tls = settings.uses_tls
    login = ev.LinkLogin(link.kind, link.name, node.node_id, node.cluster, link.vpn.name, tls)
    hello["link"] = login.encode()
    link._scope = anyio.CancelScope()
    better: list[tuple[Connection, ev.Welcome]] = []  # what fail-back found
    try:
        with link._scope:
            while not link._stopped:
                suspended = link._suspended
                if suspended is not None:  # another connection carries the link for now
                    for unused, _ in better:
                        await unused.aclose()
                    better.clear()
                    link.set_state(LinkState.REUSING, link.reason)
                    await suspended.wait()
                    dialer.backoff.reset()
                    continue
                if better:
                    connection, welcome = better.pop()
                else:
                    link.set_state(LinkState.CONNECTING)
                    try:
                        connection, welcome = await dialer.login(hello)
                    except (TransportError, AccessDeniedError, ProtocolError) as exc:
                        link.connect_failures += 1
                        log.warning(
                            "link %r: connecting to %s failed: %s",
                            link.name,
                            dialer.target,
                            exc,
                        )
                        link.set_state(LinkState.BACKOFF, str(exc))
                        await _pause(link, dialer)
                        continue
                    if link._suspended is not None:  # while it logged in
                        with anyio.CancelScope(shield=True):
                            await connection.aclose()
                        continue
                target = settings.targets[dialer.index]
                link.remote_window = target.window if isinstance(target, Remote) else None
                up_since = node.clock.monotonic()
                try:
                    async with anyio.create_task_group() as tg:
                        if link.fail_back is not None and dialer.index > 0:
                            tg.start_soon(_fail_back, link, dialer, hello, better)
                        reason = await link.serve(
                            connection,
                            welcome.node_id,
                            welcome.cluster,
                            keepalive=welcome.keepalive,
                            keepalive_timeout=welcome.keepalive_timeout,
                        )
                        tg.cancel_scope.cancel()
                finally:  # this side made it: it closes it, stopped or not
                    with anyio.CancelScope(shield=True):
                        await connection.aclose()
                        if link._stopped:
                            for unused, _ in better:
                                await unused.aclose()
                if link._stopped:
                    break
                if node.clock.monotonic() - up_since >= link.stable_period:
                    dialer.backoff.reset()  # a flapping connection keeps backing off
                if better:
                    log.info("link %r moved back to %s", link.name, dialer.target)
                    continue
                if link._suspended is not None:
                    continue
                log.warning("link %r to %s lost: %s", link.name, dialer.target, reason)
                await _pause(link, dialer)
    finally:
        link._stopped = True
        link.vpn.links.detach(link)


async def _pause(link: WireLink, dialer: Dialer) -> None:
    """Wait out the backoff before the next attempt (cut short by a suspend)."""
    with anyio.CancelScope() as link._pause:
        await dialer.wait()
    link._pause = None


async def _fail_back(
    link: WireLink,
    dialer: Dialer,
    hello: dict[str, Any],
    found: list[tuple[Connection, ev.Welcome]],
) -> None:
    """While connected to a later target, try the better-ordered ones every
    :attr:`WireLink.fail_back` seconds; the first that takes the login replaces the current
    connection (ended here, reconnected at once by :meth:`WireLink.run`)."""
    assert link.fail_back is not None
    clock = link.vpn.node.clock
    current = dialer.index
    while True:
        await clock.sleep_until(clock.monotonic() + link.fail_back)
        try:
            login = await dialer.login(hello, stop=current)
        except (TransportError, AccessDeniedError, ProtocolError) as exc:
            log.debug("link %r: no better target yet: %s", link.name, exc)
            continue
        found.append(login)
        link.reason = f"moving back to {dialer.target}"
        link._close_serving()  # what the current connection took is written first
        return
