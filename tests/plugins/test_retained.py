"""Plugin ``retained`` (SPEC 12): each topic's last value, for subscriptions made later."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshbus import (
    ConfigurationError,
    LinkState,
    ManualClock,
    Message,
    Node,
    PublishRejectedError,
    filter_matches,
)
from meshbus.plugins.bridge import BridgeSettings, TopicMapping, open_bridge
from meshbus.plugins.retained import RetainedLimits, configure_retained, retained_store
from meshbus.plugins.retained._tree import TopicTree
from meshbus.transports import ListenerSettings, connect, start_server
from meshbus.transports.testing import Mesh

pytestmark = pytest.mark.anyio


def drain(session) -> list[Message]:  # type: ignore[no-untyped-def]
    return list(iter(session.receive_nowait, None))


async def test_a_new_subscription_gets_the_last_value_flagged_before_anything_newer() -> None:
    async with Node() as node:
        publisher = node.connect(client_name="pub")
        live = node.connect(client_name="live")
        live.subscribe("t/>")
        publisher.publish("t/a", b"1", retain=True)
        publisher.publish("t/a", b"2", retain=True)
        publisher.publish("t/b", b"plain")  # not retained: nothing kept
        late = node.connect(client_name="late")
        late.subscribe("t/>")
        publisher.publish("t/a", b"3")
        got = drain(late)
        assert [(m.topic, m.payload, m.retained) for m in got] == [
            ("t/a", b"2", True),
            ("t/a", b"3", False),
        ]
        assert got[0].retain
        assert got[0].sender == "pub"
        seen = drain(live)
        assert [(m.payload, m.retain, m.retained) for m in seen] == [
            (b"1", True, False),
            (b"2", True, False),
            (b"plain", False, False),
            (b"3", False, False),
        ]


async def test_an_empty_retained_payload_clears_the_value_and_still_reaches_live_subscribers() -> (
    None
):
    async with Node() as node:
        publisher = node.connect()
        live = node.connect()
        live.subscribe("t")
        publisher.publish("t", b"v", retain=True)
        publisher.publish("t", b"", retain=True)
        assert [m.payload for m in drain(live)] == [b"v", b""]
        late = node.connect()
        late.subscribe("t")
        assert drain(late) == []
        assert retained_store(node.vpn()).statistics().cleared == 1


@pytest.mark.parametrize(
    ("subscription", "expected"),
    [
        ("a/b", ["a/b"]),
        ("a/*", ["a/b", "a/bc", "a/c"]),
        ("a/b*", ["a/b", "a/bc"]),
        ("a/>", ["a/b", "a/b/c", "a/bc", "a/c"]),
        (">", ["a", "a/b", "a/b/c", "a/bc", "a/c", "x"]),
        ("*/b/*", ["a/b/c"]),
        ("#noexport/a/*", ["a/b", "a/bc", "a/c"]),
    ],
)
async def test_wildcards_pick_the_values_they_match(subscription: str, expected: list[str]) -> None:
    async with Node() as node:
        publisher = node.connect()
        for topic in ["a", "a/b", "a/bc", "a/c", "a/b/c", "x"]:
            publisher.publish(topic, topic.encode(), retain=True)
        subscriber = node.connect()
        subscriber.subscribe(subscription)
        assert sorted(m.topic for m in drain(subscriber)) == expected


async def test_shared_subscriptions_get_no_retained_values() -> None:
    async with Node() as node:
        node.connect().publish("s/x", b"v", retain=True)
        member = node.connect()
        member.subscribe("#share/g/s/>")
        assert drain(member) == []


async def test_values_are_kept_per_vpn() -> None:
    async with Node() as node:
        node.create_vpn("other")
        node.connect().publish("t", b"default", retain=True)
        other = node.vpn("other").open_session()
        other.subscribe("t")
        assert drain(other) == []
        here = node.connect()
        here.subscribe("t")
        assert [m.payload for m in drain(here)] == [b"default"]


async def test_limits_refuse_a_new_topic_whole_but_let_values_be_replaced() -> None:
    async with Node() as node:
        configure_retained(node.vpn(), RetainedLimits(max_topics=2, max_bytes=100))
        publisher = node.connect()
        live = node.connect()
        live.subscribe(">")
        publisher.publish("a", b"1", retain=True)
        publisher.publish("b", b"2", retain=True)
        with pytest.raises(PublishRejectedError) as refused:
            publisher.publish("c", b"3", retain=True)
        assert (refused.value.reason, refused.value.limit) == ("retained-limit", 2)
        assert "max_topics" in str(refused.value)
        publisher.publish("a", b"1 again", retain=True)  # a replacement fits
        with pytest.raises(PublishRejectedError, match="max_bytes"):
            publisher.publish("b", b"x" * 100, retain=True)
        # What was refused was not delivered either; the rest was.
        assert [m.payload for m in drain(live)] == [b"1", b"2", b"1 again"]
        stats = retained_store(node.vpn()).statistics()
        assert (stats.topics, stats.refused) == (2, 2)


async def test_a_guaranteed_retained_send_over_the_limit_is_refused_before_it_is_spooled() -> None:
    async with Node() as node:
        node.guaranteed.create_queue("q", subscriptions=["g/>"])
        configure_retained(node.vpn(), RetainedLimits(max_topics=1))
        session = node.connect()
        await session.send("g/1", b"kept", retain=True)
        with pytest.raises(PublishRejectedError, match="max_topics"):
            await session.send("g/2", b"refused", retain=True)
        assert node.guaranteed.queue("q").spooled == 1  # type: ignore[attr-defined]


async def test_values_expire_with_their_ttl() -> None:
    clock = ManualClock()
    async with Node(clock=clock) as node:
        session = node.connect()
        await session.send("e", b"short", ttl=5, retain=True)
        await session.send("f", b"forever", retain=True)
        clock.advance(6)
        late = node.connect()
        late.subscribe(">")
        assert [m.payload for m in drain(late)] == [b"forever"]


async def test_a_direct_value_expires_with_its_ttl_too() -> None:
    clock = ManualClock()
    async with Node(clock=clock) as node:
        session = node.connect()
        session.publish("e", b"short", ttl=5, retain=True)
        session.publish("f", b"forever", retain=True)
        clock.advance(6)
        late = node.connect()
        late.subscribe(">")
        assert [m.payload for m in drain(late)] == [b"forever"]


async def test_without_the_plugin_a_retained_publish_is_a_configuration_error() -> None:
    async with Node(plugins=["direct"]) as node:
        with pytest.raises(ConfigurationError, match="'retained' plugin"):
            node.connect().publish("t", b"x", retain=True)


async def test_values_survive_a_restart_with_a_data_directory(tmp_path: Path) -> None:
    async with Node(data_dir=tmp_path) as node:
        session = node.connect(client_name="writer")
        await session.send("g", b"guaranteed", retain=True, headers={"k": 1})
        session.publish("d", b"direct", retain=True)
        session.publish("gone", b"soon", retain=True)
        session.publish("gone", b"", retain=True)
    async with Node(data_dir=tmp_path) as node:
        late = node.connect()
        late.subscribe(">")
        got = {m.topic: m for m in drain(late)}
        assert sorted(got) == ["d", "g"]
        assert got["g"].payload == b"guaranteed"
        assert got["g"].headers == {"k": 1}
        assert got["g"].sender == "writer"
        assert got["g"].retained


async def test_remote_sessions_publish_and_receive_retained_values() -> None:
    async with Node() as node:
        server = await start_server(node, ListenerSettings(port=0))
        url = f"tcp://127.0.0.1:{server.port}"
        async with connect(url) as publisher:
            publisher.publish("r/direct", b"d", retain=True)
            await publisher.send("r/guaranteed", b"g", retain=True)
            await publisher.confirm()
        async with connect(url) as subscriber:
            subscriber.subscribe("r/>")
            await subscriber.confirm()
            first = await subscriber.receive()
            second = await subscriber.receive()
        got = sorted([first, second], key=lambda m: m.topic)
        assert [(m.topic, m.payload, m.retained) for m in got] == [
            ("r/direct", b"d", True),
            ("r/guaranteed", b"g", True),
        ]


async def test_a_bridge_keeps_values_retained_only_where_its_mapping_says(mesh: Mesh) -> None:
    local = await mesh.start("local")
    far = await mesh.start("remote")
    target = mesh.network.connectable("remote", source="local")
    mappings = [
        TopicMapping("kept/>", mode="SUB", preserve_retained=True),
        TopicMapping("plain/>", mode="SUB"),
    ]
    bridge = open_bridge(
        local.vpn(),
        BridgeSettings("b", remotes=[target], subscriptions=["kept/>", "plain/>"], topics=mappings),
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    publisher = far.connect()
    publisher.publish("kept/x", b"1", retain=True)
    publisher.publish("plain/x", b"2", retain=True)
    await mesh.clock.settle()
    late = local.connect()
    late.subscribe(">")
    assert [(m.topic, m.retained) for m in drain(late)] == [("kept/x", True)]


async def test_the_config_file_sets_a_vpn_s_limits(tmp_path: Path) -> None:
    from meshbus.app._config import parse_config

    data = {"vpns": {"default": {"retained": {"max_topics": 1}}}}
    node = parse_config(data, base_dir=tmp_path).build_node()
    async with node:
        session = node.connect()
        session.publish("a", b"1", retain=True)
        with pytest.raises(PublishRejectedError):
            session.publish("b", b"2", retain=True)


def test_bad_limits_are_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="max_topics"):
        RetainedLimits(max_topics=0)


_LEVELS = st.sampled_from(["a", "b", "ab", "abc", ""])
_TOPICS = st.lists(_LEVELS, min_size=1, max_size=4).map("/".join)
_FILTER_LEVELS = st.sampled_from(["a", "b", "ab", "*", "a*", ""])


@st.composite
def _filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(_FILTER_LEVELS, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append(">")
    return "/".join(levels)


@settings(max_examples=300, deadline=None)
@given(topics=st.lists(_TOPICS, max_size=12), removed=st.lists(_TOPICS, max_size=4), f=_filters())
def test_the_topic_tree_finds_what_filter_matches_finds(
    topics: list[str], removed: list[str], f: str
) -> None:
    tree: TopicTree[str] = TopicTree()
    for topic in topics:
        tree.put(topic, topic)
    for topic in removed:
        tree.pop(topic)
    kept = set(topics) - set(removed)
    assert sorted(tree.matching(f)) == sorted(t for t in kept if filter_matches(f, t))
    assert len(tree) == len(kept)
