"""A node's peer made by hand, for the link-mode tests: it can write anything at any time.

A :class:`Peer` is a :class:`~meshbus.transports.LinkProtocol` client over a memory
stream pair, served by a node's :class:`~meshbus.transports.Server` (``server.serve``,
in the test's task group, so an exception escaping it fails the test). Its HELLO names
a link, so the node takes it for another node. A reader task answers pings and keeps
what arrives: control frames as their typed events, messages decoded.

:func:`rig` runs the node on a :class:`~meshbus.ManualClock`. Nothing a test waits for
depends on real time: :meth:`~meshbus.ManualClock.settle` lets every task run until it
waits, and the clock moves only where a test moves it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.abc
import attrs

from meshbus import DEFAULT_PLUGINS, ManualClock, Message, Node, hookimpl
from meshbus._links import Link
from meshbus.errors import ProtocolError
from meshbus.transports import (
    FrameKind,
    LinkProtocol,
    ListenerSettings,
    MemoryByteStream,
    Role,
    Server,
    WireLink,
    memory_stream_pair,
)
from meshbus.transports import _events as ev
from meshbus.transports._codec import decode_deliver, decode_deliver_batch, decode_flow_deliver
from meshbus.transports.testing import allow_bridges

K = FrameKind
GONE = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError)
LINK = {"kind": "bridge", "name": "x", "node": "peer"}
"""The ``link`` of a HELLO: a bridge called ``x`` of node ``peer`` (the node names the
link ``peer/x``)."""
LISTENER = ListenerSettings(max_frame_size=64 * 1024, handshake_timeout=5.0)
"""A listener that reads frames of up to 64 KiB (the fuzz writes larger ones)."""


class LinkEvents:
    """A plugin that records what the node's links go through."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.closed: list[tuple[str, str]] = []

    @hookimpl
    def meshbus_link_opened(self, link: Link) -> None:
        self.opened.append(link.name)

    @hookimpl
    def meshbus_link_closed(self, link: Link, reason: str) -> None:
        self.closed.append((link.name, reason))


@attrs.define
class Rig:
    """A running node, a server of it (connections are served by hand) and a task group."""

    node: Node
    server: Server
    tg: anyio.abc.TaskGroup
    clock: ManualClock
    links: LinkEvents
    peers: list[Peer] = attrs.Factory(list)

    def peer(self, name: str, keep: Callable[[Message], bool] | None = None) -> Peer:
        """A new connection to the node, called ``name`` in its logs."""
        peer = Peer(self, name, keep)
        self.peers.append(peer)
        return peer


@contextlib.asynccontextmanager
async def rig(
    listener: ListenerSettings = LISTENER, *, allow_links: bool = True
) -> AsyncIterator[Rig]:
    """A node called ``node`` on a manual clock; its default client profile lets peers
    open links unless ``allow_links`` is false."""
    clock = ManualClock()
    links = LinkEvents()
    # Hop counting (a plugin, tests/plugins/test_hopcount.py) is left out: these tests
    # check that what the wire carries is kept, hop counts as the peer sent them.
    plugins = [*(p for p in DEFAULT_PLUGINS if p != "hopcount"), links]
    running: Rig | None = None
    try:
        async with (
            Node(name="node", node_id="node", clock=clock, plugins=plugins) as node,
            anyio.create_task_group() as tg,
        ):
            if allow_links:
                allow_bridges(node.vpn())
            running = Rig(node, Server(node, listener), tg, clock, links)
            yield running
            tg.cancel_scope.cancel()
    finally:
        for peer in running.peers if running is not None else ():
            await peer.ours.aclose()


class Peer:
    """One connection to the node, written by hand; see the module's docs.

    :param keep: which delivered messages to keep (default: all).
    """

    def __init__(self, rig: Rig, name: str, keep: Callable[[Message], bool] | None) -> None:
        self.rig = rig
        self.clock = rig.clock
        self.name = name
        self.ours, theirs = memory_stream_pair()
        self.protocol = LinkProtocol(Role.CLIENT, max_frame_size=1 << 24)
        self.keep = keep
        #: Control frames that arrived, as ``(kind, event, payload)``; FLOW_DELIVER
        #: frames as ``(kind, (flow, message), payload)``.
        self.frames: list[tuple[int, Any, bytes]] = []
        #: Direct messages delivered (DELIVER and DELIVER_BATCH), those ``keep`` takes.
        self.messages: list[Message] = []
        #: The node closed the stream (or it broke).
        self.ended = False
        #: ``server.serve`` returned.
        self.served = anyio.Event()
        #: Why what the node wrote broke the protocol, if it did.
        self.broken: ProtocolError | None = None
        #: The node's WELCOME, once logged in.
        self.welcome: ev.Welcome | None = None
        rig.tg.start_soon(self._serve, rig.server, theirs)
        rig.tg.start_soon(self._read)

    async def _serve(self, server: Server, stream: MemoryByteStream) -> None:
        try:
            await server.serve(stream, peer=self.name)
        finally:
            self.served.set()

    async def _read(self) -> None:
        try:
            while True:
                data = await self.ours.receive(1 << 20)
                for kind, header, payload in self.protocol.receive_data(data):
                    self._arrived(kind, header, payload)
                await self.flush()  # PONGs
        except GONE:
            self.ended = True
        except ProtocolError as exc:  # what the node wrote: a test looks at it
            self.broken = exc
            self.ended = True

    def _arrived(self, kind: int, header: Any, payload: bytes) -> None:
        if kind == K.DELIVER_BATCH:
            messages = decode_deliver_batch(header, payload, self.clock.time())
        elif kind == K.DELIVER:
            messages = [decode_deliver(header, payload, self.clock.time())]
        elif kind == K.FLOW_DELIVER:
            self.frames.append((kind, decode_flow_deliver(header, payload), payload))
            return
        else:
            if kind != K.PING:  # the protocol answered it
                self.frames.append((kind, header, payload))
            return
        keep = self.keep
        self.messages += messages if keep is None else filter(keep, messages)

    # --- writing ------------------------------------------------------------------------

    async def flush(self) -> None:
        """Write what the protocol has queued (nothing once the node hung up)."""
        data = self.protocol.data_to_send()
        if data:
            with contextlib.suppress(*GONE):
                await self.ours.send(data)

    async def write(self, data: bytes) -> None:
        """Write raw bytes, whatever the protocol would say of them."""
        with contextlib.suppress(*GONE):
            await self.ours.send(data)

    async def login(self, link: dict[str, Any] | None = LINK, **hello: Any) -> tuple[int, Any]:
        """Send a HELLO naming ``link`` (``None``: a session's login); return the node's
        answer (WELCOME or REFUSED) as ``(kind, event)``, which must come without the
        clock moving."""
        if link is not None:
            hello["link"] = link
        self.protocol.hello(hello)
        await self.flush()
        await self.clock.settle()
        assert self.frames, "the node did not answer the login"
        kind, event, _ = self.frames.pop(0)
        self.welcome = event if kind == K.WELCOME else None
        return kind, event

    def queue(self, kind: FrameKind, header: Any, payload: bytes = b"") -> None:
        """Queue a frame (written by the next :meth:`flush`)."""
        self.protocol.send(kind, header, payload)

    async def send(self, kind: FrameKind, header: Any, payload: bytes = b"") -> None:
        """Write one frame and let the node deal with it."""
        self.queue(kind, header, payload)
        await self.flush()
        await self.clock.settle()

    async def request(
        self, kind: FrameKind, header: dict[str, Any], payload: bytes = b""
    ) -> ev.Ok | ev.ErrorAnswer:
        """Send a request; return its one answer (failing when there is none, or more)."""
        await self.send(kind, header, payload)
        answers = self.answers(header["id"])
        assert len(answers) == 1, (header, answers, self.frames)
        return answers[0]

    def answers(self, request: int) -> list[ev.Ok | ev.ErrorAnswer]:
        """Take the answers to ``request`` that arrived."""
        found = [
            f
            for f in self.frames
            if f[0] in (K.OK, K.ERROR) and getattr(f[1], "id", None) == request
        ]
        for frame in found:
            self.frames.remove(frame)
        return [event for _, event, _ in found]

    def take(self, kind: FrameKind) -> list[Any]:
        """Take the events of the frames of ``kind`` that arrived."""
        found = [f for f in self.frames if f[0] == kind]
        for frame in found:
            self.frames.remove(frame)
        return [event for _, event, _ in found]

    async def hang_up(self) -> None:
        """Close our end and let the node finish with the connection."""
        await self.ours.aclose()
        await self.clock.settle()
        assert self.served.is_set()


# --- helpers of the tests -----------------------------------------------------------------


async def linked(r: Rig, name: str = "peer", link: dict[str, Any] = LINK) -> Peer:
    """A peer called ``name``, logged in with ``link``."""
    peer = r.peer(name)
    kind, welcome = await peer.login(link)
    assert kind == K.WELCOME, welcome
    return peer


def accepted(r: Rig, name: str = "peer/x") -> WireLink:
    """The link the node made for a peer's login."""
    link = r.node.vpn().links.get(name)
    assert isinstance(link, WireLink), r.node.vpn().links.links
    return link


def queue_depth(node: Node, name: str) -> int:
    """Messages a queue holds (stored and not yet acknowledged)."""
    return node.guaranteed.queue(name).usage()[0]  # type: ignore[attr-defined,no-any-return]
