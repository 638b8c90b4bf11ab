"""Plugin hopcount (SPEC 9) on the in-memory mesh: the limit holds on two-way bridges."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from meshbus import DEFAULT_PLUGINS, ConfigurationError, Envelope, Message, Node
from meshbus.app._config import load_config
from meshbus.plugins import hopcount
from meshbus.plugins.hopcount import HopCountSettings
from meshbus.transports import WireLink
from meshbus.transports.testing import Mesh

pytestmark = pytest.mark.anyio


async def two_bridges(mesh: Mesh, settings: HopCountSettings | None = None, dedup: bool = True):  # type: ignore[no-untyped-def]
    """Nodes a and b, each with its own bridge to the other wanting everything: the
    shape that loops between two brokers without loop prevention."""
    a = await mesh.start("a")
    b = await mesh.start("b")
    if settings is not None:
        hopcount.configure(a, settings)
        hopcount.configure(b, settings)
    to_b = mesh.link(a, "b", wants=[">"])  # brings b's messages to a
    to_a = mesh.link(b, "a", wants=[">"])  # brings a's messages to b
    await mesh.in_sync(to_b, to_a)
    for node in (a, b):
        for link in node.vpn().links:
            link.dedup = dedup
    return a, b


def subscriber(node: Node, name: str):  # type: ignore[no-untyped-def]
    session = node.connect(client_name=name)
    session.subscribe(">")
    return session


def drain(session) -> list[Message]:  # type: ignore[no-untyped-def]
    got = []
    while (message := session.receive_nowait()) is not None:
        got.append(message)
    return got


def dropped(node: Node, reason: str) -> int:
    return sum(link.statistics().dropped.get(reason, 0) for link in node.vpn().links)


def test_bridges_count_hops_by_default() -> None:
    assert "hopcount" in DEFAULT_PLUGINS


async def test_two_bridges_both_ways_deliver_once_and_drop_the_returning_copy(
    mesh: Mesh,
) -> None:
    a, b = await two_bridges(mesh)
    on_a, on_b = subscriber(a, "on-a"), subscriber(b, "on-b")
    a.connect().publish("t/1", b"x")
    await mesh.clock.settle()

    assert [m.payload for m in drain(on_a)] == [b"x"]
    (crossed,) = drain(on_b)
    assert crossed.hop_count == 1
    # b sends it back over a's bridge as its second hop; that bridge does not take it.
    assert dropped(a, "hop_limit") == 1
    assert hopcount.dropped(a) == 1
    assert dropped(b, "hop_limit") == dropped(a, "duplicate") == 0


async def test_without_hop_counting_origin_de_duplication_still_stops_the_loop(
    mesh: Mesh,
) -> None:
    a, b = await two_bridges(mesh, HopCountSettings(enabled=False))
    on_a, on_b = subscriber(a, "on-a"), subscriber(b, "on-b")
    a.connect().publish("t/1", b"x")
    await mesh.clock.settle()

    assert len(drain(on_a)) == len(drain(on_b)) == 1
    assert drain(on_b) == []
    assert dropped(a, "duplicate") == 1  # it came back to a, which published it
    assert dropped(b, "hop_limit") == hopcount.dropped(b) == 0


async def test_a_larger_limit_bounds_the_duplicates_without_de_duplication(
    mesh: Mesh,
) -> None:
    a, b = await two_bridges(mesh, HopCountSettings(hop_count_limit=2), dedup=False)
    on_a, on_b = subscriber(a, "on-a"), subscriber(b, "on-b")
    a.connect().publish("t/1", b"x")
    await mesh.clock.settle()

    # a -> b (hop 1) -> a (hop 2), and no further: one duplicate, no loop.
    assert [m.hop_count for m in drain(on_a)] == [0, 2]
    assert [m.hop_count for m in drain(on_b)] == [1]
    assert dropped(b, "hop_limit") == 1  # its third crossing, judged by b's link


async def test_a_message_above_the_limit_is_not_taken_in(mesh: Mesh) -> None:
    _, b = await two_bridges(mesh)
    on_b = subscriber(b, "on-b")
    (link,) = [link for link in b.vpn().links if link.name == "default-to-a"]
    assert link.receive(Message("t/1", b"x", hop_count=2, origin=("elsewhere", 1))) is False
    assert link.receive(Message("t/2", b"y", hop_count=1, origin=("elsewhere", 2))) is True
    await mesh.clock.settle()
    assert [m.topic for m in drain(on_b)] == ["t/2"]
    assert link.statistics().dropped == {"hop_limit": 1}


async def test_a_link_can_have_its_own_limit(mesh: Mesh) -> None:
    a = await mesh.start("a")
    await mesh.start("b")
    dialling = mesh.link(a, "b", wants=[">"])
    hopcount.configure(a, HopCountSettings(hop_count_limit=3))  # for links attached later
    node_wide = WireLink(a.vpn(), "node-wide")
    own = WireLink(a.vpn(), "own")
    own.stash[hopcount.SETTINGS] = HopCountSettings(hop_count_limit=5)
    for link in (node_wide, own):
        a.vpn().links.attach(link)

    def limit(link: WireLink) -> int:
        """The highest hop count the link lets in."""
        return max(n for n in range(10) if link.receive(Message("t", b"x", hop_count=n)))

    assert (limit(dialling), limit(node_wide), limit(own)) == (1, 3, 5)
    envelope = Envelope(Message("t", b"x", hop_count=4), None)
    ((stage, reason),) = own._egress
    assert reason == "hop_limit"
    assert stage(envelope)
    assert envelope.hop_count == 5
    assert not stage(envelope)  # 6 > 5


async def test_links_that_are_not_bridges_are_not_counted(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a", wants=[">"], kind="custom")
    await mesh.in_sync(link)
    on_b = subscriber(b, "on-b")
    a.connect().publish("t", b"x")
    await mesh.clock.settle()
    assert [m.hop_count for m in drain(on_b)] == [0]
    assert link._egress == link._ingress == ()


def test_the_limit_is_at_least_one() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="hop_count_limit must be an int >= 1"):
            HopCountSettings(hop_count_limit=bad)  # type: ignore[arg-type]


def test_the_configuration_file_sets_the_node_limit_and_refuses_a_bad_one(
    tmp_path: Path,
) -> None:
    def problems(text: str) -> list[str]:
        path = tmp_path / "edge.toml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigurationError) as caught:
            load_config(path, environ={})
        return [p.split(": ", 1)[1] for p in caught.value.problems]

    good = tmp_path / "good.toml"
    good.write_text("[hopcount]\nhop_count_limit = 3\n", encoding="utf-8")
    node = load_config(good, environ={}).build_node()
    assert node.stash[hopcount.SETTINGS] == HopCountSettings(hop_count_limit=3)

    assert problems("[hopcount]\nhop_count_limit = 0\n") == [
        "hopcount.hop_count_limit: must be an int >= 1, got 0"
    ]
    found = problems("[hopcount]\nenabled = 'yes'\nlimit = 2\n")
    assert len(found) == 2
    assert found[0].startswith("hopcount.limit: unknown key")
    assert found[1] == "hopcount.enabled: expected a boolean, got string 'yes'"


async def test_a_copy_dropped_for_its_hop_count_does_not_hide_a_later_one(mesh: Mesh) -> None:
    # A copy that came the long way round arrives first and is dropped; the copy that
    # comes the short way must still be taken, not mistaken for a duplicate.
    _, b = await two_bridges(mesh)
    on_b = subscriber(b, "on-b")
    (link,) = [link for link in b.vpn().links if link.name == "default-to-a"]
    assert link.receive(Message("t", b"long way", hop_count=2, origin=("x", 1))) is False
    assert link.receive(Message("t", b"short way", hop_count=1, origin=("x", 1))) is True
    await mesh.clock.settle()
    assert [m.payload for m in drain(on_b)] == [b"short way"]
    assert link.statistics().dropped == {"hop_limit": 1}


async def test_the_hop_count_can_be_hidden_from_clients_but_some(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    hopcount.configure(b, HopCountSettings(hide_from_clients=True, shown_to=["bridge-.*"]))
    link = mesh.link(b, "a", wants=[">"])
    await mesh.in_sync(link)
    plain = subscriber(b, "dashboard")
    shown = subscriber(b, "bridge-mqtt-1")
    eliding = b.vpn()
    profile = attrs.evolve(eliding.client_profiles["default"], name="elided", eliding_enabled=True)
    eliding.add_client_profile(profile)
    eliding.add_user("elided", client_profile="elided")
    elided = b.connect(username="elided", client_name="elided")
    elided.subscribe(">")
    a.connect(client_name="pub").publish("t", b"x", headers={"k": "v"})
    await mesh.clock.settle()

    (hidden,) = drain(plain)
    assert (hidden.hop_count, hidden.sender, hidden.headers) == (0, "pub", {"k": "v"})
    assert [m.hop_count for m in drain(shown)] == [1]
    assert [m.hop_count for m in drain(elided)] == [0]  # behind eliding's step too
    with pytest.raises(ValueError, match="not a regular expression"):
        HopCountSettings(shown_to=["("])


async def test_the_hop_count_is_hidden_on_flows_too(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    hopcount.configure(b, HopCountSettings(hide_from_clients=True, shown_to=["bridge-.*"]))
    a.guaranteed.create_queue("out", subscriptions=["g/>"])
    b.guaranteed.create_queue("in", subscriptions=["g/>"])
    link = mesh.link(b, "a", pulls=["out"])
    await mesh.in_sync(link)
    for i in range(2):
        await a.connect().send(f"g/{i}", b"%d" % i)
    await mesh.clock.settle()
    plain = await b.connect(client_name="warehouse").bind("in", window=1)
    first = await plain.receive()
    assert (first.hop_count, first.payload, first.origin is not None) == (0, b"0", True)
    plain.ack(first)  # acked as it came, hop count hidden or not
    await plain.unbind()
    shown = await b.connect(client_name="bridge-2").bind("in")
    second = await shown.receive()
    assert (second.hop_count, second.payload) == (1, b"1")
    shown.ack(second)
    await mesh.clock.settle()
    assert b.guaranteed.queue("in").usage()[0] == 0


def test_a_string_where_a_list_of_patterns_belongs_is_refused() -> None:
    with pytest.raises(ValueError, match="shown_to must be a list"):
        HopCountSettings(shown_to="monitor-.*")
