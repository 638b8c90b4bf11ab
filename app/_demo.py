"""The main demo (``meshbus demo``): everything that works so far, on embedded defaults.

It grows with every capability; each section prints what it shows.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections import Counter
from typing import Any

import anyio
import attrs

from meshbus import (
    DEFAULT_PLUGINS,
    AccessDeniedError,
    AclProfile,
    AuthenticationError,
    ClientProfile,
    Node,
)
from meshbus.app._demo_mqtt import mqtt_demo
from meshbus.app._demo_operate import operate_demo


def _say(title: str) -> None:
    print(f"\n== {title}")


async def demo() -> None:
    async with Node(name="demo", seed=1) as node:
        print(f"node {node.name!r} running with plugins: {', '.join(node.plugins.names())}")

        _say("Direct messaging with wildcards (SPEC 1, 2)")
        async with (
            node.connect(client_name="dashboard") as dashboard,
            # timestamps=True: the node stamps what it publishes (off by default: cheaper)
            node.connect(client_name="sensor", timestamps=True) as sensor,
        ):
            dashboard.subscribe("building/*/temperature")
            dashboard.subscribe("building/lobby/>")
            dashboard.subscribe("alarm*/>")
            for topic, value in [
                ("building/lobby/temperature", b"21.5"),  # matches two filters: delivered once
                ("building/roof/temperature", b"14.0"),
                ("building/lobby/door/state", b"open"),
                ("alarms/fire/floor2", b"test"),
                ("building/roof/humidity", b"0.61"),  # matches nothing
            ]:
                sensor.publish(topic, value)
            stamps = []
            while (msg := dashboard.receive_nowait()) is not None:
                print(f"  dashboard got {msg.topic} = {msg.payload.decode()}")
                stamps.append(msg.timestamp)
            fresh = all(t is not None and node.clock.time() - t < 60 for t in stamps)
            print(f"  each stamped with the node's clock at publish (timestamps=True): {fresh}")
            print(f"  dashboard statistics: {dashboard.statistics()}")

        _say("Inline callback handler and no-local (SPEC 2)")
        seen: list[str] = []
        async with (
            node.connect(
                client_name="echo", no_local=True, on_message=lambda m: seen.append(m.topic)
            ) as echo,
            node.connect(client_name="other") as other,
        ):
            echo.subscribe("chat/>")
            echo.publish("chat/room1", b"my own message")  # not delivered back: no-local
            other.publish("chat/room1", b"someone else's")
            print(f"  no-local session saw: {seen}")

        _say("Slow consumer: oldest dropped, next delivery flagged (SPEC 2)")
        node.vpn().add_client_profile(ClientProfile("small", egress_max_messages=3))
        node.vpn().add_user("slow", client_profile="small")
        async with (
            node.connect(username="slow", client_name="slow") as slow,
            node.connect() as fast_publisher,
        ):
            slow.subscribe("ticks")
            for i in range(5):
                fast_publisher.publish("ticks", str(i))
            while (msg := slow.receive_nowait()) is not None:
                print(
                    f"  slow got tick {msg.payload.decode()} "
                    f"discard_indication={msg.discard_indication}"
                )
            print(f"  discarded: {slow.statistics().discarded}")

        _say("Message VPNs, basic authentication and ACLs (SPEC 6, 2)")
        tenant = node.create_vpn("tenant-a", authentication="basic")
        tenant.add_acl_profile(
            AclProfile(
                "readonly",
                publish_default="deny",
                subscribe_default="deny",
                subscribe_exceptions=["public/>"],
            )
        )
        tenant.add_user("viewer", password="s3cret", acl_profile="readonly")
        try:
            await node.login("tenant-a", username="viewer", password="wrong")
        except AuthenticationError as exc:
            print(f"  refused: {exc}")
        async with await node.login("tenant-a", username="viewer", password="s3cret") as viewer:
            viewer.subscribe("public/news")
            try:
                viewer.subscribe("private/>")
            except AccessDeniedError as exc:
                print(f"  denied: {exc}")
            try:
                viewer.publish("public/news", b"x")
            except AccessDeniedError as exc:
                print(f"  denied: {exc}")
            async with node.connect() as default_vpn_client:
                default_vpn_client.publish("public/news", b"stays in VPN 'default'")
            print(f"  viewer in tenant-a received: {viewer.receive_nowait()}")

        _say("Subscription manager (SPEC 2)")
        node.vpn().add_user("manager", subscription_manager=True)
        async with (
            node.connect(username="manager") as manager,
            node.connect(client_name="worker") as worker,
        ):
            manager.subscribe_for("worker", "jobs/>")
            manager.publish("jobs/42", b"do it")
            print(f"  worker subscriptions (added by manager): {worker.subscriptions}")
            print(f"  worker got: {(await worker.receive()).topic}")

        _say("Shared subscriptions: one member of the group per message (SPEC 3)")
        handled: Counter[str] = Counter()
        for name in ("worker-a", "worker-b", "worker-c"):
            node.connect(
                client_name=name, on_message=lambda m, name=name: handled.update([name])
            ).subscribe("#share/resizers/images/>")
        async with node.connect() as uploader:
            for i in range(600):
                uploader.publish(f"images/{i}.jpg", b"...")
        print(f"  600 jobs over 3 workers: {dict(sorted(handled.items()))}")

        _say("Eliding: latest value per topic, at most once per delay (SPEC 5)")
        node.vpn().add_client_profile(
            ClientProfile("screen", eliding_enabled=True, eliding_delay_ms=50)
        )
        node.vpn().add_user("screen", client_profile="screen")
        shown: list[str] = []
        node.connect(
            username="screen", on_message=lambda m: shown.append(m.payload.decode())
        ).subscribe("gauges/>")
        async with node.connect() as gauge:
            for i in range(1, 121):  # 120 updates, 1 ms apart
                gauge.publish("gauges/pressure", str(i), eliding_eligible=True)
                await anyio.sleep(0.001)
            await anyio.sleep(0.1)  # the last update arrives within one delay
        print(f"  120 updates in ~120 ms, the screen showed {len(shown)}: {shown}")
        print(f"  the last update arrived: {shown[-1] == '120'}")

        _say("Node statistics")
        print(f"  {node.statistics()}")


async def guaranteed_demo() -> None:
    _say("Guaranteed messaging: a durable queue across a restart, TTL and a DMQ (SPEC 4)")
    with tempfile.TemporaryDirectory() as data_dir:
        async with Node(name="demo", data_dir=data_dir) as node:
            node.guaranteed.create_queue("orders", subscriptions=["orders/>"], max_messages=3)
            shop = node.connect()
            results = await shop.send_many([(f"orders/{i}", f"order {i}") for i in range(1, 5)])
            outcome = [type(r).__name__ if r else "ok" for r in results]
            print(f"  4 orders sent in one commit: {outcome}")
            worker = node.connect()
            async with await worker.bind("orders", window=1) as flow:
                first = await flow.receive()
                flow.ack(first)
                held = await flow.receive()
                print(f"  worker acked {first.payload.decode()!r}, holds {held.payload.decode()!r}")
        print("  -- node stopped; starting again on the same data directory")
        async with Node(name="demo", data_dir=data_dir) as node:
            node.guaranteed.create_queue("orders", subscriptions=["orders/>"], max_messages=3)
            async with await node.connect().bind("orders") as flow:
                for _ in range(2):
                    message = await flow.receive()
                    flow.ack(message)
                    print(
                        f"  recovered {message.payload.decode()!r} "
                        f"redelivered={message.redelivered}"
                    )
            # TTL with nobody consuming: the sweep moves the message to the dead
            # message queue, in one store commit.
            node.guaranteed.create_queue("quotes-dmq")
            node.guaranteed.create_queue(
                "quotes",
                subscriptions=["quotes/>"],
                respect_ttl=True,
                dead_message_queue="quotes-dmq",
            )
            started = anyio.current_time()
            await node.connect().send("quotes/ACME", "ACME 101.5", ttl=0.05)
            async with await node.connect().bind("quotes-dmq") as dead:
                with anyio.fail_after(5):
                    expired = await dead.receive()
                dead.ack(expired)
            print(
                f"  {expired.payload.decode()!r} (TTL 50 ms, no consumer) reached 'quotes-dmq'"
                f" after {anyio.current_time() - started:.1f} s, moved by the TTL sweep"
            )


async def remote_demo() -> None:
    # Imported here, like the CLI does: the in-process sections need no transports.
    from meshbus.transports import ListenerSettings, TlsSettings, connect, start_server
    from meshbus.transports.certs import (
        make_ca,
        make_client_certificate,
        make_server_certificate,
    )

    _say("Remote sessions: TCP, and TLS with client certificates and compression (SPEC 6, 10)")
    if importlib.util.find_spec("cryptography") is None:  # it makes the demo's certificates
        print("  skipped: pip install 'meshbus[certs]' to see it")
        return
    with tempfile.TemporaryDirectory() as certs:
        make_ca(certs)
        server_cert = make_server_certificate(certs)
        sensor_cert = make_client_certificate(certs, "sensor")
        ops_cert = make_client_certificate(certs, "ops")
        async with Node(name="edge") as node:
            plant = node.create_vpn("plant", authentication="client-certificate")
            plant.add_user("sensor")
            plant.add_user("ops", management=True)  # may read every listener's statistics
            node.guaranteed.create_queue("alarms", vpn="plant", subscriptions=["alarms/>"])
            tcp = await start_server(node, ListenerSettings(port=0))
            tls = await start_server(
                node,
                ListenerSettings(
                    port=0,
                    tls=TlsSettings(
                        ca=f"{certs}/ca.pem",
                        certificate=server_cert.certificate,
                        private_key=server_cert.private_key,
                        require_client_certificate=True,
                    ),
                ),
            )
            print("  node 'edge' listening on tcp://127.0.0.1:<port> and tls://127.0.0.1:<port>")
            try:
                async with connect(tcp.url, vpn="plant", username="sensor"):
                    pass
            except AuthenticationError as exc:
                print(f"  over plain TCP: {exc}")

            def client_tls(cert: object) -> TlsSettings:
                return TlsSettings(
                    ca=f"{certs}/ca.pem",
                    certificate=cert.certificate,  # type: ignore[attr-defined]
                    private_key=cert.private_key,  # type: ignore[attr-defined]
                )

            async with (
                connect(tls.url, vpn="plant", tls=client_tls(ops_cert), compression=True) as ops,
                connect(tls.url, vpn="plant", tls=client_tls(sensor_cert)) as sensor,
            ):
                print(
                    f"  ops logged in by certificate as {ops.client_name!r}, "
                    f"compression={ops.welcome['compression']}"
                )
                ops.subscribe("plant/>")
                await ops.confirm()
                sensor.publish("plant/boiler/pressure", b"2.4 bar")
                message = await ops.receive()
                print(
                    f"  ops got {message.topic} = {message.payload.decode()} "
                    f"from {message.sender!r}"
                )
                await sensor.send("alarms/boiler", b"pressure high")
                async with await ops.bind("alarms") as flow:
                    alarm = await flow.receive()
                    flow.ack(alarm)
                    print(f"  ops acked guaranteed {alarm.topic} = {alarm.payload.decode()!r}")
                stats = await ops.node_statistics()
                listener = stats["listeners"][tls.url]
                print(
                    f"  TLS listener: {listener['logins']} logins; "
                    f"TCP listener refused {stats['listeners'][tcp.url]['refused']}"
                )


async def mesh_demo() -> None:
    from meshbus import LinkState
    from meshbus.transports import (
        ConnectSettings,
        ListenerSettings,
        MemoryNetwork,
        open_link,
        start_server,
    )

    _say("Links between nodes: a message keeps what it is across nodes (SPEC 7-10)")
    async with (
        Node(name="plant", node_id="plant") as plant,
        Node(name="cloud", node_id="cloud") as cloud,
    ):
        vpn = plant.vpn()
        vpn.add_client_profile(
            attrs.evolve(vpn.client_profiles["default"], allow_bridge_connections=True)
        )
        plant.guaranteed.create_queue("to-cloud", subscriptions=["orders/>"])
        cloud.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        server = await start_server(plant, ListenerSettings(port=0))
        link = open_link(
            cloud.vpn(),
            "to-plant",
            ConnectSettings(server.url),
            wants=["telemetry/>"],
            pulls=["to-cloud"],
        )
        with anyio.fail_after(10):
            await link.wait_for(LinkState.IN_SYNC)
        print(f"  cloud linked to plant over TCP: {link.state.value}, peer node {link.peer_node!r}")
        dashboard = cloud.connect(client_name="dashboard")
        dashboard.subscribe("telemetry/>")
        plant.connect(client_name="meter-7").publish(
            "telemetry/meter/7", b"42 kWh", headers={"unit": "kWh"}
        )
        await plant.connect(client_name="shop").send("orders/1", b"2 chairs")
        with anyio.fail_after(10):
            reading = await dashboard.receive()
            flow = await cloud.connect(client_name="warehouse").bind("orders")
            order = await flow.receive()
        flow.ack(order)
        origin = reading.origin[0] if reading.origin else None
        print(
            f"  cloud dashboard got {reading.topic} = {reading.payload.decode()}"
            f" from {reading.sender!r} on node {origin!r}, headers {reading.headers}"
        )
        service: Any = plant.guaranteed  # the guaranteed plugin's service
        left = service.queue("to-cloud").usage()[0]
        print(f"  cloud spooled order {order.payload.decode()!r}; plant's queue now holds {left}")
        print(f"  link statistics: {link.statistics()}")

    _say("A small mesh: three nodes linked in a triangle, each publish delivered once")
    network = MemoryNetwork()
    async with (
        Node(name="a", node_id="a") as a,
        Node(name="b", node_id="b") as b,
        Node(name="c", node_id="c") as c,
    ):
        nodes = (a, b, c)
        for node in nodes:
            vpn = node.vpn()
            vpn.add_client_profile(
                attrs.evolve(vpn.client_profiles["default"], allow_bridge_connections=True)
            )
            await start_server(node, ListenerSettings(), listener=network.listen(node.name))
        links = [
            open_link(
                source.vpn(),
                f"to-{target.name}",
                ConnectSettings(network.connectable(target.name, source=source.name)),
                wants=["news/>"],
            )
            for source in nodes
            for target in nodes
            if source is not target
        ]
        with anyio.fail_after(10):
            for each in links:
                await each.wait_for(LinkState.IN_SYNC)
        readers = [node.connect(client_name=f"reader-{node.name}") for node in nodes]
        for reader in readers:
            reader.subscribe("news/>")
        a.connect(client_name="editor").publish("news/today", b"links are up")
        with anyio.fail_after(10):
            for reader in readers:
                await reader.receive()
        await anyio.sleep(0.05)  # time for any copy a loop would bring
        counts = {r.client_name: 1 + len(list(iter(r.receive_nowait, None))) for r in readers}
        dropped: Counter[str] = Counter()
        for node in nodes:
            for joined in node.vpn().links:
                dropped.update(joined.statistics().dropped)
        print(f"  6 links in sync; copies each reader got: {counts}")
        print(
            "  copies a loop would have brought, dropped at their second hop: "
            f"{dropped['hop_limit']}, by origin: {dropped['duplicate']}"
        )


async def bridge_demo() -> None:
    from meshbus import LinkState
    from meshbus.plugins.bridge import BridgeSettings, TopicMapping, open_bridge
    from meshbus.transports import ListenerSettings, MemoryNetwork, start_server

    _say("Bridges: two VPNs of one node, topics mapped on the way (SPEC 7, 9)")

    async with Node(name="site", node_id="site-7") as site:
        office = site.create_vpn("office")
        office.add_client_profile(ClientProfile("default", allow_bridge_connections=True))
        bridge = open_bridge(
            site.vpn(),
            BridgeSettings(
                "to-office",
                remote_vpn="office",
                subscriptions=["orders/>"],  # office -> site, topics kept
                topics=[
                    TopicMapping("machines/*/alarm", mode="PUB", destination="${site}/alarms/{2}")
                ],
                variables={"site": "site-7"},
            ),
        )
        clerk = office.open_session(client_name="clerk")
        clerk.subscribe("site-7/>")
        operator = site.vpn().open_session(client_name="operator")
        operator.subscribe("orders/>")
        site.vpn().open_session(client_name="press-3").publish(
            "machines/press-3/alarm", b"overheated"
        )
        office.open_session(client_name="erp").publish("orders/17", b"400 parts")
        with anyio.fail_after(10):  # a same-node bridge delivers at once; this never waits
            alarm, order = await clerk.receive(), await operator.receive()
        print(f"  bridge {bridge.settings.name!r} (site -> office) {bridge.state.value}")
        print(
            f"  office clerk got {alarm.topic} = {alarm.payload.decode()} from {alarm.sender!r}"
            f" (published as machines/press-3/alarm; hop count {alarm.hop_count})"
        )
        print(
            f"  site operator got {order.topic} = {order.payload.decode()}"
            f" from {order.sender!r} (hop count {order.hop_count})"
        )

    _say("Bridges between two nodes: one on each, one connection, a queue drained across")
    network = MemoryNetwork()
    async with (
        Node(name="plant", node_id="plant") as plant,
        Node(name="hq", node_id="hq") as hq,
    ):
        for node in (plant, hq):
            vpn = node.vpn()
            vpn.add_client_profile(
                attrs.evolve(vpn.client_profiles["default"], allow_bridge_connections=True)
            )
            await start_server(node, ListenerSettings(), listener=network.listen(node.name))
        hq.guaranteed.create_queue("to-plant", subscriptions=["work-orders/>"])
        plant.guaranteed.create_queue("work", subscriptions=["work-orders/>"])
        await hq.connect(client_name="planner").send("work-orders/88", b"repaint line 2")
        pair = {
            node.name: open_bridge(
                node.vpn(),
                BridgeSettings(
                    "plant-hq",
                    remotes=[network.connectable(peer, source=node.name)],
                    subscriptions=[wanted],
                    queues=["to-plant"] if node is plant else [],
                ),
            )
            for node, peer, wanted in ((plant, "hq", "commands/>"), (hq, "plant", "alarms/>"))
        }
        with anyio.fail_after(10):
            while {b.state for b in pair.values()} != {LinkState.IN_SYNC, LinkState.REUSING}:
                await anyio.sleep(0.01)
        states = ", ".join(f"{name} {b.state.value}" for name, b in pair.items())
        print(
            f"  bridge 'plant-hq' on both nodes: {states}; "
            f"{network.connections('plant', 'hq')} connection between them"
        )
        board = hq.connect(client_name="board")
        board.subscribe("alarms/>")
        robot = plant.connect(client_name="robot")
        robot.subscribe("commands/>")
        plant.connect(client_name="press-3").publish("alarms/press-3", b"jammed")
        hq.connect(client_name="ops").publish("commands/press-3", b"stop")
        with anyio.fail_after(10):
            alarm, command = await board.receive(), await robot.receive()
            flow = await plant.connect(client_name="crew").bind("work")
            work = await flow.receive()
        flow.ack(work)
        print(
            f"  hq board got {alarm.topic} = {alarm.payload.decode()}; plant robot got "
            f"{command.topic} = {command.payload.decode()}"
        )
        hq_service: Any = hq.guaranteed  # the guaranteed plugin's service
        print(
            f"  plant crew got {work.topic} = {work.payload.decode()!r} from hq's queue "
            f"(hop count {work.hop_count}); hq's queue holds "
            f"{hq_service.queue('to-plant').usage()[0]}"
        )


async def routing_demo() -> None:
    from meshbus.plugins.dmr import DmrSettings, Peer, start_dmr
    from meshbus.transports import MemoryNetwork, start_server

    _say("Dynamic routing: two clusters, refcounted interest, one copy per link (SPEC 8)")
    network = MemoryNetwork()
    clusters = {"eu-1": "eu", "eu-2": "eu", "us-1": "us"}
    nodes = {name: Node(name=name, cluster=cluster) for name, cluster in clusters.items()}
    peers: dict[str, list[tuple[str, str | None]]] = {  # eu-2, us-1: the gateways
        "eu-1": [("eu-2", None)],
        "eu-2": [("eu-1", None), ("us-1", "us")],
        "us-1": [("eu-2", "eu")],
    }
    async with nodes["eu-1"], nodes["eu-2"], nodes["us-1"]:
        for node in nodes.values():
            vpn = node.vpn()
            vpn.add_client_profile(
                attrs.evolve(vpn.client_profiles["default"], allow_bridge_connections=True)
            )
            await start_server(node, listener=network.listen(node.name))
        routers = {}
        for name, node in nodes.items():
            settings = DmrSettings(
                [
                    Peer(peer, network.connectable(peer, source=name), cluster=cluster)
                    for peer, cluster in peers[name]
                ]
            )
            routers[name] = await start_dmr(node, settings, wait=False)
        with anyio.fail_after(10):
            for router in routers.values():
                await router.wait_in_sync()
        gateway = routers["us-1"].neighbour("eu-2")
        before = gateway.adverts_in
        desks = [nodes["eu-1"].connect(client_name=f"desk-{i}") for i in range(3)]
        for desk in desks:
            desk.subscribe("fx/eur-usd")
        with anyio.fail_after(10):
            while "fx/eur-usd" not in gateway.learned["d"]:
                await anyio.sleep(0.005)
        print(
            f"3 desks on eu-1 subscribe fx/eur-usd: us-1 hears of it from eu-2 "
            f"in {gateway.adverts_in - before} advertisement"
        )
        nodes["us-1"].connect(client_name="feed").publish("fx/eur-usd", b"1.0842")
        with anyio.fail_after(10):
            got = [await desk.receive() for desk in desks]
        copies = [
            routers[a].neighbour(b).out.statistics().forwarded  # type: ignore[union-attr]
            for a, b in (("us-1", "eu-2"), ("eu-2", "eu-1"))
        ]
        print(
            f"a price published on us-1 reaches {len(got)} desks: "
            f"{copies[0]} copy us-1 -> eu-2, {copies[1]} copy eu-2 -> eu-1"
        )
        pricer = nodes["us-1"].connect(client_name="pricer")
        pricer.subscribe("quote/request")
        trader = nodes["eu-1"].connect(client_name="trader")
        with anyio.fail_after(10):
            while "quote/request" not in routers["eu-1"].neighbour("eu-2").learned["fd"]:
                await anyio.sleep(0.005)
            trader.subscribe("inbox/trader")
            trader.publish("quote/request", b"EUR 1m", reply_to="inbox/trader")
            request = await pricer.receive()
            pricer.publish(request.reply_to or "", b"1.0843")
            reply = await trader.receive()
        print(f"a request from eu-1 answered on us-1: reply {reply.payload.decode()} routed back")
        print(f"eu-1 is {routers['eu-1'].state}")


async def spark_demo() -> None:
    _say("Spark: the bus feeds a streaming query, Spark writes back to the bus (SPEC 11)")
    try:
        from meshbus.contrib.spark import SparkBridge, local_spark_session
    except ImportError:
        print("  skipped: pip install 'meshbus[spark]' to see it")
        return
    if shutil.which("java") is None:
        print("  skipped: Spark needs Java 17 (java was not found)")
        return
    import pyarrow.parquet as pq

    bridge = SparkBridge(subscribe=["meters/>"], partitions=2, listen="127.0.0.1:0")
    with tempfile.TemporaryDirectory() as work:
        async with Node(name="demo", plugins=[*DEFAULT_PLUGINS, bridge]) as node:
            app = node.connect(client_name="meters")
            app.subscribe("totals/>")
            for i in range(900):
                app.publish(f"meters/{('north', 'south', 'east')[i % 3]}", str(i % 10))
            print("  900 meter readings published; the bridge numbered them in 2 partitions")
            spark = await anyio.to_thread.run_sync(local_spark_session)

            def pipeline() -> list[int]:
                query = bridge.sink_to(
                    spark,
                    subscribe="meters/>",
                    path=f"{work}/readings",
                    checkpoint=f"{work}/checkpoint",
                    available_now=True,
                    partitions=2,
                )
                query.awaitTermination()
                readings = spark.read.parquet(f"{work}/readings")
                totals = readings.groupBy("topic").agg({"*": "count"})
                bridge.write(
                    totals.selectExpr(
                        "concat('totals/', topic) as topic", "cast(`count(1)` as string) as value"
                    )
                )
                offsets: list[int] = pq.read_table(f"{work}/readings").column("offset").to_pylist()
                return offsets

            rows = await anyio.to_thread.run_sync(pipeline)
            print(f"  Spark wrote {len(rows)} rows to Parquet, offsets {min(rows)}..{max(rows)}")
            readers = [n for n, r in bridge.statistics()["served"].items() if r and "-reader-" in n]
            print(
                f"  {len(readers)} Spark worker process(es) logged in to the node as clients "
                "and fetched the rows themselves"
            )
            with anyio.fail_after(10):
                totals = sorted([await app.receive() for _ in range(3)], key=lambda m: m.topic)
            for message in totals:
                print(f"  Spark published {message.topic} = {message.payload.decode()}")
            await anyio.to_thread.run_sync(spark.stop)


def main() -> None:
    anyio.run(demo)
    anyio.run(guaranteed_demo)
    anyio.run(remote_demo)
    anyio.run(mesh_demo)
    anyio.run(bridge_demo)
    anyio.run(routing_demo)
    anyio.run(mqtt_demo)
    anyio.run(operate_demo)
    anyio.run(spark_demo)
