"""The spool's durability, chosen in the ``[spool]`` table or in Python: ``"full"``
(the default: each commit fsynced) or ``"relaxed"`` (no fsync: a process crash loses
nothing, a machine crash may)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from meshbus import ConfigurationError, Node, StateError
from meshbus.app._config import parse_config
from meshbus.plugins.guaranteed import SqliteStore, set_spool_durability

pytestmark = pytest.mark.anyio


def store_of(node: Node) -> SqliteStore:
    store = node.guaranteed.store
    assert isinstance(store, SqliteStore)
    return store


async def test_the_default_waits_for_the_disk(tmp_path: Path) -> None:
    async with Node(data_dir=tmp_path) as node:
        assert store_of(node).durability == "full"
        node.guaranteed.create_queue("q", subscriptions=["t"])
        await node.connect().send("t", b"x")
        assert store_of(node).statistics().syncs >= 1


async def test_relaxed_commits_without_fsync_and_keeps_what_it_took(tmp_path: Path) -> None:
    node = Node(data_dir=tmp_path)
    set_spool_durability(node, "relaxed")
    async with node:
        node.guaranteed.create_queue("q", subscriptions=["t"])
        await node.connect().send("t", b"kept")
        assert store_of(node).durability == "relaxed"
        figures = store_of(node).statistics()
        assert (figures.commits >= 1, figures.syncs) == (True, 0)
    async with Node(data_dir=tmp_path) as again:  # a new node: full unless told
        assert store_of(again).durability == "full"
        again.guaranteed.create_queue("q", subscriptions=["t"])
        async with await again.connect().bind("q") as flow:
            assert (await flow.receive()).payload == b"kept"


async def test_it_is_chosen_before_the_node_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="'full' or 'relaxed'"):
        set_spool_durability(Node(data_dir=tmp_path), "sometimes")  # type: ignore[arg-type]
    async with Node(data_dir=tmp_path) as node:
        with pytest.raises(StateError, match="before the node starts"):
            set_spool_durability(node, "relaxed")


async def test_the_spool_table_sets_it(tmp_path: Path) -> None:
    data = tomllib.loads('[node]\ndata_dir = "data"\n\n[spool]\ndurability = "relaxed"\n')
    node = parse_config(data, source="edge.toml", base_dir=tmp_path).build_node()
    async with node:
        assert store_of(node).durability == "relaxed"


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('durability = "never"', "spool.durability: must be 'full' or 'relaxed'"),
        ("durability = true", "spool.durability: must be 'full' or 'relaxed'"),
        ('fsync = "no"', "spool"),
    ],
)
def test_a_bad_spool_table_says_where(tmp_path: Path, table: str, says: str) -> None:
    data = tomllib.loads(f"[spool]\n{table}\n")
    with pytest.raises(ConfigurationError) as info:
        parse_config(data, source="edge.toml", base_dir=tmp_path)
    assert any(says in problem for problem in info.value.problems), info.value.problems
