"""Dynamic routing in the node configuration file: [node] cluster and [dmr] (SPEC 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshbus import ConfigurationError
from meshbus.app._config import load_config
from meshbus.plugins.dmr import DmrSettings, Peer
from meshbus.transports import Backoff

GOOD = """
[node]
name = "a2"
cluster = "A"

[dmr]
peers = { a1 = "tcp://10.0.0.1:55555" }
external = { b1 = { cluster = "B", url = "tls://b1.example:55443" } }
username = "mesh"
password = "secret"
backoff = { initial = 0.5, maximum = 4.0, jitter = 0.1 }
sync_timeout = 3.0
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigurationError) as caught:
        load_config(path, environ={}).build_node()
    return list(caught.value.problems)


def test_a_gateway_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(GOOD, encoding="utf-8")
    config = load_config(path, environ={})
    assert config.cluster == "A"
    settings = config.section("dmr")
    assert settings == DmrSettings(
        [Peer("a1", "tcp://10.0.0.1:55555"), Peer("b1", "tls://b1.example:55443", cluster="B")],
        username="mesh",
        password="secret",
        backoff=Backoff(0.5, 4.0, 0.1),
        sync_timeout=3.0,
    )
    assert config.build_node().cluster == "A"


def test_every_problem_is_named_at_its_key(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """
[node]
name = "a2"
cluster = "A"

[dmr]
peers = { a1 = "ftp://nowhere", a3 = 7 }
external = { b1 = { cluster = "B" }, c1 = { cluster = "C", url = "tcp://c:1", extra = 1 } }
window = 0
colour = "blue"
""",
    )
    text = "\n".join(found)
    assert "dmr.peers.a1" in text
    assert "dmr.peers.a3" in text
    assert "dmr.external.b1.url" in text
    assert "dmr.external.c1" in text
    assert "colour" in text


def test_two_external_links_to_one_cluster_are_refused(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        """
[node]
name = "a2"
cluster = "A"

[dmr]
external.b1 = { cluster = "B", url = "tcp://b1:1" }
external.b2 = { cluster = "B", url = "tcp://b2:1" }
""",
    )
    assert any("a second external link to cluster 'B'" in p for p in found), found


def test_routing_without_a_cluster_or_to_itself_is_refused(tmp_path: Path) -> None:
    found = problems(tmp_path, '[node]\nname = "a1"\n\n[dmr]\npeers = { a2 = "tcp://a2:1" }\n')
    assert any("needs the node's cluster" in p for p in found), found
    found = problems(
        tmp_path, '[node]\nname = "a1"\ncluster = "A"\n\n[dmr]\npeers = { a1 = "tcp://a2:1" }\n'
    )
    assert any("is this node" in p for p in found), found
    found = problems(tmp_path, '[node]\nname = "a1"\ncluster = "A/B"\n')
    assert any("node.cluster" in p for p in found), found


def test_compression_may_name_an_algorithm(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(GOOD + 'compression = "zlib"\n', encoding="utf-8")
    assert load_config(path, environ={}).section("dmr").compression == "zlib"
    (problem,) = problems(tmp_path, GOOD + 'compression = "lz5"\n')
    assert "dmr.compression" in problem
    assert "got 'lz5'" in problem


def test_a_string_where_a_list_of_vpns_belongs_is_refused() -> None:
    with pytest.raises(ValueError, match="vpns must be a list"):
        DmrSettings(vpns="default")
