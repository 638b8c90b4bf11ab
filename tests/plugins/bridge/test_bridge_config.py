"""Bridges in the node configuration file: [[vpns.NAME.bridges]] (SPEC 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshbus import ConfigurationError, LinkState
from meshbus.app._config import load_config
from meshbus.transports import Remote, TlsSettings

pytestmark = pytest.mark.anyio

GOOD = """
[vpns.default]
[vpns.office]
[vpns.office.client_profiles.default]
allow_bridge_connections = true

[[vpns.default.bridges]]
name = "to-office"
remote_vpn = "office"
subscriptions = ["orders/>"]
hop_count_limit = 2
variables = { site = "s7" }

[[vpns.default.bridges.topics]]
filter = "machines/*/alarm"
mode = "PUB"
destination = "${site}/${bridge.name}/{2}"
excludes = ["machines/test-rig/>"]
"""

BAD = """
[vpns.default]

[[vpns.default.bridges]]
name = "a"
remotes = ["tcp://x:1", 7]
hop_count_limit = 0
tls = "yes"
fail_back_interval = 0

[[vpns.default.bridges.topics]]
filter = "*/*"
destination = "{3}/${who}-${ENV:SITE}"

[[vpns.default.bridges.topics]]
destination = "x"

[[vpns.default.bridges]]
name = "a"
subscriptions = "x"

[[vpns.default.bridges]]
name = "b"
remotes = ["tls://x:1"]
tls = { ca = "missing-ca.pem", check_hostname = "no" }
backoff = { initial = 5, maximum = 2 }

[[vpns.default.bridges]]
name = "c"
remotes = ["tls://x:1"]
tls = { ca = "missing-ca.pem" }
backoff = { jitter = 1.5, maximum = 0 }
"""


def load(tmp_path: Path, text: str, **environ: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "edge.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ=environ)


async def test_a_bridge_in_the_file_opens_when_the_node_runs(tmp_path: Path) -> None:
    config = load(tmp_path, GOOD)
    node = config.build_node()
    async with node:
        await config.provision(node)
        await config.provision(node)  # again: the same bridge is left as it is
        (link,) = node.vpn().links
        assert (link.name, link.state) == ("bridge/to-office", LinkState.IN_SYNC)
        office = node.vpn("office")
        clerk = office.open_session()
        clerk.subscribe(">")
        node.vpn().open_session().publish("machines/press/alarm", b"hot")
        node.vpn().open_session().publish("machines/test-rig/alarm", b"ignore")
        (alarm,) = list(iter(clerk.receive_nowait, None))
        assert (alarm.topic, alarm.payload) == ("s7/to-office/press", b"hot")
        assert link.statistics().dropped == {"excluded": 1}


def test_every_mistake_of_every_bridge_is_listed(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load(tmp_path, BAD, SITE="s1")
    problems = [p.split(": ", 1)[1] for p in caught.value.problems]
    at = "vpns.default.bridges"
    assert problems == [
        f"{at}[0].remotes[1]: expected a string, got integer 7",
        f"{at}[0].tls: expected a table, got string 'yes'",
        f"{at}[0].topics[1].filter: every mapping needs a filter (a string)",
        f"{at}[0].hop_count_limit: must be an int >= 1, got 0",
        f"{at}[0].fail_back_interval: must be a positive number of seconds, got 0",
        f"{at}[1].name: another bridge is called 'a'",
        f"{at}[2].tls.check_hostname: expected a boolean, got string 'no'",
        f"{at}[2].backoff.maximum: must not be below 'initial'",
        f"{at}[3].tls.ca: no such file: {tmp_path / 'missing-ca.pem'}",
        f"{at}[3].backoff.maximum: must be a positive number of seconds, got 0",
        f"{at}[3].backoff.jitter: must be a fraction from 0 up to 1, got 1.5",
    ]


def test_mapping_problems_are_listed_at_the_bridge_s_topics(tmp_path: Path) -> None:
    text = GOOD.replace('destination = "${site}/${bridge.name}/{2}"', 'destination = "{4}/${who}"')
    with pytest.raises(ConfigurationError) as caught:
        load(tmp_path, text)
    problems = [p.split(": ", 1)[1] for p in caught.value.problems]
    where = "vpns.default.bridges[0].topics: topic mapping 1 ('machines/*/alarm'): destination"
    assert problems == [
        f"{where}: {{4}} reaches level 4, but the filter 'machines/*/alarm' takes topics of 3 "
        "levels",
        f"{where}: unknown variable ${{who}} (known: ${{bridge.name}}, ${{site}})",
    ]


def test_outside_a_destination_a_placeholder_must_name_the_environment(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load(tmp_path, GOOD.replace('remote_vpn = "office"', 'remote_vpn = "${site}"'))
    (problem,) = caught.value.problems
    assert "bridges[0].remote_vpn: unknown placeholder '${site}'" in problem


SECOND = (
    '{ url = "tls://cloud-2:55443", username = "plant-7b", password = "pw", '
    "compression = true, window = 16, tls = { check_hostname = false } }"
)
REMOTES = f"""
[vpns.default]

[[vpns.default.bridges]]
name = "mixed"
remotes = ["tcp://cloud-1:55555", {SECOND}]
"""


def test_a_remote_may_have_login_settings_of_its_own(tmp_path: Path) -> None:
    config = load(tmp_path, REMOTES)
    (vpn,) = config.vpns
    (bridge,) = vpn.section("bridges")
    first, second = bridge.remotes
    assert first == "tcp://cloud-1:55555"
    assert second == Remote(
        "tls://cloud-2:55443",
        username="plant-7b",
        password="pw",
        compression=True,
        window=16,
        tls=TlsSettings(check_hostname=False),
    )


def test_every_mistake_of_a_remote_is_listed(tmp_path: Path) -> None:
    text = REMOTES.replace(
        'remotes = ["tcp://cloud-1:55555", { url',
        'remotes = [5, { username = "x" }, { url = "tcp://h:1", colour = 1 }, "nope://x", { url',
    ).replace("compression = true", 'compression = "yes"')
    with pytest.raises(ConfigurationError) as caught:
        load(tmp_path, text)
    problems = [p.split(": ", 1)[1] for p in caught.value.problems]
    at = "vpns.default.bridges[0].remotes"
    assert problems[:3] == [
        f"{at}[0]: expected a string, got integer 5",
        f"{at}[1].url: every remote table needs a url (a string)",
        f"{at}[2].colour: unknown key (expected one of: url, username, password, tls, "
        "compression, window)",
    ]
    assert problems[3].startswith(f"{at}[3]: ")
    assert "nope" in problems[3]
    assert problems[-1].startswith(f"{at}[4].compression: compression must be true, false or")
    assert problems[-1].endswith("got 'yes'")


def test_compression_may_name_an_algorithm(tmp_path: Path) -> None:
    text = REMOTES.replace("compression = true", 'compression = "zlib"').replace(
        'name = "mixed"', 'name = "mixed"\ncompression = "zlib"'
    )
    (vpn,) = load(tmp_path, text).vpns
    (bridge,) = vpn.section("bridges")
    assert bridge.compression == "zlib"
    assert bridge.remotes[1].compression == "zlib"
    with pytest.raises(ConfigurationError) as caught:
        load(tmp_path, text.replace('"zlib"', '"lz5"'))
    at = "vpns.default.bridges[0]"
    problems = [p.split(": ", 1)[1] for p in caught.value.problems]
    assert sorted(p.split(": ", 1)[0] for p in problems) == [
        f"{at}.compression",
        f"{at}.remotes[1].compression",
    ]
    assert all(p.endswith("got 'lz5'") for p in problems)


def test_a_bridge_s_drain_timeout_reaches_its_link(tmp_path: Path) -> None:
    text = GOOD.replace('remote_vpn = "office"', 'remotes = ["tcp://127.0.0.1:1"]')
    config = load(tmp_path, text.replace("hop_count_limit = 2", "drain_timeout = 30.0"))
    (settings,) = config.vpn("default").section("bridges")
    assert settings.drain_timeout == 30.0
    with pytest.raises(ConfigurationError) as caught:
        load(tmp_path, text.replace("hop_count_limit = 2", "drain_timeout = -1"))
    (problem,) = caught.value.problems
    assert "bridges[0].drain_timeout: must be a positive number of seconds, got -1" in problem


async def test_a_bridge_passes_its_drain_timeout_to_its_link() -> None:
    from meshbus import Node
    from meshbus.plugins.bridge import BridgeSettings, open_bridge

    async with Node() as node:
        wire = open_bridge(
            node.vpn(), BridgeSettings("w", remotes=["tcp://127.0.0.1:1"], drain_timeout=30.0)
        )
        mqtt = open_bridge(
            node.vpn(), BridgeSettings("m", remotes=["mqtt://127.0.0.1:1"], drain_timeout=40.0)
        )
        assert (wire.link.drain_timeout, mqtt.link.drain_timeout) == (30.0, 40.0)
        wire.stop()
        mqtt.stop()


async def test_a_same_node_bridge_to_a_vpn_that_refuses_bridges_stops_the_start(
    tmp_path: Path,
) -> None:
    text = GOOD.replace("allow_bridge_connections = true", "allow_bridge_connections = false")
    config = load(tmp_path, text)
    node = config.build_node()
    async with node:
        with pytest.raises(ConfigurationError) as caught:
            await config.provision(node)
        assert len(node.vpn().links) == 0
    (problem,) = caught.value.problems
    assert problem == (
        f"{tmp_path / 'edge.toml'}: vpns.default.bridges.to-office: bridge 'to-office': VPN "
        "'office' refuses bridges: the client profile 'default' of username 'default' does "
        "not allow bridge connections"
    )
