"""Plugin ``shared``: shared subscriptions (SPEC 3)."""

from __future__ import annotations

from collections import Counter

import pytest

from meshbus import (
    AccessDeniedError,
    ClientProfile,
    ConfigurationError,
    InvalidTopicError,
    Node,
    Session,
    parse_endpoint_subscription,
)
from meshbus.plugins.shared import ROUTER

PLUGINS = ["direct", "shared"]


def drain(session: Session) -> list[bytes]:
    out = []
    while (msg := session.receive_nowait()) is not None:
        out.append(msg.payload)
    return out


async def test_each_message_goes_to_exactly_one_member() -> None:
    async with Node(plugins=PLUGINS, seed=1) as node:
        members = [node.connect(client_name=f"m{i}") for i in range(3)]
        for m in members:
            m.subscribe("#share/workers/jobs/>")
        outsider = node.connect()
        outsider.subscribe("jobs/other")  # a plain subscription elsewhere does not interfere
        publisher = node.connect()
        for i in range(300):
            publisher.publish(f"jobs/{i % 7}", str(i))
        received = [drain(m) for m in members]
        everything = sorted(int(p) for r in received for p in r)
        assert everything == list(range(300))  # each once, none lost, none twice
        assert all(received), "every member got some"


async def test_distribution_is_uniform_within_a_chi_square_bound() -> None:
    n, m = 12_000, 6
    async with Node(plugins=PLUGINS, seed=1234) as node:
        counts: Counter[int] = Counter()
        for i in range(m):
            node.connect(on_message=lambda _msg, i=i: counts.update([i])).subscribe(
                "#share/g/ticks"
            )
        publisher = node.connect()
        for _ in range(n):
            publisher.publish("ticks", b"")
    expected = n / m
    chi2 = sum((counts[i] - expected) ** 2 / expected for i in range(m))
    # 5 degrees of freedom: P(chi2 > 20.52) = 0.001 for a fair choice.
    assert sum(counts.values()) == n
    assert chi2 < 20.52, (chi2, counts)


async def test_the_seed_makes_the_choice_repeatable() -> None:
    async def picks(seed: int) -> list[str]:
        seen: list[str] = []
        async with Node(plugins=PLUGINS, seed=seed) as node:
            for name in "abc":
                node.connect(
                    client_name=name, on_message=lambda _m, name=name: seen.append(name)
                ).subscribe("#share/g/t")
            publisher = node.connect()
            for _ in range(50):
                publisher.publish("t", b"")
        return seen

    assert await picks(7) == await picks(7)
    assert await picks(7) != await picks(8)


async def test_share_names_are_independent_groups_over_the_same_filter() -> None:
    async with Node(plugins=PLUGINS, seed=3) as node:
        loggers = [node.connect() for _ in range(2)]
        apps = [node.connect() for _ in range(3)]
        for s in loggers:
            s.subscribe("#share/log/sensor/*/temp")
        for s in apps:
            s.subscribe("#share/app/sensor/*/temp")
        node.connect().publish("sensor/a/temp", b"1")
        node.connect().publish("sensor/b/temp", b"2")
        assert sorted(p for s in loggers for p in drain(s)) == [b"1", b"2"]
        assert sorted(p for s in apps for p in drain(s)) == [b"1", b"2"]
        assert len(node.vpn().stash[ROUTER].groups) == 2


async def test_a_member_closing_mid_stream_loses_nothing_for_the_others() -> None:
    async with Node(plugins=PLUGINS, seed=5) as node:
        leaving = node.connect(client_name="leaving")
        staying = [node.connect(client_name=f"s{i}") for i in range(2)]
        for s in [leaving, *staying]:
            s.subscribe("#share/g/t")
        publisher = node.connect()
        for i in range(100):
            publisher.publish("t", str(i))
        leaving.close()
        for i in range(100, 200):
            publisher.publish("t", str(i))
        after = sorted(int(p) for s in staying for p in drain(s) if int(p) >= 100)
        assert after == list(range(100, 200))


async def test_unsubscribing_leaves_at_once_and_an_empty_group_disappears() -> None:
    async with Node(plugins=PLUGINS, seed=0) as node:
        a, b = node.connect(), node.connect()
        a.subscribe("#share/g/t")
        b.subscribe("#share/g/t")
        a.unsubscribe("#share/g/t")
        publisher = node.connect()
        for _ in range(20):
            publisher.publish("t", b"x")
        assert drain(a) == []
        assert len(drain(b)) == 20
        router = node.vpn().stash[ROUTER]
        b.close()
        assert router.groups == {}
        assert len(router.index) == 0
        publisher.publish("t", b"nobody")
        assert node.vpn().statistics().unmatched == 1


async def test_shared_subscriptions_ignore_no_local() -> None:
    async with Node(plugins=PLUGINS) as node:
        session = node.connect(no_local=True)
        session.subscribe("#share/g/t")
        session.subscribe("t")  # the plain subscription honours no-local
        session.publish("t", b"mine")
        assert drain(session) == [b"mine"]  # once, through the share


async def test_a_session_with_a_plain_and_a_shared_subscription_gets_both_copies() -> None:
    # As on a broker: the group and the session's own subscription are separate interests.
    async with Node(plugins=PLUGINS) as node:
        session = node.connect()
        session.subscribe("t")
        session.subscribe("#share/g/t")
        node.connect().publish("t", b"x")
        assert drain(session) == [b"x", b"x"]


async def test_joining_twice_is_one_membership_until_both_are_removed() -> None:
    async with Node(plugins=PLUGINS) as node:
        session = node.connect()
        session.subscribe("#share/g/t")
        session.subscribe("#noexport/#share/g/t")
        group = node.vpn().stash[ROUTER].groups[("g", "t")]
        assert group.members == [session]
        assert group.exported
        session.unsubscribe("#share/g/t")
        assert not group.exported  # only the #noexport membership is left
        node.connect().publish("t", b"x")
        assert drain(session) == [b"x"]
        session.unsubscribe("#noexport/#share/g/t")
        assert node.vpn().stash[ROUTER].groups == {}


async def test_client_profile_must_allow_shared_subscriptions() -> None:
    async with Node(plugins=PLUGINS) as node:
        vpn = node.vpn()
        vpn.add_client_profile(ClientProfile("noshare", allow_shared_subscriptions=False))
        vpn.add_user("plain", client_profile="noshare")
        session = node.connect(username="plain")
        with pytest.raises(AccessDeniedError, match="does not allow shared subscriptions"):
            session.subscribe("#share/g/t")
        assert session.subscriptions == ()
        assert vpn.stash[ROUTER].groups == {}
        session.subscribe("t")  # plain subscriptions still work


async def test_without_the_plugin_shared_subscriptions_are_refused_by_name() -> None:
    async with Node(plugins=["direct"]) as node:
        session = node.connect()
        with pytest.raises(ConfigurationError, match="'shared' plugin"):
            session.subscribe("#share/g/t")
        assert session.subscriptions == ()


async def test_share_name_rules_come_from_the_topic_syntax() -> None:
    async with Node(plugins=PLUGINS) as node:
        session = node.connect()
        for bad in ["#share/g*/t", "#share//t", "#share/g", "#share/g/"]:
            with pytest.raises(InvalidTopicError):
                session.subscribe(bad)
        assert session.subscriptions == ()


def test_endpoints_reject_shared_subscriptions_with_a_typed_error() -> None:
    assert parse_endpoint_subscription("orders/>").filter == "orders/>"
    for text in ["#share/g/orders/>", "#noexport/#share/g/orders"]:
        with pytest.raises(InvalidTopicError, match="not allowed on queues"):
            parse_endpoint_subscription(text)
