"""The metrics endpoint: what it exports (checked against the nodes' statistics), how
its series stay bounded, its health and readiness probes, and how it takes bad requests."""

from __future__ import annotations

import sys
from collections.abc import Mapping

import anyio
import anyio.abc
import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshbus import ConfigurationError, LatencyHistogram, LinkState, Node, TransportError
from meshbus.plugins.bridge import BridgeSettings, open_bridge
from meshbus.transports import (
    ListenerSettings,
    MemoryNetwork,
    MetricsEndpoint,
    MetricsSettings,
    connect,
    serve_metrics,
    servers_of,
    start_server,
)
from meshbus.transports._metrics import (
    LISTENER_FIGURES,
    NODE_FIGURES,
    QUEUE_FIGURES,
    VPN_FIGURES,
)
from meshbus.transports.testing import Mesh

pytestmark = pytest.mark.anyio

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


@attrs.frozen
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes


async def exchange(stream: anyio.abc.ByteStream, request: bytes) -> Answer:
    """Send ``request`` as is, read until the endpoint closes the connection."""
    async with stream:
        await stream.send(request)
        data = bytearray()
        while True:
            try:
                data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    status_line, *fields = head.decode("ascii").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    assert version == "HTTP/1.1"
    headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
    assert int(headers["content-length"]) == len(body)
    assert headers["connection"] == "close"
    return Answer(int(status), headers, body)


def get(path: str, *headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: node", *headers, "", ""]
    return "\r\n".join(lines).encode()


async def tcp(endpoint: MetricsEndpoint) -> anyio.abc.ByteStream:
    return await anyio.connect_tcp(endpoint.host, endpoint.port)


def parse(text: str) -> Series:
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return series


def value(series: Series, name: str, **labels: str) -> float:
    return series[(name, frozenset(labels.items()))]


def sample_name(metric: str, kind: str) -> str:
    return f"{metric}_total" if kind == "counter" else metric


# --- what it exports --------------------------------------------------------------------


async def scrape_over(network: MemoryNetwork, name: str, *headers: str) -> Answer:
    return await exchange(await network.connect(name), get("/metrics", *headers))


async def test_a_scrape_matches_the_statistics_of_a_bridged_node(mesh: Mesh) -> None:
    local, far = await mesh.start("local"), await mesh.start("remote")
    guaranteed = local.guaranteed
    guaranteed.create_queue("orders", subscriptions=["orders/>"], max_messages=50)
    guaranteed.create_queue("audit", subscriptions=["orders/>", "audit/>"])
    target = mesh.network.connectable("remote", source="local")
    bridge = open_bridge(
        local.vpn(), BridgeSettings("to-remote", remotes=[target], subscriptions=["far/>"])
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    endpoint = await serve_metrics(local, listener=mesh.network.listen("local-metrics"))
    assert endpoint.url == "memory://local-metrics"

    listener = mesh.network.connectable("local", source="client")
    async with (
        connect(listener, clock=mesh.clock, client_name="sender") as sender,
        connect(listener, clock=mesh.clock, client_name="reader") as reader,
    ):
        reader.subscribe("far/>")
        await reader.confirm()
        for i in range(7):
            await sender.send("orders/new", b"order %d" % i)
        flow = await reader.bind("orders", window=4)
        with anyio.fail_after(10):
            first = await flow.receive()
        flow.ack(first)
        publisher = far.connect(client_name="far-publisher")
        for i in range(5):
            publisher.publish("far/news", b"%d" % i)
            publisher.publish("elsewhere/x", b"not bridged")
        sender.publish("nowhere/at/all", b"unmatched")
        await mesh.clock.settle()
        await mesh.clock.wait_for(lambda: local.vpn().statistics().delivered >= 5, within=10)
        await mesh.clock.settle()

        answer = await scrape_over(mesh.network, "local-metrics")
        node_stats = local.statistics()
        vpn_stats = local.vpn().statistics()
        (server,) = servers_of(local)
        listener_stats = server.statistics()
        queues = guaranteed.queue_statistics()
        (link,) = local.vpn().links
        link_stats = link.statistics()
        await flow.unbind()

    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    series = parse(answer.body.decode())

    assert value(series, "meshbus_node_info", node="local", node_id="local", cluster="") == 1
    assert value(series, "meshbus_ready") == 1
    assert value(series, "meshbus_node_vpns") == 1
    for field, kind, _ in NODE_FIGURES:
        assert value(series, sample_name(f"meshbus_node_{field}", kind)) == getattr(
            node_stats, field
        ), field
    for field, kind, _ in VPN_FIGURES:
        assert value(series, sample_name(f"meshbus_vpn_{field}", kind), vpn="default") == getattr(
            vpn_stats, field
        ), field
    assert vpn_stats.sessions == 2  # the two remote sessions
    assert vpn_stats.delivered >= 5
    assert vpn_stats.unmatched == 1

    for field, metric, kind, _ in LISTENER_FIGURES:
        assert value(
            series, sample_name(f"meshbus_listener_{metric}", kind), listener=server.url
        ) == getattr(listener_stats, field), field
    assert listener_stats.logins == 2
    assert listener_stats.bytes_received > 0

    assert [q.name for q in queues] == ["audit", "orders"]
    for queue in queues:
        labels = {"vpn": "default", "queue": queue.name, "kind": "queue"}
        for field, metric, kind, _ in QUEUE_FIGURES:
            name = sample_name(f"meshbus_queue_{metric}", kind)
            if getattr(queue, field) is None:
                assert (name, frozenset(labels.items())) not in series
            else:
                assert value(series, name, **labels) == getattr(queue, field), (queue.name, field)
    orders = next(q for q in queues if q.name == "orders")
    assert (orders.spooled, orders.acked, orders.messages) == (7, 1, 6)

    labels = {"vpn": "default", "link": "bridge/to-remote", "kind": "bridge"}
    assert link_stats.name == "bridge/to-remote"
    assert link_stats.received == 5
    for field in ("connects", "connect_failures", "disconnects", "forwarded", "forward_failures",
                  "received", "receive_failures"):  # fmt: skip
        assert value(series, f"meshbus_link_{field}_total", **labels) == getattr(link_stats, field)
    assert value(series, "meshbus_link_interest", **labels) == link_stats.interest
    for state in LinkState:
        expected = 1 if state is LinkState.IN_SYNC else 0
        assert value(series, "meshbus_link_state", **labels, state=state.value) == expected
    for reason, count in link_stats.dropped.items():
        assert value(series, "meshbus_link_dropped_total", **labels, reason=reason) == count


async def test_link_latency_is_a_histogram_with_the_links_buckets(mesh: Mesh) -> None:
    local, far = await mesh.start("local"), await mesh.start("remote")
    mesh.link(local, "remote", wants=["x/>"])  # the accepted side, on "remote", forwards
    await mesh.clock.wait_for(lambda: len(far.vpn().links) == 1, within=10)
    (link,) = far.vpn().links
    await mesh.clock.wait_for(lambda: link.statistics().interest == 1, within=10)
    reader = local.connect(client_name="reader")
    reader.subscribe("x/>")
    publisher = far.connect()
    for i in range(20):
        publisher.publish("x/y", b"%d" % i)
    await mesh.clock.settle()
    assert len(list(iter(reader.receive_nowait, None))) == 20
    await serve_metrics(far, listener=mesh.network.listen("m"))

    answer = await scrape_over(mesh.network, "m")
    latency = link.statistics().forward_latency
    assert sum(latency.values()) == link.statistics().forwarded == 20
    series = parse(answer.body.decode())
    labels = {"vpn": "default", "link": link.name, "kind": "bridge"}
    cumulative = 0
    for bound in LatencyHistogram.LABELS:
        cumulative += latency.get(bound, 0)
        le = bound if bound == "+Inf" else str(float(bound))
        assert (
            value(series, "meshbus_link_forward_latency_seconds_bucket", **labels, le=le)
            == cumulative
        )
    assert cumulative == 20
    # The link's histogram has no sum of durations: neither _sum nor _count is made up
    # (the +Inf bucket is the count).
    assert ("meshbus_link_forward_latency_seconds_count", frozenset(labels.items())) not in series


async def test_openmetrics_when_the_scraper_asks_for_it() -> None:
    async with Node(name="n") as node:
        endpoint = await serve_metrics(node, "127.0.0.1:0")
        accept = "Accept: application/openmetrics-text; version=1.0.0,text/plain;q=0.5"
        answer = await exchange(await tcp(endpoint), get("/metrics", accept))
        plain = await exchange(await tcp(endpoint), get("/metrics"))
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert answer.body.endswith(b"# EOF\n")
    assert b"# TYPE meshbus_vpn_published counter\n" in answer.body
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b"# EOF" not in plain.body


async def test_the_series_do_not_grow_with_sessions() -> None:
    network = MemoryNetwork()
    async with Node(name="n") as node:
        node.guaranteed.create_queue("q", subscriptions=["a/>"])
        server = await start_server(node, listener=network.listen("node"))
        await serve_metrics(node, listener=network.listen("metrics"))
        async with connect(network.connectable("node")) as remote:
            remote.subscribe("a/>")
            await remote.confirm()
            before = parse((await scrape_over(network, "metrics")).body.decode())
            sessions = []
            for i in range(1000):
                session = node.vpn().open_session(client_name=f"client-{i}")
                session.subscribe(f"a/{i}")
                session.publish("a/x", b"x")
                sessions.append(session)
            async with connect(network.connectable("node")) as second:
                second.publish("a/y", b"y")
                await second.confirm()
                after = parse((await scrape_over(network, "metrics")).body.decode())
            for session in sessions:
                session.close()
    assert set(after) == set(before)
    assert value(before, "meshbus_vpn_sessions", vpn="default") == 1
    assert value(after, "meshbus_vpn_sessions", vpn="default") == 1002
    assert value(after, "meshbus_listener_connections", listener=server.url) == 2
    assert value(after, "meshbus_vpn_published_total", vpn="default") >= 1001


# --- health and readiness ---------------------------------------------------------------


async def test_healthz_answers_while_the_node_runs() -> None:
    async with Node(name="n") as node:
        endpoint = await serve_metrics(node, "127.0.0.1:0")
        answer = await exchange(await tcp(endpoint), get("/healthz"))
        assert (answer.status, answer.body) == (200, b"ok\n")
        await endpoint.aclose()
        with pytest.raises(OSError, match=r"connect|refused"):
            await tcp(endpoint)


async def test_not_ready_before_the_listeners_are_up() -> None:
    network = MemoryNetwork()
    async with Node(name="n") as node:
        endpoint = await serve_metrics(node, listener=network.listen("metrics"), listeners=2)
        first = await exchange(await network.connect("metrics"), get("/readyz"))
        await start_server(node, ListenerSettings(port=0))
        second = await exchange(await network.connect("metrics"), get("/readyz"))
        await start_server(node, listener=network.listen("node"))
        third = await exchange(await network.connect("metrics"), get("/readyz"))
        scraped = parse((await scrape_over(network, "metrics")).body.decode())
        assert endpoint.readiness() == []
    assert (first.status, first.body) == (503, b"not ready: 0 of 2 listeners are up\n")
    assert (second.status, second.body) == (503, b"not ready: 1 of 2 listeners are up\n")
    assert (third.status, third.body) == (200, b"ready\n")
    assert value(scraped, "meshbus_ready") == 1


async def test_not_ready_while_a_link_is_not_in_sync(mesh: Mesh) -> None:
    local = await mesh.start("local")
    link = mesh.link(local, "remote", name="uplink", wants=["x/>"])  # "remote" is not up yet
    await serve_metrics(local, listener=mesh.network.listen("metrics"))

    async def probe() -> Answer:
        return await exchange(await mesh.network.connect("metrics"), get("/readyz"))

    await mesh.clock.wait_for(lambda: link.state is LinkState.BACKOFF, within=10)
    waiting = await probe()
    assert waiting.status == 503
    assert waiting.body.startswith(b"not ready: link 'uplink' of VPN 'default' is backoff")
    scraped = parse((await scrape_over(mesh.network, "metrics")).body.decode())
    assert value(scraped, "meshbus_ready") == 0

    await mesh.start("remote")
    await mesh.in_sync(link, within=600)
    assert (await probe()).status == 200

    mesh.network.cut("local", "remote")
    await mesh.clock.wait_for(lambda: link.state is not LinkState.IN_SYNC, within=60)
    assert (await probe()).status == 503


# --- bad requests -----------------------------------------------------------------------


@pytest.fixture
async def endpoint() -> MetricsEndpoint:
    async with Node(name="n") as node:
        yield await serve_metrics(
            node, MetricsSettings(listen="127.0.0.1:0", max_request_size=1024)
        )


async def test_an_unknown_path_is_404(endpoint: MetricsEndpoint) -> None:
    answer = await exchange(await tcp(endpoint), get("/admin"))
    assert answer.status == 404
    assert answer.body == b"Not Found: no such path; try /metrics, /healthz, /readyz\n"
    assert (await exchange(await tcp(endpoint), get("/metrics?x=1"))).status == 200


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD", "OPTIONS"])
async def test_only_get_is_served(endpoint: MetricsEndpoint, method: str) -> None:
    request = f"{method} /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello".encode()
    answer = await exchange(await tcp(endpoint), request)
    assert answer.status == 405
    assert answer.headers["allow"] == "GET"


async def test_an_oversized_request_is_refused(endpoint: MetricsEndpoint) -> None:
    request = get("/metrics", "X-Padding: " + "a" * 100_000)
    answer = await exchange(await tcp(endpoint), request)
    assert answer.status == 431
    # What fits is served.
    assert (
        await exchange(await tcp(endpoint), get("/metrics", "X-Padding: " + "a" * 900))
    ).status == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /metrics\r\n\r\n",
        b"GET  /metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/2.0\r\n\r\n",
        b"GET http://node/metrics HTTP/1.1\r\n\r\n",
        b"G(T /metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n",
        b"GET /m\xe9trics HTTP/1.1\r\n\r\n",
    ],
)
async def test_a_malformed_request_is_400(endpoint: MetricsEndpoint, request_bytes: bytes) -> None:
    answer = await exchange(await tcp(endpoint), request_bytes)
    assert answer.status == 400


async def test_one_answer_per_connection(endpoint: MetricsEndpoint) -> None:
    answer = await exchange(await tcp(endpoint), get("/healthz") + get("/metrics"))
    assert (answer.status, answer.body) == (200, b"ok\n")


async def test_a_slow_client_is_cut_off_and_others_are_turned_away(mesh: Mesh) -> None:
    node = await mesh.start("n")
    settings = MetricsSettings(listen="127.0.0.1:0", request_timeout=5, max_connections=2)
    endpoint = await serve_metrics(node, settings, listener=mesh.network.listen("metrics"))
    slow = [await mesh.network.connect("metrics") for _ in range(2)]
    for stream in slow:
        await stream.send(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
    await mesh.clock.settle()
    assert endpoint.http.open == 2
    turned_away = await mesh.network.connect("metrics")
    with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
        await turned_away.receive()
    assert endpoint.http.turned_away == 1

    await mesh.clock.run(4.9)
    assert endpoint.http.open == 2
    await mesh.clock.run(0.2)
    for stream in slow:
        with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await stream.receive()
    assert (endpoint.http.open, endpoint.http.dropped) == (0, 2)
    answer = await exchange(await mesh.network.connect("metrics"), get("/healthz"))
    assert answer.status == 200


async def test_a_client_that_leaves_early_costs_nothing(mesh: Mesh) -> None:
    node = await mesh.start("n")
    endpoint = await serve_metrics(node, listener=mesh.network.listen("metrics"))
    stream = await mesh.network.connect("metrics")
    await stream.send(b"GET /met")
    await mesh.clock.settle()
    assert endpoint.http.open == 1
    await stream.aclose()
    await mesh.clock.settle()
    assert (endpoint.http.open, endpoint.http.dropped) == (0, 1)
    answer = await exchange(await mesh.network.connect("metrics"), get("/healthz"))
    assert answer.status == 200
    assert endpoint.http.answered == {200: 1}


# --- starting one -----------------------------------------------------------------------


async def test_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="listen must be HOST:PORT"):
        MetricsSettings(listen="9464")
    with pytest.raises(ConfigurationError, match="request_timeout must be a positive number"):
        MetricsSettings(request_timeout=0)
    assert MetricsSettings().listen == "127.0.0.1:9464"
    assert (MetricsSettings(listen="[::1]:0").host, MetricsSettings(listen="[::1]:0").port) == (
        "::1",
        0,
    )
    async with Node(name="n") as node:
        with pytest.raises(ConfigurationError, match="listeners must be"):
            await serve_metrics(node, "127.0.0.1:0", listeners=-1)
        with pytest.raises(ConfigurationError, match="expected MetricsSettings"):
            await serve_metrics(node, 9464)  # type: ignore[arg-type]


async def test_an_address_in_use_is_a_transport_error() -> None:
    async with Node(name="n") as node:
        first = await serve_metrics(node, "127.0.0.1:0")
        with pytest.raises(TransportError, match=f"metrics endpoint on 127.0.0.1:{first.port}"):
            await serve_metrics(node, f"127.0.0.1:{first.port}")
        assert (await exchange(await tcp(first), get("/healthz"))).status == 200


async def test_without_prometheus_client_it_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    async with Node(name="n") as node:
        with pytest.raises(ConfigurationError, match=r"pip install 'meshbus\[metrics\]'"):
            await serve_metrics(node, "127.0.0.1:0")
