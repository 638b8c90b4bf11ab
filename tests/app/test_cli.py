"""The ``meshbus`` command, including the README's main demo."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from meshbus.app._cli import main


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_runs_and_shows_each_capability() -> None:
    # A subprocess, as the README runs it: the demo owns its event loop.
    result = subprocess.run(
        [sys.executable, "-m", "meshbus", "demo"], capture_output=True, text=True, timeout=220
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # wildcards: the lobby temperature matches two filters and arrives once
    assert out.count("dashboard got building/lobby/temperature") == 1
    assert "building/roof/humidity" not in out
    assert "each stamped with the node's clock at publish (timestamps=True): True" in out
    assert "no-local session saw: ['chat/room1']" in out
    assert "slow got tick 2 discard_indication=True" in out
    assert "discarded: 2" in out
    assert "refused: connect denied for user 'viewer': login refused" in out
    assert "denied: subscribe to 'private/>'" in out
    assert "worker got: jobs/42" in out
    assert "600 jobs over 3 workers: {'worker-a': 193, 'worker-b': 202, 'worker-c': 205}" in out
    assert "the last update arrived: True" in out
    assert "NodeStatistics(" in out
    assert "4 orders sent in one commit: ['ok', 'ok', 'ok', 'PublishRejectedError']" in out
    assert "recovered 'order 2' redelivered=True" in out
    assert "recovered 'order 3' redelivered=False" in out
    assert "'ACME 101.5' (TTL 50 ms, no consumer) reached 'quotes-dmq'" in out
    # remote sessions: certificate logins over TLS, refusal without one, both delivery modes
    assert "over plain TCP: connect denied for user 'sensor': login refused" in out
    assert "compression=lz4" in out
    assert "ops got plant/boiler/pressure = 2.4 bar" in out
    assert "ops acked guaranteed alarms/boiler = 'pressure high'" in out
    assert "TLS listener: 2 logins; TCP listener refused 1" in out
    # links: what crosses keeps its sender, headers and origin; a loop delivers once
    assert "cloud linked to plant over TCP: in-sync, peer node 'plant'" in out
    assert (
        "cloud dashboard got telemetry/meter/7 = 42 kWh from 'meter-7' on node 'plant',"
        " headers {'unit': 'kWh'}"
    ) in out
    assert "cloud spooled order '2 chairs'; plant's queue now holds 0" in out
    assert "copies each reader got: {'reader-a': 1, 'reader-b': 1, 'reader-c': 1}" in out
    assert "dropped at their second hop: 4, by origin: 0" in out  # hop limit 1 on bridges
    # bridges: a same-node bridge maps a topic going out and keeps it coming in
    assert "bridge 'to-office' (site -> office) in-sync" in out
    assert "office clerk got site-7/alarms/press-3 = overheated from 'press-3'" in out
    assert "site operator got orders/17 = 400 parts from 'erp' (hop count 1)" in out
    # operating: the management API, the slow-consumer warning, a reload, a scrape, a probe
    assert (
        "log WARNING: slow consumer: session 'dashboard' (username 'dashboard', VPN 'default')"
        " discarded 1 message(s)"
    ) in out
    assert "3 connections; 'dashboard' has 5 waiting and 3 discarded" in out
    assert "queue 'orders' holds 3 message(s)" in out
    assert "purged 3 message(s) from 'orders' as user 'ops'" in out
    assert "reload (SIGHUP): vpns.default.users.night-shift: added" in out
    assert "queue 'orders' now subscribes to ['orders/>', 'returns/>'], no restart" in out
    assert (
        "reload refused, nothing changed: edge.toml: node.name: changed, and that takes a "
        "restart of the node"
    ) in out
    assert "scraped: meshbus_node_discarded_total 3.0" in out
    assert 'scraped: meshbus_queue_messages{kind="queue",queue="orders",vpn="default"} 0.0' in out
    assert "/readyz: 200 ready" in out
    # MQTT: a device on the node's own listener, both ways, and a retained value
    assert "MQTT 5 client 'meter-1' connected to mqtt://127.0.0.1:" in out
    assert "native app got readings/meter-1/kwh = 42 from 'meter-1', headers {'unit': 'kWh'}" in out
    assert "meter-1 got commands/meter-1/reset = now at QoS 1 (its queue: mqtt/meter-1)" in out
    assert "(MQTT over WebSocket) got readings/meter-1/kwh = 42" in out
    assert "a session subscribing later gets state/meter-1 = online (retained=True)" in out
    assert re.search(r"a \$share group at QoS 1 gave jobs/1 to worker-[ab] and jobs/2 to", out)
    # a pair of bridges between two nodes: one connection, both ways, a queue drained
    assert "plant reusing, hq in-sync; 1 connection between them" in out
    assert "hq board got alarms/press-3 = jammed; plant robot got commands/press-3 = stop" in out
    assert "from hq's queue (hop count 1); hq's queue holds 0" in out
    # dynamic routing: two clusters through their gateways
    assert "us-1 hears of it from eu-2 in 1 advertisement" in out
    assert "reaches 3 desks: 1 copy us-1 -> eu-2, 1 copy eu-2 -> eu-1" in out
    assert "answered on us-1: reply 1.0843 routed back" in out
    assert "eu-1 is in-sync" in out
    # Spark: the bus feeds a streaming query into Parquet, Spark publishes back
    if shutil.which("java") is None:
        assert "skipped: Spark needs Java 17" in out
    else:
        assert "Spark wrote 900 rows to Parquet, offsets 0..899" in out
        for region in ("east", "north", "south"):
            assert f"Spark published totals/meters/{region} = 300" in out


def test_plugins_lists_the_builtin_direct_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins"]) == 0
    assert "meshbus.plugins.direct" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
