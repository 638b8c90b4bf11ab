"""The ``direct`` plugin: its router, refcounted filters and composition (SPEC 2)."""

from __future__ import annotations

import pytest

from meshbus import (
    ClientProfile,
    ConfigurationError,
    Envelope,
    Message,
    Node,
    Session,
)
from meshbus.plugins import direct
from meshbus.plugins.direct import ROUTER, DirectRouter
from tests.sdk.test_index import WORD, overlapping_filters, work


def drain(session: Session) -> list[Message]:
    out = []
    while (message := session.receive_nowait()) is not None:
        out.append(message)
    return out


class FakeSession:
    """Just enough of a session for the router: ``_deliver`` (what ``Session.deliver``
    returns), ``no_local`` and no ``direct_egress`` (so every delivery is a call)."""

    direct_egress = None

    def __init__(self, no_local: bool = False) -> None:
        self.no_local = no_local
        self.got: list[str] = []

    def _deliver(self, message: Message) -> None:
        self.got.append(message.topic)


def route(router: DirectRouter, topic: str, origin: object = None) -> int:
    return router.route(Envelope(Message(topic, b""), origin))


# --- the router on its own ----------------------------------------------------------------------


def test_router_delivers_once_per_session_and_counts_deliveries() -> None:
    router = DirectRouter()
    a, b, c = FakeSession(), FakeSession(), FakeSession()
    router.add(a, "x/>")  # type: ignore[arg-type]
    router.add(a, "x/y")  # type: ignore[arg-type]
    router.add(b, "x/*")  # type: ignore[arg-type]
    router.add(c, "z")  # type: ignore[arg-type]
    assert route(router, "x/y") == 2
    assert route(router, "x/y/z") == 1
    assert route(router, "nothing") == 0
    assert a.got == ["x/y", "x/y/z"]
    assert b.got == ["x/y"]
    assert c.got == []


def test_router_skips_a_no_local_origin_only() -> None:
    router = DirectRouter()
    me, other = FakeSession(no_local=True), FakeSession()
    router.add(me, "t")  # type: ignore[arg-type]
    router.add(other, "t")  # type: ignore[arg-type]
    assert route(router, "t", origin=me) == 1
    assert route(router, "t", origin=other) == 2
    assert route(router, "t", origin="a link") == 2
    assert me.got == ["t", "t"]
    assert other.got == ["t", "t", "t"]  # not no-local: it gets its own message


def test_router_refcounts_a_filter_added_twice() -> None:
    router = DirectRouter()
    s = FakeSession()
    router.add(s, "t")  # type: ignore[arg-type]
    router.add(s, "t")  # type: ignore[arg-type]
    assert len(router.index) == 1
    router.remove(s, "t")  # type: ignore[arg-type]
    assert route(router, "t") == 1
    router.remove(s, "t")  # type: ignore[arg-type]
    assert route(router, "t") == 0
    assert router.refcounts == {}
    assert len(router.index) == 0
    router.remove(s, "t")  # type: ignore[arg-type]  # not held: no-op
    router.remove(FakeSession(), "t")  # type: ignore[arg-type]


def test_router_sees_changes_after_a_cached_match() -> None:
    router = DirectRouter()
    early, late, wild = FakeSession(), FakeSession(), FakeSession()
    router.add(early, "a/b")  # type: ignore[arg-type]
    assert route(router, "a/b") == 1  # now cached
    router.add(late, "a/b")  # type: ignore[arg-type]
    assert route(router, "a/b") == 2
    router.add(wild, "a/*")  # type: ignore[arg-type]
    assert route(router, "a/b") == 3
    router.remove(early, "a/b")  # type: ignore[arg-type]
    router.remove(wild, "a/*")  # type: ignore[arg-type]
    assert route(router, "a/b") == 1
    assert (early.got, late.got, wild.got) == (["a/b"] * 3, ["a/b"] * 3, ["a/b"])


# --- in a node ----------------------------------------------------------------------------------


async def test_the_plugin_is_loaded_by_default_and_routes_each_vpn(meshbus_node: Node) -> None:
    assert "direct" in meshbus_node.plugins.names()
    other = meshbus_node.create_vpn("other")
    assert "direct" in meshbus_node.vpn().routers
    assert "direct" in other.routers
    assert not other.router_enabled("direct")  # nothing to route yet: skipped
    meshbus_node.connect("other").subscribe("t")
    assert other.router_enabled("direct")
    assert other.stash[ROUTER] is not meshbus_node.vpn().stash[ROUTER]


async def test_plain_and_noexport_subscriptions_share_a_filter(meshbus_node: Node) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("a")
    sub.subscribe("#noexport/a")
    router = meshbus_node.vpn().stash[ROUTER]
    assert router.refcounts[sub] == {"a": 2}
    sub.publish("a", b"1")
    sub.unsubscribe("a")
    sub.publish("a", b"2")  # still held through '#noexport/a'
    sub.unsubscribe("#noexport/a")
    sub.publish("a", b"3")
    assert [m.payload for m in drain(sub)] == [b"1", b"2"]
    assert sub not in router.refcounts


async def test_a_publish_costs_the_same_however_many_of_a_sessions_filters_match(
    meshbus_node: Node,
) -> None:
    """Issue 13, defect 5: a session's 1,000 overlapping wildcard filters must not make a
    publish to a fresh topic cost more than 100 of them do; delivery stays once per session."""
    filters = overlapping_filters(3)
    most = {}
    for size in (100, len(filters)):
        vpn = meshbus_node.create_vpn(f"v{size}")
        subscriber = meshbus_node.connect(vpn.name, no_local=True)
        watcher = meshbus_node.connect(vpn.name)
        watcher.subscribe(f"{WORD}/>")
        for f in filters[:size]:
            subscriber.subscribe(f)
        most[size] = 0
        for i in range(10):  # fresh topics: every publish misses the match cache
            topic = f"{WORD}/{WORD}/{WORD}{i}"
            cost = work(lambda t: subscriber.publish(t, b"x"), topic)  # noqa: B023
            most[size] = max(most[size], cost)
            watcher.publish(topic, b"y")
        assert [m.payload for m in drain(subscriber)] == [b"y"] * 10  # no-local, once each
        assert [m.payload for m in drain(watcher)] == [b"x", b"y"] * 10
        assert vpn.statistics().delivered == 30
    assert most[1000] <= most[100] + 40, most


async def test_spilled_filters_keep_no_local_and_shared_subscriptions_apart(
    meshbus_node: Node,
) -> None:
    """Filters past the index's spill point still obey no-local, and a shared subscription
    of the same session still gets its own copy (shared deliveries ignore no-local)."""
    me = meshbus_node.connect(no_local=True)
    other = meshbus_node.connect()
    filters = overlapping_filters(3)[:200]  # past the 64 the shared trie keeps per subscriber
    for f in filters:
        me.subscribe(f)
    me.subscribe(f"#share/g/{WORD}/>")
    router = meshbus_node.vpn().stash[ROUTER]
    assert me in router.index._own  # the spilled filters are in a trie of its own
    topic = f"{WORD}/{WORD}/{WORD}x"
    me.publish(topic, b"mine")  # no direct copy back; the shared group's copy comes
    other.publish(topic, b"theirs")  # one direct copy (however many filters) + the shared one
    assert sorted(m.payload for m in drain(me)) == [b"mine", b"theirs", b"theirs"]
    for f in filters:
        me.unsubscribe(f)
    assert me not in router.index._own
    other.publish(topic, b"shared only")
    assert [m.payload for m in drain(me)] == [b"shared only"]


async def test_closing_a_session_removes_it_from_the_router(meshbus_node: Node) -> None:
    router = meshbus_node.vpn().stash[ROUTER]
    sub = meshbus_node.connect()
    sub.subscribe("a/>")
    sub.subscribe("b")
    assert len(router.index) == 2
    sub.close()
    assert len(router.index) == 0
    assert router.refcounts == {}


async def test_the_router_appends_itself_only_while_nothing_stands_before_the_buffer(
    meshbus_node: Node,
) -> None:
    """The router skips ``deliver`` for a session whose deliveries go straight into its
    egress buffer; a handler, a stage a plugin put in front, or a close stop that."""
    plain = meshbus_node.connect()
    assert plain.direct_egress is plain.egress

    async def consume(message: Message) -> None:
        pass

    assert meshbus_node.connect(on_message=consume).direct_egress is not None  # pump reads it
    assert meshbus_node.connect(on_message=lambda m: None).direct_egress is None

    staged: list[bytes] = []

    def stage(message: Message) -> None:  # what a plugin's delivery stage does
        staged.append(message.payload)
        plain.sink(message)

    plain.subscribe("t")
    publisher = meshbus_node.connect()
    plain.deliver = stage
    assert plain.direct_egress is None
    publisher.publish("t", b"through the stage")
    plain.deliver = plain.sink  # the stage removed again
    assert plain.direct_egress is plain.egress
    publisher.publish("t", b"straight in")
    assert staged == [b"through the stage"]
    assert [m.payload for m in drain(plain)] == [b"through the stage", b"straight in"]
    assert plain.statistics().delivered == 2
    plain.close()
    assert plain.direct_egress is None


async def test_a_session_closed_during_a_route_gets_nothing_more(meshbus_node: Node) -> None:
    """An inline handler that closes another matching session mid-route: the router
    still holds it in its match, and its buffer takes nothing afterwards."""
    later = meshbus_node.connect(client_name="later")

    def closer(message: Message) -> None:
        later.close()

    first = meshbus_node.connect(client_name="first", on_message=closer)
    first.subscribe("t")  # subscribed first, so delivered to first
    later.subscribe("t")
    router = meshbus_node.vpn().stash[ROUTER]
    assert list(router.index.match("t")) == [first, later]
    meshbus_node.connect().publish("t", b"x")
    assert later.closed
    assert len(later.egress) == 0


async def test_an_eliding_session_is_never_appended_to_directly(meshbus_node: Node) -> None:
    profile = ClientProfile("eliding", eliding_enabled=True, eliding_delay_ms=0)
    meshbus_node.vpn().add_client_profile(profile)
    meshbus_node.vpn().add_user("eliding", client_profile="eliding")
    session = meshbus_node.connect(username="eliding")
    assert session.direct_egress is None  # the elider's stage stands in front


async def test_shared_subscriptions_are_not_handled_by_direct() -> None:
    async with Node(plugins=["direct"]) as node:
        sub = node.connect()
        with pytest.raises(ConfigurationError, match="shared"):
            sub.subscribe("#share/g/a")
        assert sub.subscriptions == ()
        sub.publish("a")
        assert drain(sub) == []


async def test_dispatch_from_a_link_reaches_no_local_sessions(meshbus_node: Node) -> None:
    vpn = meshbus_node.vpn()
    sub = meshbus_node.connect(no_local=True)
    sub.subscribe("t")
    vpn.dispatch(Envelope(Message("t", b"remote"), origin="link-1"))
    vpn.dispatch(Envelope(Message("u", b"unmatched"), origin="link-1"))
    assert [m.payload for m in drain(sub)] == [b"remote"]
    assert vpn.statistics().unmatched == 1


async def test_dispatch_during_routing_is_queued(meshbus_node: Node) -> None:
    vpn = meshbus_node.vpn()
    forwarded = False

    def relay(message: Message) -> None:
        nonlocal forwarded
        if not forwarded:
            forwarded = True
            vpn.dispatch(Envelope(Message("second", b""), origin="link"))

    relay_session = meshbus_node.connect(on_message=relay)
    relay_session.subscribe("first")
    watcher = meshbus_node.connect()
    watcher.subscribe("first")
    watcher.subscribe("second")
    vpn.dispatch(Envelope(Message("first", b""), origin="link"))
    assert [m.topic for m in drain(watcher)] == ["first", "second"]


async def test_without_the_plugin_nothing_is_routed() -> None:
    async with Node(plugins=[]) as node:
        assert node.vpn().routers == ("links",)
        session = node.connect()
        with pytest.raises(ConfigurationError, match="direct"):
            session.subscribe("t")
        assert session.subscriptions == ()
        session.publish("t")
        stats = node.statistics()
        assert (stats.published, stats.unmatched, stats.delivered) == (1, 1, 0)


async def test_the_plugin_can_be_given_as_a_module() -> None:
    async with Node(plugins=[direct]) as node:
        session = node.connect()
        session.subscribe("t")
        session.publish("t", b"x")
        assert [m.payload for m in drain(session)] == [b"x"]
