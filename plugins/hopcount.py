"""Plugin ``hopcount``: hop-count loop prevention on bridges (SPEC 9).

A message's hop count (:attr:`~meshbus.Message.hop_count`, carried on the wire) says
how many bridges it crossed. This plugin gives every link of kind ``"bridge"`` two
stages:

* going out, the message's count goes up by one; an end with a limit of its own (a
  bridge: ``link.stash[SETTINGS]``) drops it there if it is now above the limit;
* coming in, a message whose count is above the limit is dropped (a peer that does
  not count, or counts with a higher limit, cannot bring a loop in).

A guaranteed message that a peer pulls from a queue here (a flow it bound) goes
through the same outgoing stage (:meth:`~meshbus.Link.outgoing`) before it is sent.

So each crossing is counted once, by the sender, and judged by the bridge's limit
whichever way it goes: on the way out of the bridge's end (messages it sends, PUB) or
on the way into it (messages it asked for, SUB). An end a peer opened uses the node's
limit for what comes in.

Both drops are counted under ``hop_limit``, on the link (its statistics) and in total
for the node (:func:`dropped`). With the default limit of 1 a message crosses one
bridge and no more, so a two-way pair of ``>`` bridges delivers no duplicate; with a
larger limit a bounded number of duplicates, never a loop. Origin de-duplication (in
the core, SPEC 7) is what makes any graph of bridges deliver each message once.

The limit is the node's (:func:`configure`, or ``[hopcount]`` in the configuration
file), or a link's own: put a :class:`HopCountSettings` in ``link.stash[SETTINGS]``
before the link is attached (a bridge does that from its ``hop_count_limit``).

With ``hide_from_clients`` the node's client sessions get messages with a hop count
of 0, direct ones and those of the flows they bind, except sessions whose client name
matches one of ``shown_to`` (configure the node before sessions open).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from meshbus import (
    ConfigContext,
    ConfigReader,
    ConfigSection,
    ConfigSections,
    Envelope,
    Link,
    LinkPipeline,
    Message,
    Node,
    Session,
    StashKey,
    hookimpl,
    make_message,
)
from meshbus.abc import Flow

__all__ = ["KINDS", "REASON", "SETTINGS", "HopCountSettings", "configure", "dropped"]

#: The kinds of link whose messages are counted: bridges to nodes, and to MQTT brokers.
KINDS = frozenset({"bridge", "mqtt"})
#: What a drop is counted under.
REASON = "hop_limit"


def _limit(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"hop_count_limit must be an int >= 1, got {value!r}")


def _patterns(instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for pattern in value:
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None


def _shown_to(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError(f"shown_to must be a list of patterns, got {value!r}")
    return tuple(value)


@attrs.frozen
class HopCountSettings:
    """How bridges count hops (SPEC 9)."""

    enabled: bool = True
    """Count hops and drop above the limit (``False``: the stages are left out)."""
    hop_count_limit: int = attrs.field(default=1, validator=_limit)
    """The most bridges a message may cross."""
    hide_from_clients: bool = False
    """Deliver messages to the node's client sessions with a hop count of 0, direct ones
    and those of the flows they bind (a node-wide setting; links see the real count).
    Such a session's deliveries then go through one more step."""
    shown_to: tuple[str, ...] = attrs.field(default=(), converter=_shown_to, validator=_patterns)
    """Regular expressions of client names that still see the hop count when it is
    hidden (matched against the whole name)."""


class _Counter:
    __slots__ = ("dropped",)

    def __init__(self) -> None:
        self.dropped = 0


#: The settings: the node's in ``node.stash``, a link's own in ``link.stash``.
SETTINGS = StashKey[HopCountSettings]()
_DROPPED = StashKey[_Counter]()


def configure(node: Node, settings: HopCountSettings) -> None:
    """Use ``settings`` for the node's bridges attached from now on."""
    node.stash[SETTINGS] = settings


def dropped(node: Node) -> int:
    """Messages the node's bridges dropped for their hop count, in total."""
    return node.stash.get(_DROPPED, _Counter()).dropped


@hookimpl
def meshbus_link_pipeline(link: Link, pipeline: LinkPipeline) -> None:
    if link.kind not in KINDS:
        return
    node = link.vpn.node
    own = link.stash.get(SETTINGS, None)
    settings = own if own is not None else node.stash.get(SETTINGS, HopCountSettings())
    if not settings.enabled:
        return
    limit = settings.hop_count_limit
    # An end with a limit of its own (a configured bridge) holds what it sends to it;
    # any other end (one a peer opened) only counts what it sends, and the bridge at
    # the far end judges it: the limit of a crossing is the bridge's, not its peer's.
    check_out = own is not None
    counter = node.stash.get(_DROPPED, None)
    if counter is None:
        counter = node.stash[_DROPPED] = _Counter()

    def count_out(envelope: Envelope) -> bool:
        hops = envelope.hop_count + 1
        envelope.hop_count = hops
        if hops > limit and check_out:
            counter.dropped += 1
            return False
        return True

    def check_in(envelope: Envelope) -> bool:
        if envelope.message.hop_count > limit:
            counter.dropped += 1
            return False
        return True

    pipeline.add_egress("hopcount", count_out, reason=REASON)
    pipeline.add_ingress("hopcount", check_in, reason=REASON)


@hookimpl(trylast=True)  # after eliding, which puts its own step in front of the session
def meshbus_session_opened(session: Session) -> None:
    settings = session.node.stash.get(SETTINGS, None)
    if settings is None or not settings.hide_from_clients:
        return
    name = session.client_name or ""
    if any(re.fullmatch(pattern, name) for pattern in settings.shown_to):
        return
    inner: Callable[[Message], None] = session.deliver

    def without_hop_count(message: Message) -> None:
        inner(_hidden(message))

    session.deliver = without_hop_count
    bind, bind_endpoint = session.bind, session.bind_topic_endpoint

    async def bind_without(queue: str, *, window: int = 255) -> Flow:
        return _WithoutHopCount(await bind(queue, window=window))

    async def bind_endpoint_without(endpoint: str, subscription: str, *, window: int = 255) -> Flow:
        return _WithoutHopCount(await bind_endpoint(endpoint, subscription, window=window))

    session.bind = bind_without  # type: ignore[method-assign]
    session.bind_topic_endpoint = bind_endpoint_without  # type: ignore[method-assign]


def _hidden(message: Message) -> Message:
    if not message.hop_count:
        return message
    return make_message(
        message.topic,
        message.payload,
        message.sender,
        message.timestamp,
        message.options,
        message.origin,
    )


class _WithoutHopCount(Flow):
    """A flow whose messages come with a hop count of 0 (acks go by message id)."""

    def __init__(self, flow: Flow) -> None:
        self._flow = flow

    def __getattr__(self, name: str) -> Any:
        return getattr(self._flow, name)  # what the flow has besides the Flow API

    async def receive(self) -> Message:
        return _hidden(await self._flow.receive())

    def receive_nowait(self) -> Message | None:
        message = self._flow.receive_nowait()
        return None if message is None else _hidden(message)

    def ack(self, message: Message) -> None:
        self._flow.ack(message)

    async def unbind(self) -> None:
        await self._flow.unbind()

    async def __anext__(self) -> Message:
        return _hidden(await self._flow.__anext__())


def _read(
    reader: ConfigReader, raw: object, path: str, context: ConfigContext
) -> HopCountSettings | None:
    table = reader.table(raw, path)
    if table is None:
        return None
    return reader.attrs_value(HopCountSettings, table, path)


@hookimpl
def meshbus_config_sections(sections: ConfigSections) -> None:
    sections.add(
        ConfigSection(
            "hopcount",
            "node",
            _read,
            configure=configure,
            summary="how bridges count hops: enabled, hop_count_limit, hide_from_clients, shown_to",
        ),
        plugin="hopcount",
    )
